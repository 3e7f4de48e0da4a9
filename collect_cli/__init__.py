"""rlcollect: roll out policies in RL environments and stream the trajectories to disk."""

__version__ = "0.1.0"
