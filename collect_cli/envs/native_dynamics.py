"""Batched torch dynamics of gymnasium's five classic-control envs.

Each class re-implements one env's physics over a ``[state, lanes]`` tensor
(one contiguous row per state variable, the fast layout for per-variable ops):
:meth:`Dynamics.initial` maps uniform draws to initial states (gymnasium's
reset distribution), :meth:`Dynamics.step` advances every lane by one step and
returns the rewards and termination flags, :meth:`Dynamics.observe` builds the
observations. No method mutates its inputs, and nothing here draws random
numbers or knows about time limits: :mod:`collect_cli.envs.native` does that.

Precision. Each env keeps its state in the dtype gymnasium keeps it in:
float64 for Pendulum, CartPole, MountainCar and Acrobot (whose reset state is
drawn in float64 and rounded to float32, as gymnasium does), float32 for
MountainCarContinuous (gymnasium's state after a step; its first step from the
float64 reset state is done in float32 here). Observations and rewards are
returned as float32. The formulas follow gymnasium's operation order, so on
CPU a step reproduces gymnasium's state bit for bit (measured; torch's and
numpy's sin/cos may differ by an ulp elsewhere), except Pendulum's reward (the
angle is wrapped with floor rather than %: 1 float64 ulp) and
MountainCarContinuous (cos in float32 where gymnasium uses float64: ~1e-7).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces

Tensor = torch.Tensor
PI = math.pi


def angle_normalize(x: Tensor) -> Tensor:
    """``x`` wrapped into [-pi, pi) (gymnasium's ``((x + pi) % (2 * pi)) - pi``, to 1 ulp)."""
    return x - torch.floor((x + PI) * (0.5 / PI)) * (2 * PI)


def columns(*rows: Tensor) -> Tensor:
    """Per-lane rows as the float32 ``[lanes, len(rows)]`` observation array."""
    first = rows[0]
    out = torch.empty((first.shape[0], len(rows)), dtype=torch.float32, device=first.device)
    for i, row in enumerate(rows):  # cheaper than stack(dim=1) + cast on CPU
        out[:, i] = row
    return out


class Dynamics:
    """One env's batched physics on ``device``; subclasses fill in the constants."""

    env_id: ClassVar[str]
    max_episode_steps: ClassVar[int]
    # gymnasium.make keyword arguments this env takes: name -> (kind, default)
    options: ClassVar[dict[str, tuple[type, Any]]] = {}
    init_size: ClassVar[int]  # uniform draws per lane for one initial state
    dtype: ClassVar[torch.dtype] = torch.float64  # of the state, as gymnasium's
    discrete: ClassVar[int] = 0  # number of discrete actions (0: a Box action)

    def __init__(self, device: torch.device, **params: Any):
        self.device = device
        for name, (_, default) in self.options.items():
            setattr(self, name, params.get(name, default))

    def spaces(self) -> tuple[spaces.Space, spaces.Space]:
        """gymnasium's observation and action spaces of this env."""
        raise NotImplementedError

    def initial(self, u: Tensor) -> Tensor:
        """Initial states ``[state, lanes]`` from uniform draws ``u`` ``[init_size, lanes]``."""
        raise NotImplementedError

    def step(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(next_state, reward, terminated)`` of every lane."""
        raise NotImplementedError

    def observe(self, state: Tensor) -> Tensor:
        """The float32 observations ``[lanes, obs]`` of ``state``."""
        return columns(*state)

    def _const(self, values: list[float]) -> Tensor:
        return torch.tensor(values, dtype=self.dtype, device=self.device)


class Pendulum(Dynamics):
    """Pendulum-v1: state ``(theta, theta_dot)``, torque in [-2, 2], never terminates."""

    env_id = "Pendulum-v1"
    max_episode_steps = 200
    options: ClassVar[dict[str, tuple[type, Any]]] = {"g": (float, 10.0)}
    init_size = 2
    max_speed = 8.0
    max_torque = 2.0
    dt = 0.05
    m = 1.0
    l = 1.0  # noqa: E741 (gymnasium's name)

    def __init__(self, device: torch.device, **params: Any):
        super().__init__(device, **params)
        self._init_high = self._const([[PI], [1.0]])
        self._gravity_term = 3 * self.g / (2 * self.l)
        self._torque_term = 3.0 / (self.m * self.l**2)

    def spaces(self):
        high = np.array([1.0, 1.0, self.max_speed], dtype=np.float32)
        observation = spaces.Box(low=-high, high=high, dtype=np.float32)
        action = spaces.Box(-self.max_torque, self.max_torque, shape=(1,), dtype=np.float32)
        return observation, action

    def initial(self, u):
        # uniform in [-high, high): theta in [-pi, pi), theta_dot in [-1, 1)
        return (u * 2.0 - 1.0) * self._init_high

    def step(self, state, action):
        th, thdot = state
        u = action[:, 0].clamp(-self.max_torque, self.max_torque)
        costs = angle_normalize(th).square() + 0.1 * thdot.square() + 0.001 * u.square()
        accel = self._gravity_term * torch.sin(th) + self._torque_term * u
        newthdot = (thdot + accel * self.dt).clamp(-self.max_speed, self.max_speed)
        newth = th + newthdot * self.dt
        terminated = torch.zeros(state.shape[1], dtype=torch.bool, device=state.device)
        return torch.stack((newth, newthdot)), costs.neg_(), terminated

    def observe(self, state):
        th, thdot = state
        return columns(torch.cos(th), torch.sin(th), thdot)


class CartPole(Dynamics):
    """CartPole-v1: state ``(x, x_dot, theta, theta_dot)``, push left (0) or right (1)."""

    env_id = "CartPole-v1"
    max_episode_steps = 500
    options: ClassVar[dict[str, tuple[type, Any]]] = {"sutton_barto_reward": (bool, False)}
    init_size = 4
    discrete = 2
    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02  # explicit Euler, gymnasium's default kinematics_integrator
    theta_threshold_radians = 12 * 2 * PI / 360
    x_threshold = 2.4

    def __init__(self, device: torch.device, **params: Any):
        super().__init__(device, **params)
        self._force = self._const([-self.force_mag, self.force_mag])

    def spaces(self):
        high = np.array(
            [self.x_threshold * 2, np.inf, self.theta_threshold_radians * 2, np.inf],
            dtype=np.float32,
        )
        return spaces.Box(-high, high, dtype=np.float32), spaces.Discrete(2)

    def initial(self, u):
        return u * 0.1 - 0.05  # uniform in [-0.05, 0.05)

    def step(self, state, action):
        x, x_dot, theta, theta_dot = state
        force = self._force[action]  # action 1 pushes right, 0 left
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = (force + self.polemass_length * theta_dot.square() * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta.square() / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        terminated = (x.abs() > self.x_threshold) | (theta.abs() > self.theta_threshold_radians)
        # sutton_barto_reward: 0 while alive, -1 on failure; else 1 every step
        reward = -terminated.to(x.dtype) if self.sutton_barto_reward else torch.ones_like(x)
        return torch.stack((x, x_dot, theta, theta_dot)), reward, terminated


class _MountainCarBase(Dynamics):
    """The track shared by both MountainCar envs: state ``(position, velocity)``."""

    init_size = 1
    options: ClassVar[dict[str, tuple[type, Any]]] = {"goal_velocity": (float, 0.0)}
    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position: ClassVar[float]

    def _spaces(self) -> spaces.Box:
        low = np.array([self.min_position, -self.max_speed], dtype=np.float32)
        high = np.array([self.max_position, self.max_speed], dtype=np.float32)
        return spaces.Box(low, high, dtype=np.float32)

    def initial(self, u):
        # position uniform in [-0.6, -0.4), velocity 0
        position = u[0] * 0.2 - 0.6
        return torch.stack((position, torch.zeros_like(position)))

    def _move(self, position: Tensor, velocity: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        velocity = velocity.clamp(-self.max_speed, self.max_speed)
        position = (position + velocity).clamp(self.min_position, self.max_position)
        stuck = (position == self.min_position) & (velocity < 0)
        velocity = velocity.masked_fill(stuck, 0.0)
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        return torch.stack((position, velocity)), terminated, position


class MountainCar(_MountainCarBase):
    """MountainCar-v0: accelerate left (0), not at all (1) or right (2); reward -1 a step."""

    env_id = "MountainCar-v0"
    max_episode_steps = 200
    discrete = 3
    force = 0.001
    gravity = 0.0025
    goal_position = 0.5

    def __init__(self, device: torch.device, **params: Any):
        super().__init__(device, **params)
        self._push = self._const([-self.force, 0.0, self.force])  # (action - 1) * force

    def spaces(self):
        return self._spaces(), spaces.Discrete(3)

    def step(self, state, action):
        position, velocity = state
        velocity = velocity + (self._push[action] + torch.cos(3 * position) * (-self.gravity))
        state, terminated, _ = self._move(position, velocity)
        return state, torch.full_like(velocity, -1.0), terminated


class MountainCarContinuous(_MountainCarBase):
    """MountainCarContinuous-v0: force in [-1, 1]; reward 100 at the goal - 0.1 * action^2."""

    env_id = "MountainCarContinuous-v0"
    max_episode_steps = 999
    min_action = -1.0
    max_action = 1.0
    power = 0.0015
    goal_position = 0.45
    dtype = torch.float32

    def spaces(self):
        action = spaces.Box(self.min_action, self.max_action, shape=(1,), dtype=np.float32)
        return self._spaces(), action

    def step(self, state, action):
        position, velocity = state
        a = action[:, 0]
        force = a.clamp(self.min_action, self.max_action)
        velocity = velocity + force * self.power - 0.0025 * torch.cos(3 * position)
        state, terminated, _ = self._move(position, velocity)
        # gymnasium charges the unclipped action
        reward = terminated.to(a.dtype) * 100.0 - a.square() * 0.1
        return state, reward, terminated


class Acrobot(Dynamics):
    """Acrobot-v1 ("book" dynamics): state ``(theta1, theta2, dtheta1, dtheta2)``,
    torque -1 (0), 0 (1) or +1 (2) on the joint, one rk4 step of 0.2 s."""

    env_id = "Acrobot-v1"
    max_episode_steps = 500
    init_size = 4
    discrete = 3
    dt = 0.2
    link_length_1 = 1.0
    link_mass_1 = 1.0
    link_mass_2 = 1.0
    link_com_pos_1 = 0.5
    link_com_pos_2 = 0.5
    link_moi = 1.0
    max_vel_1 = 4 * PI
    max_vel_2 = 9 * PI
    g = 9.8

    def __init__(self, device: torch.device, **params: Any):
        super().__init__(device, **params)
        self._torque = self._const([-1.0, 0.0, 1.0])
        m1, m2, l1 = self.link_mass_1, self.link_mass_2, self.link_length_1
        lc1, lc2, i1, i2 = self.link_com_pos_1, self.link_com_pos_2, self.link_moi, self.link_moi
        # the constant parts of the equations of motion
        self._d1_const = m1 * lc1**2 + m2 * (l1**2 + lc2**2) + i1 + i2
        self._d1_cos = m2 * 2 * l1 * lc2
        self._d2_const = m2 * lc2**2 + i2
        self._d2_cos = m2 * l1 * lc2
        self._phi2 = m2 * lc2 * self.g
        self._phi1_sq = m2 * l1 * lc2
        self._phi1_cross = 2 * m2 * l1 * lc2
        self._phi1_grav = (m1 * lc1 + m2 * l1) * self.g
        self._dd2_sq = m2 * l1 * lc2
        self._dd2_den = m2 * lc2**2 + i2

    def spaces(self):
        high = np.array([1.0, 1.0, 1.0, 1.0, self.max_vel_1, self.max_vel_2], dtype=np.float32)
        return spaces.Box(low=-high, high=high, dtype=np.float32), spaces.Discrete(3)

    def initial(self, u):
        # uniform in [-0.1, 0.1), rounded to float32 like gymnasium's reset state
        return (u * 0.2 - 0.1).to(torch.float32).to(self.dtype)

    def _dsdt(self, s: Tensor, torque: Tensor) -> Tensor:
        theta1, theta2, dtheta1, dtheta2 = s
        cos2, sin2 = torch.cos(theta2), torch.sin(theta2)
        d1 = self._d1_const + self._d1_cos * cos2
        d2 = self._d2_const + self._d2_cos * cos2
        phi2 = self._phi2 * torch.cos(theta1 + theta2 - PI / 2.0)
        phi1 = (
            -self._phi1_sq * dtheta2.square() * sin2
            - self._phi1_cross * dtheta2 * dtheta1 * sin2
            + self._phi1_grav * torch.cos(theta1 - PI / 2)
            + phi2
        )
        ddtheta2 = (torque + d2 / d1 * phi1 - self._dd2_sq * dtheta1.square() * sin2 - phi2) / (
            self._dd2_den - d2.square() / d1
        )
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2))

    def step(self, state, action):
        torque = self._torque[action]
        dt, dt2 = self.dt, self.dt / 2.0
        k1 = self._dsdt(state, torque)
        k2 = self._dsdt(state + dt2 * k1, torque)
        k3 = self._dsdt(state + dt2 * k2, torque)
        k4 = self._dsdt(state + dt * k3, torque)
        ns = state + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        theta1, theta2, dtheta1, dtheta2 = ns
        theta1, theta2 = _wrap(theta1, -PI, PI), _wrap(theta2, -PI, PI)
        dtheta1 = dtheta1.clamp(-self.max_vel_1, self.max_vel_1)
        dtheta2 = dtheta2.clamp(-self.max_vel_2, self.max_vel_2)
        ns = torch.stack((theta1, theta2, dtheta1, dtheta2))
        terminated = -torch.cos(theta1) - torch.cos(theta2 + theta1) > 1.0
        reward = terminated.to(ns.dtype) - 1.0  # -1 a step, 0 on reaching the goal
        return ns, reward, terminated

    def observe(self, state):
        theta1, theta2, dtheta1, dtheta2 = state
        return columns(
            torch.cos(theta1),
            torch.sin(theta1),
            torch.cos(theta2),
            torch.sin(theta2),
            dtheta1,
            dtheta2,
        )


def _wrap(x: Tensor, low: float, high: float) -> Tensor:
    """gymnasium's ``wrap``: shift by whole periods into [low, high] (bounds kept)."""
    period = high - low
    down = torch.ceil((x - high) / period).clamp_(min=0)  # periods to subtract
    up = torch.ceil((low - x) / period).clamp_(min=0)  # periods to add
    return x + (up - down) * period


ENVS: dict[str, type[Dynamics]] = {
    cls.env_id: cls for cls in (Pendulum, CartPole, MountainCar, MountainCarContinuous, Acrobot)
}
