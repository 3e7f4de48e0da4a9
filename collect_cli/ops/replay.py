"""``validate --replay``: recorded transitions stepped again in the real env.

For each sampled valid frame, a fresh gymnasium env of the dataset's id and
kwargs is put into the recorded state, steps the recorded action, and its next
observation, reward and ``terminated`` are compared with the recorded ones. The
state is the one recorded (``record.state=true``: ``state/qpos`` and
``state/qvel`` set with MuJoCo's ``set_state``, ``state/values`` as
``unwrapped.state``), else rebuilt from the observation where it holds all of
it (:data:`REBUILD`: classic control; :data:`MUJOCO_REBUILD`: MuJoCo envs
observing ``qpos[1:]`` and ``qvel``, whose dynamics do not depend on the x
position they drop). The comparison tolerances are float32's, as the dataset
stores observations and rewards in float32. Time limits are not replayed (one
step of the unwrapped env): ``truncated`` is the run's own record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from collect_cli import dataformat as fmt
from collect_cli.dataset import open_dataset
from collect_cli.errors import UsageError

LARGE = 10_000  # transitions replayed by default: all of a smaller dataset, a sample of this many
SHOWN = 5  # (lane, step) listed per kind of mismatch
ATOL, RTOL = 1e-4, 1e-5  # float32 observations and rewards, recomputed in float64


def _angles(obs: np.ndarray) -> np.ndarray:
    """Pendulum's and Acrobot's angles, from their (cos, sin) pairs."""
    return np.arctan2(obs[1::2], obs[0::2])


REBUILD: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Pendulum-v1": lambda o: np.array([np.arctan2(o[1], o[0]), o[2]], np.float64),
    "CartPole-v1": lambda o: np.asarray(o, np.float64),
    "MountainCar-v0": lambda o: np.asarray(o, np.float64),
    "MountainCarContinuous-v0": lambda o: np.asarray(o, np.float64),
    "Acrobot-v1": lambda o: np.concatenate([_angles(o[:4]), o[4:]]).astype(np.float64),
}
# MuJoCo envs whose observation is qpos[1:] then qvel, unclipped (Hopper and Walker2d
# clip qvel in theirs; Ant, Humanoid add contact forces)
MUJOCO_REBUILD = ("HalfCheetah-v4", "HalfCheetah-v5")
KINDS = ("next_observation", "reward", "terminated")
Setter = Callable[[Any, dict[str, np.ndarray]], None]  # (env, a transition's state) -> None


def state_setter(env_id: str, keys: set[str]) -> tuple[Setter, list[str]]:
    """How to put the env into a transition's state, and the frame keys it reads:
    the recorded state where the dataset has one, else the observation rebuilt."""
    name = env_id.rpartition(":")[2]
    qpos, qvel = fmt.path((fmt.STATE, fmt.QPOS)), fmt.path((fmt.STATE, fmt.QVEL))
    values = fmt.path((fmt.STATE, fmt.STATE_VALUES))
    if qpos in keys and qvel in keys:
        return lambda env, s: env.set_state(s[qpos], s[qvel]), [qpos, qvel]
    if values in keys:
        return lambda env, s: setattr(env, "state", np.array(s[values])), [values]
    if name in REBUILD:
        return lambda env, s: setattr(env, "state", REBUILD[name](s[fmt.OBSERVATION])), []
    if name in MUJOCO_REBUILD:

        def from_obs(env: Any, s: dict[str, np.ndarray]) -> None:
            obs, nq = np.asarray(s[fmt.OBSERVATION], np.float64), env.model.nq
            env.set_state(np.concatenate([[0.0], obs[: nq - 1]]), obs[nq - 1 :])

        return from_obs, []
    raise UsageError(
        f"cannot replay {env_id}: its state is not in its observation; collect it with "
        f"record.state=true (or replay {', '.join((*REBUILD, *MUJOCO_REBUILD))})"
    )


@dataclass
class Replay:
    env_id: str
    replayed: int
    of: int  # valid frames in the dataset
    mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def found(self) -> int:
        return sum(len(v) for v in self.mismatches.values())


def replay(path, samples: int | None = None, seed: int = 0) -> Replay:
    """Replay ``samples`` valid transitions of the dataset at ``path`` (default: all
    of a dataset of at most ``LARGE`` frames, else ``LARGE`` of them, drawn with ``seed``)."""
    import gymnasium as gym

    ds = open_dataset(path)
    meta = ds.meta
    env_id = str(meta.get("env_id"))
    setter, state_keys = state_setter(env_id, {k for k, _, _ in ds.describe()})
    if (meta.get("postproc") or {}).get("name", "none") != "none":
        raise UsageError("cannot replay n-step transitions (postproc=multistep): 1-step only")
    config = yaml.safe_load(meta.get("config") or "") or {}
    kwargs = dict((config.get("env") or {}).get("kwargs") or {})
    kwargs.pop("max_episode_steps", None)  # a time limit is not replayed
    env = gym.make(env_id, **kwargs).unwrapped
    env.reset(seed=seed)  # seeds its generator (its state is set before each step)
    picks, total = _sample(ds, samples, seed)
    out = Replay(env_id, sum(len(t) for t in picks.values()), total)
    out.mismatches = {kind: [] for kind in KINDS}
    if meta.get("env_backend") == "envpool":
        out.notes.append("an envpool dataset, replayed against gymnasium's dynamics")
    keys = {
        "obs": fmt.OBSERVATION,
        "action": fmt.ACTION,
        "next_obs": fmt.path(fmt.next_key((fmt.OBSERVATION,))),
        "reward": fmt.path(fmt.REWARD_KEY),
        "terminated": fmt.path(fmt.TERMINATED_KEY),
        **{key: key for key in state_keys},
    }
    with ds.reader(by_lane=True) as read:
        for lane, times in picks.items():
            steps = int(times.max()) + 1
            rec = {k: np.asarray(read(key)[lane, :steps])[times] for k, key in keys.items()}
            states = [
                {fmt.OBSERVATION: rec["obs"][i], **{k: rec[k][i] for k in state_keys}}
                for i in range(len(times))
            ]
            got = _step_all(env, setter, states, _actions(env, rec["action"]))
            checks = {
                "next_observation": _close(got[0], rec["next_obs"]),
                "reward": _close(got[1], rec["reward"]),
                "terminated": got[2] == rec["terminated"].reshape(len(times)).astype(bool),
            }
            for kind, ok in checks.items():
                out.mismatches[kind] += [(lane, int(t)) for t in times[~ok]]
    env.close()
    return out


def _step_all(env: Any, setter: Setter, states: list, actions: list) -> tuple[np.ndarray, ...]:
    """Each transition stepped from its state: (next observations, rewards,
    terminated). The env is reset after a step that ended an episode (CartPole
    counts steps past its end), so each starts as from a fresh env."""
    nexts, rewards, ends = [], [], []
    ended = True  # whatever the env did before this call
    for state, action in zip(states, actions, strict=True):
        if ended:
            env.reset()
        setter(env, state)
        nxt, reward, ended, *_ = env.step(action)
        nexts.append(nxt)
        rewards.append(reward)
        ends.append(bool(ended))
    return np.asarray(nexts), np.asarray(rewards, np.float64), np.asarray(ends)


def _close(got: np.ndarray, recorded: np.ndarray) -> np.ndarray:
    """Per transition: every value within float32's tolerances."""
    got, recorded = got.reshape(len(got), -1), recorded.reshape(len(recorded), -1)
    return np.isclose(got, recorded.astype(np.float64), ATOL, RTOL).all(axis=1)


def _actions(env: Any, actions: np.ndarray) -> list:
    """The recorded actions as the env takes them."""
    from gymnasium import spaces

    space = env.action_space
    if isinstance(space, spaces.Discrete):
        return actions.reshape(len(actions)).astype(int).tolist()
    return list(np.asarray(actions, space.dtype).reshape(len(actions), *space.shape))


def _valid(ds) -> dict[int, np.ndarray]:
    """Each lane's valid committed steps."""
    ends = fmt.lane_steps(ds.meta)
    with ds.reader(by_lane=True) as read:
        mask = read(fmt.MASK)
        return {
            lane: np.flatnonzero(np.asarray(mask[lane, :end]).reshape(end))
            for lane, end in enumerate(ends.tolist())
            if end
        }


def _sample(ds, samples: int | None, seed: int) -> tuple[dict[int, np.ndarray], int]:
    """The (lane -> sorted steps) to replay, and how many valid frames there are."""
    valid = _valid(ds)
    total = sum(len(t) for t in valid.values())
    want = min(total, LARGE if samples is None else samples)
    if want >= total:
        return {lane: t for lane, t in valid.items() if len(t)}, total
    flat = np.sort(np.random.default_rng(seed).choice(total, want, replace=False))
    out, offset = {}, 0
    for lane, times in valid.items():
        inside = flat[(flat >= offset) & (flat < offset + len(times))] - offset
        if len(inside):
            out[lane] = times[inside]
        offset += len(times)
    return out, total
