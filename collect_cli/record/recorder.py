"""Record a training run: :class:`Recorder` takes a vector env's steps as a training
loop sees them and writes an rlcollect dataset through the ordinary writers.

Each ``step`` fills one time step of preallocated arrays (``buffer.StepBuffer``);
every ``steps_per_commit`` steps (or ``commit_interval`` seconds) they are appended
to the writer as one ``[num_envs, steps]`` batch and committed, so a kill loses at
most those steps (durability D4). The policy that acted is kept in the sources
table: a row per training step under which an episode started.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from collect_cli import dataformat as fmt
from collect_cli.errors import UsageError
from collect_cli.record.buffer import StepBuffer, extra_key, put, shape_text
from collect_cli.record.metadata import metadata as build_metadata
from collect_cli.record.metadata import training_config

SAME_STEP, NEXT_STEP = "same_step", "next_step"
# gymnasium's AutoresetMode values (vector envs' metadata["autoreset_mode"]) and ours;
# with autoreset disabled the loop resets ended envs itself: the next step starts anew
AUTORESET = {
    SAME_STEP: SAME_STEP,
    "SameStep": SAME_STEP,
    "Disabled": SAME_STEP,
    NEXT_STEP: NEXT_STEP,
    "NextStep": NEXT_STEP,
}
BUFFER_BYTES = 64 << 20  # the default steps_per_commit keeps the buffer under this
MAX_STEPS_PER_COMMIT = 256
# where vector envs put the final observations of the episodes that ended (the reset
# observation being in next_obs): gymnasium 1.x, gymnasium 0.29, SB3's VecEnv infos
FINAL_OBS = ("final_obs", "final_observation")
TERMINAL_OBSERVATION = "terminal_observation"


def to_numpy(value: Any) -> Any:
    """Torch tensors (on any device) as numpy arrays, inside dicts and tuples too."""
    if isinstance(value, dict):
        return {k: to_numpy(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(to_numpy(v) for v in value)
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    return value


def autoreset_mode(mode: Any) -> str:
    name = str(getattr(mode, "value", mode))
    if name not in AUTORESET:
        raise UsageError(
            f"autoreset={mode!r} is not valid: choose same_step or next_step (or a gymnasium "
            "AutoresetMode)"
        )
    return AUTORESET[name]


def final_observation(infos: Any, lane: int) -> Any:
    """The final observation ``infos`` hold for ``lane`` (None: they hold none):
    gymnasium's ``final_obs[lane]`` where ``_final_obs[lane]``, or SB3's
    ``infos[lane]["terminal_observation"]``."""
    if isinstance(infos, dict):
        for name in FINAL_OBS:
            if name in infos:
                flags = infos.get("_" + name)
                if flags is None or bool(np.asarray(flags)[lane]):
                    return infos[name][lane]
        return None
    if isinstance(infos, (list, tuple)) and lane < len(infos) and isinstance(infos[lane], dict):
        return infos[lane].get(TERMINAL_OBSERVATION)
    return None


STOPS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM wait until the block is done (a Ctrl-C never lands in the
    middle of an append or a commit), then act as they would have: the handlers the
    process had see them. Only the main thread can set handlers: elsewhere, nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {}
    for sig in STOPS:
        handler = signal.getsignal(sig)
        if handler is not None:  # None: set outside Python, it could not be put back
            previous[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in caught:
            signal.raise_signal(signum)


class Recorder:
    """Writes the steps of ``num_envs`` env copies into the dataset at ``path``.

    Use as ``with Recorder(...) as rec:`` (an exception inside closes the dataset as
    ``interrupted``, keeping its data), or call :meth:`close`. A recorder left open
    is closed as ``interrupted`` when the interpreter exits; a killed process
    leaves the dataset as of its last commit, ``status: running``.
    """

    def __init__(
        self,
        path: str | Path,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        *,
        num_envs: int,
        env_id: str,
        writer: str = "hdf5",
        overwrite: bool = False,
        config: dict | str | None = None,
        policy: str = "training",
        algorithm: str | None = None,
        seed: int | None = None,
        steps_per_commit: int | None = None,
        commit_interval: float = 10.0,
        autoreset: Any = SAME_STEP,
        total_frames: int | None = None,
        writer_options: dict[str, Any] | None = None,
    ):
        from collect_cli.dataset.backend import make_writer
        from collect_cli.dataset.ownership import claim

        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
            raise UsageError(f"num_envs must be a positive integer, got {num_envs!r}")
        if num_envs < 1:
            raise UsageError(f"num_envs must be a positive integer, got {num_envs}")
        if not isinstance(env_id, str) or not env_id:
            raise UsageError(f"env_id must name the env (e.g. 'CartPole-v1'), got {env_id!r}")
        for name, space in (
            ("observation_space", observation_space),
            ("action_space", action_space),
        ):
            if not isinstance(space, spaces.Space):
                raise UsageError(f"{name} must be a gymnasium space, got {type(space).__name__}")
        self.num_envs = int(num_envs)
        self.autoreset = autoreset_mode(autoreset)
        if steps_per_commit is None:
            frame = StepBuffer.frame_bytes(self.num_envs, observation_space, action_space)
            steps_per_commit = max(1, min(MAX_STEPS_PER_COMMIT, BUFFER_BYTES // max(1, frame)))
        elif isinstance(steps_per_commit, bool) or not isinstance(steps_per_commit, int):
            raise UsageError(
                f"steps_per_commit must be a positive integer, got {steps_per_commit!r}"
            )
        if steps_per_commit < 1:
            raise UsageError(f"steps_per_commit must be a positive integer, got {steps_per_commit}")
        if not isinstance(commit_interval, (int, float)) or not commit_interval > 0:
            raise UsageError(
                f"commit_interval must be a positive number of seconds, got {commit_interval!r}"
            )
        if total_frames is not None and (
            isinstance(total_frames, bool) or not isinstance(total_frames, int) or total_frames < 0
        ):
            raise UsageError(f"total_frames must be a count of frames, got {total_frames!r}")
        self.steps_per_commit, self.commit_interval = steps_per_commit, float(commit_interval)
        self.policy, self.algorithm = str(policy), algorithm
        self.seed = None if seed is None else int(seed)
        parsed, self._config_text = training_config(config)
        self._buffer = StepBuffer(self.num_envs, steps_per_commit, observation_space, action_space)
        self.path = Path(path)
        recorder_args = {
            "writer": writer,
            "steps_per_commit": steps_per_commit,
            "autoreset": self.autoreset,
        }
        metadata = build_metadata(
            env_id=env_id,
            observation_space=observation_space,
            action_space=action_space,
            num_envs=self.num_envs,
            policy=self.policy,
            algorithm=algorithm,
            seed=self.seed,
            config=parsed,
            recorder=recorder_args,
            steps_per_commit=steps_per_commit,
            total_frames=total_frames,
        )
        planned = math.ceil(total_frames / self.num_envs) if total_frames else None
        self._stack = contextlib.ExitStack()
        try:
            self._stack.enter_context(claim(self.path, "a Recorder"))  # durability D17
            try:
                self.writer = make_writer(
                    writer,
                    self.path,
                    metadata=metadata,
                    overwrite=overwrite,
                    lanes=self.num_envs,
                    planned_steps=planned,
                    **(writer_options or {}),
                )
            except TypeError as exc:  # an option the backend does not have
                raise UsageError(f"writer_options for writer={writer}: {exc}") from None
            self.writer.batch_steps = steps_per_commit  # HDF5 chunks: a commit's steps
            self.writer.open()
        except BaseException:
            self._stack.close()
            raise
        self._closed = False
        self._pos = np.zeros(self.num_envs, np.int64)  # each lane's next slot in the buffer
        self._even = True  # every lane at the same slot
        self._keys: dict[Any, fmt.Key] = {}  # extras' names, checked once
        self._last_flush = time.monotonic()
        self._traj = np.arange(self.num_envs, dtype=np.int64)  # each lane's running id
        self._next_id = self.num_envs
        self._starting = np.ones(self.num_envs, bool)  # lanes whose episode starts next step
        self._resetting = np.zeros(self.num_envs, bool)  # next_step: lanes the env resets next
        self._row_step: int | None = None  # the training step of the last sources row
        self.steps = 0  # time steps recorded
        self.frames = 0  # valid frames recorded (committed or held)
        atexit.register(self._at_exit)

    # -- context manager ---------------------------------------------------------------
    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close(fmt.COMPLETE)
        else:
            self._close_quietly()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def sources(self) -> list[dict[str, Any]]:
        """The sources table so far (one row per training step an episode started under)."""
        return list(self.writer.meta[fmt.SOURCES])

    # -- steps -------------------------------------------------------------------------
    def step(
        self,
        obs: Any,
        actions: Any,
        rewards: Any,
        next_obs: Any,
        terminated: Any,
        truncated: Any,
        infos: Any = None,
        *,
        policy_step: int | None = None,
        extras: dict[Any, Any] | None = None,
    ) -> None:
        """Record one step of every env: the observation each acted on, the actions,
        rewards, the next observation and the end flags (leading dimension
        ``num_envs``, numpy arrays or torch tensors, as gymnasium's vector API gives).

        Where an env's episode ended at this step, its frame's next observation is the
        final one ``infos`` hold for it (gymnasium's ``final_obs``, SB3's
        ``terminal_observation``), else ``next_obs`` must be the final observation.
        ``policy_step``: the training step of the policy that acted (None: unchanged).
        ``extras``: per-env arrays recorded as frame keys of their own."""
        if self._closed:
            raise UsageError(f"this Recorder of {str(self.path)!r} is closed: open a new one")
        n, buf = self.num_envs, self._buffer
        term = self._flags(terminated, "terminated")
        trunc = self._flags(truncated, "truncated")
        extras = self._extras(extras)
        live = ~self._resetting  # next_step: a lane the env resets now records nothing
        if policy_step is not None:
            policy_step = int(policy_step)
        if not self.writer.meta[fmt.SOURCES] or (
            policy_step is not None
            and policy_step != self._row_step
            and (self._starting & live).any()
        ):
            self._new_source(policy_step)
        pos = self._pos
        if self._even and live.all():  # every lane at the same slot: plain slices
            lanes = None
            slot: tuple[Any, Any] = ((slice(None), int(pos[0])), None)
        else:  # next_step: each lane at its own slot, the lanes being reset skipped
            lanes = np.flatnonzero(live)
            slot = ((lanes, pos[lanes]), lanes)
        buf.put_obs(buf.obs, slot, to_numpy(obs), "obs")
        buf.put_action(slot, to_numpy(actions))
        buf.put_obs(buf.next_obs, slot, to_numpy(next_obs), "next_obs")
        reward = np.asarray(to_numpy(rewards))
        if reward.shape not in ((n,), (n, 1)):
            raise UsageError(
                f"rewards has shape {shape_text(reward.shape)}, expected ({n},) (num_envs={n})"
            )
        put(buf.reward, slot, reward.reshape(n, 1), n, "rewards")
        buf.put_extras(slot, extras)
        ended = (term | trunc) & live
        for lane in np.flatnonzero(ended).tolist():
            final = final_observation(infos, lane)
            if final is not None:
                where = int(pos[lane])
                buf.put_one_obs(buf.next_obs, lane, where, to_numpy(final), "the final observation")
        index, sel = slot
        pick = slice(None) if sel is None else sel
        buf.terminated[index] = term[pick, None]
        buf.truncated[index] = trunc[pick, None]
        buf.done[index] = ended[pick, None]
        buf.traj[index] = self._traj[pick]
        buf.mask[index] = True
        # the next step: ended lanes start a new trajectory (next_step: after a reset)
        count = int(np.count_nonzero(ended))
        if count:
            self._traj[ended] = np.arange(self._next_id, self._next_id + count)
            self._next_id += count
        if lanes is None:
            pos += 1
        else:
            pos[lanes] += 1
            self._even = bool((pos == pos[0]).all())
        if self.autoreset == NEXT_STEP:
            self._starting, self._resetting = ~live, ended
        else:
            self._starting = ended
        self.steps += 1
        self.frames += n if lanes is None else len(lanes)
        filled = pos[0] if self._even else pos.max()  # the fullest lane's steps held
        if (
            filled >= self.steps_per_commit
            or time.monotonic() - self._last_flush >= self.commit_interval
        ):
            self._flush(commit=True)

    def _flags(self, value: Any, what: str) -> np.ndarray:
        array = np.asarray(to_numpy(value))
        n = self.num_envs
        if array.shape not in ((n,), (n, 1)):
            raise UsageError(
                f"{what} has shape {shape_text(array.shape)}, expected ({n},) (num_envs={n})"
            )
        if array.dtype.kind not in "biuf":
            raise UsageError(f"{what} must be booleans, got {array.dtype}")
        return array.reshape(n).astype(bool)

    def _extras(self, extras: dict[Any, Any] | None) -> dict[fmt.Key, np.ndarray] | None:
        if extras is None:
            return None
        if not isinstance(extras, dict):
            raise UsageError(
                f"extras must be a dict of per-env arrays, not {type(extras).__name__}"
            )
        out = {}
        for name, value in extras.items():
            key = self._keys.get(name) or self._keys.setdefault(name, extra_key(name))
            array = np.asarray(to_numpy(value))
            if array.ndim < 1 or array.shape[0] != self.num_envs:
                raise UsageError(
                    f"extras[{fmt.path(key)!r}] has shape {shape_text(array.shape)}: its first "
                    f"dimension must be num_envs={self.num_envs}"
                )
            if array.dtype.kind not in "biuf":
                raise UsageError(f"extras[{fmt.path(key)!r}] must hold numbers, got {array.dtype}")
            out[key] = array
        return out

    def _new_source(self, policy_step: int | None) -> None:
        """A sources row for the policy at ``policy_step``: the steps held so far go to
        the writer first (their episodes started under the rows before)."""
        self._flush(commit=False)
        table = self.writer.meta[fmt.SOURCES]
        row = fmt.source_row(
            self.policy,
            {"algorithm": self.algorithm},
            training_step=policy_step,
            seed=self.seed,
            # once, in the first row: a long training adds a row per episode or so
            config=None if table else self._config_text,
        )
        table.append(row)
        self.writer.source = len(table) - 1
        self._row_step = policy_step

    # durability D4 (docs/durability.md)
    def _flush(self, commit: bool) -> None:
        """Append the steps held as one batch (and commit it). Lanes that hold fewer
        (next_step: the steps their env reset in) end the batch with padding."""
        self._last_flush = time.monotonic()
        steps = int(self._pos.max())
        if steps:
            for lane in np.flatnonzero(self._pos < steps).tolist():
                self._buffer.pad(lane, int(self._pos[lane]), steps)
        self._pos[:] = 0
        self._even = True
        if not steps and not commit:
            return
        with signals_held():
            if steps:
                self.writer.append(self._buffer.batch(steps))
            if commit:
                self.writer.commit()

    def commit(self) -> None:
        """Write the steps held so far and make them durable now."""
        if self._closed:
            raise UsageError(f"this Recorder of {str(self.path)!r} is closed")
        self._flush(commit=True)

    # -- the end -----------------------------------------------------------------------
    def close(self, status: str = fmt.COMPLETE) -> None:
        """Write the steps held, record the running episodes as cut (``complete``
        False) and set ``status`` (``complete`` or ``interrupted``). Idempotent."""
        if status not in (fmt.COMPLETE, fmt.INTERRUPTED):
            raise UsageError(f"status must be {fmt.COMPLETE} or {fmt.INTERRUPTED}, got {status!r}")
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        try:
            with signals_held():
                try:
                    if self._pos.any():
                        self._flush(commit=False)
                finally:
                    self.writer.close(status)
        finally:
            self._stack.close()

    def _close_quietly(self) -> None:
        """Close as ``interrupted``, keeping quiet about a failure: the error that led
        here matters more, and the last commit stands."""
        with contextlib.suppress(Exception):
            self.close(fmt.INTERRUPTED)

    def _at_exit(self) -> None:
        self._close_quietly()
