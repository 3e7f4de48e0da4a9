"""Public Python API: collectors that yield TensorDict batches ``[lanes, time]``.

>>> from collect_cli.collectors import SyncCollector
>>> from collect_cli.envs import env_factory
>>> with SyncCollector(env_factory("Pendulum-v1", 4), frames_per_batch=200, total_frames=400) as c:
...     for batch in c:
...         batch["next", "reward"].shape
torch.Size([4, 50, 1])
torch.Size([4, 50, 1])
"""

from collect_cli.collectors.base import CollectorBase, derive_seeds
from collect_cli.collectors.multiprocess import (
    AsyncCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
)
from collect_cli.collectors.postproc import MultiStep, TrajectorySplitter, split_trajectories
from collect_cli.collectors.sync import SyncCollector

__all__ = [
    "AsyncCollector",
    "CollectorBase",
    "MultiAsyncCollector",
    "MultiStep",
    "MultiSyncCollector",
    "SyncCollector",
    "TrajectorySplitter",
    "derive_seeds",
    "split_trajectories",
]
