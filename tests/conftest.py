"""Fixtures only: ``cli`` runs the real CLI (``support/cli_runner.py``) in the test's
folder; ``backend`` is every storage backend in turn."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "support"))  # test envs, policies, the runner

from tests.support.cli_runner import BACKENDS, Result, run_cli


def pytest_collection_modifyitems(items):
    """Tests marked ``slow`` run first: with ``-n 2`` a long test collected late
    would otherwise run alone at the end while the other worker idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def cli(tmp_path):
    def _run(*args: str, **kw) -> Result:
        kw.setdefault("cwd", tmp_path)
        return run_cli(*args, **kw)

    return _run


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param
