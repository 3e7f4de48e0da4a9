"""``RecordCallback``: record what a Stable-Baselines3 model's rollouts collect, as an
rlcollect dataset (a :class:`~collect_cli.record.Recorder` fed at every env step).

SB3 calls a callback's ``on_step`` right after ``env.step`` and before it moves its
``_last_obs`` to the new observation (on-policy and off-policy alike), so at that
moment ``model._last_obs`` is the observation the actions were taken in, and the
step's ``new_obs``, ``rewards``, ``dones`` and ``infos`` are the callback's locals.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.errors import UsageError
from collect_cli.record.recorder import TERMINAL_OBSERVATION, Recorder

INSTALL = "pip install 'rlcollect[sb3]'"
try:
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
except ImportError:
    raise UsageError(f"RecordCallback needs Stable-Baselines3: {INSTALL}") from None

# what SB3's collect_rollouts holds when it calls on_step
STEP_LOCALS = ("new_obs", "rewards", "dones", "infos", "actions")
TRUNCATED = "TimeLimit.truncated"  # SB3's info: the episode was cut by a time limit
# the model attributes recorded as the training's config when none is given
HYPERPARAMETERS = (
    "learning_rate",
    "n_steps",
    "batch_size",
    "n_epochs",
    "gamma",
    "gae_lambda",
    "ent_coef",
    "vf_coef",
    "max_grad_norm",
    "clip_range",
    "buffer_size",
    "learning_starts",
    "tau",
    "train_freq",
    "gradient_steps",
    "target_update_interval",
    "exploration_fraction",
    "use_sde",
    "policy_kwargs",
)


def hyperparameters(model: Any) -> dict[str, Any]:
    """The model's main hyperparameters (those it has), plain values or their repr."""
    out: dict[str, Any] = {"algorithm": type(model).__name__}
    policy = getattr(model, "policy", None)
    if policy is not None:
        out["policy"] = type(policy).__name__
    for name in HYPERPARAMETERS:
        if hasattr(model, name):
            value = getattr(model, name)
            out[name] = value if isinstance(value, (bool, int, float, str)) else repr(value)
    out["n_envs"] = getattr(model, "n_envs", None)
    return out


def env_id_of(env: Any) -> str:
    """The gymnasium id of the first env of a VecEnv (``unknown`` where it has none)."""
    try:
        spec = env.get_attr("spec", indices=[0])[0]
    except Exception:
        spec = None
    return getattr(spec, "id", None) or "unknown"


class RecordCallback(BaseCallback):
    """Records every step of the training env into the dataset at ``path``.

    ``recorder_kwargs`` go to :class:`~collect_cli.record.Recorder` (``writer``,
    ``overwrite``, ``config``, ``steps_per_commit``...); the spaces, ``num_envs``,
    ``env_id``, ``algorithm``, ``seed``, ``config`` (the model's hyperparameters) and
    ``total_frames`` default to the model's. ``extras``: record an on-policy model's
    ``value`` and ``action_log_prob`` beside the action. One callback records one
    ``learn`` call: the dataset is closed (``complete``) when training ends.
    """

    def __init__(self, path: Any, *, extras: bool = True, verbose: int = 0, **recorder_kwargs):
        super().__init__(verbose)
        self.path = path
        self.extras = extras
        self.recorder_kwargs = recorder_kwargs
        self.recorder: Recorder | None = None
        self._policy_step: int | None = None
        self._vecnorm: Any = None
        self._raw_obs: Any = None  # with VecNormalize: the raw observation acted on

    def _on_training_start(self) -> None:
        if self.recorder is not None:
            raise UsageError(
                f"this RecordCallback has recorded a learn() call into {str(self.path)!r}: "
                "give each learn() a new RecordCallback (and path)"
            )
        env, model = self.training_env, self.model
        self._on_policy = isinstance(model, OnPolicyAlgorithm)
        self._vecnorm = model.get_vec_normalize_env()
        if self._vecnorm is not None:
            self._raw_obs = self._vecnorm.get_original_obs()
        total = self.locals.get("total_timesteps")
        kwargs = {
            "num_envs": env.num_envs,
            "env_id": env_id_of(env),
            "algorithm": type(model).__name__,
            "seed": model.seed,
            "config": hyperparameters(model),
            "total_frames": max(0, int(total) - model.num_timesteps) if total else None,
            **self.recorder_kwargs,
        }
        self.recorder = Recorder(self.path, env.observation_space, env.action_space, **kwargs)

    def _on_rollout_start(self) -> None:
        # the policy acting from here on: the env steps it was trained for
        self._policy_step = int(self.model.num_timesteps)

    def _on_step(self) -> bool:
        found = self.locals
        missing = [k for k in STEP_LOCALS if k not in found]
        if missing:
            raise UsageError(
                f"RecordCallback records the algorithms whose rollouts give callbacks each "
                f"env step (SB3's on-policy and off-policy ones): {type(self.model).__name__} "
                f"gives no {', '.join(missing)}"
            )
        dones = np.asarray(found["dones"], bool)
        infos = found["infos"]
        truncated = np.array([bool(i.get(TRUNCATED, False)) for i in infos], bool) & dones
        # what the env received: on-policy Box actions clipped to the bounds (or
        # unscaled from a squashed policy); off-policy, the unscaled action
        clipped = self._on_policy and "clipped_actions" in found
        actions = found["clipped_actions" if clipped else "actions"]
        vecnorm = self._vecnorm
        if vecnorm is None:
            obs, rewards, next_obs = self.model._last_obs, found["rewards"], found["new_obs"]
        else:  # the raw values, as the env gave them
            obs, rewards = self._raw_obs, vecnorm.get_original_reward()
            next_obs = vecnorm.get_original_obs()
            infos = [
                {TERMINAL_OBSERVATION: vecnorm.unnormalize_obs(info[TERMINAL_OBSERVATION])}
                if done and info.get(TERMINAL_OBSERVATION) is not None
                else {}
                for done, info in zip(dones, infos, strict=True)
            ]
        extras = None
        if self.extras and self._on_policy:  # what the rollout buffer keeps beside them
            named = {fmt.VALUE: "values", fmt.ACTION_LOG_PROB: "log_probs"}
            extras = {k: found[v].reshape(-1) for k, v in named.items() if v in found}
        self.recorder.step(
            obs,
            actions,
            rewards,
            next_obs,
            dones & ~truncated,
            truncated,
            infos,
            policy_step=self._policy_step,
            extras=extras,
        )
        if vecnorm is not None:
            self._raw_obs = next_obs
        return True

    def _on_training_end(self) -> None:
        if self.recorder is not None:
            self.recorder.close(fmt.COMPLETE)
