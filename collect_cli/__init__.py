"""rlcollect: roll out policies in RL environments and stream the trajectories to disk."""

from collect_cli import _startup

__version__ = "0.1.0"

_startup.install()
