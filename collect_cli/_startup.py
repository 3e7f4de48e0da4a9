"""Import tensordict without importing ``torch._dynamo`` (1.4 s of every start).

At import time tensordict marks a few functions for ``torch.compile``
(``torch.compiler.allow_in_graph`` / ``assume_constant_result``), and each of
those calls imports the whole of ``torch._dynamo``. rlcollect never compiles:
a run paid more for that import than for collecting a small dataset. While
tensordict's own modules execute, both markers are the identity; they are
restored right after. Under ``torch.compile`` the unmarked functions are traced
or cause a graph break: slower there, never wrong.

:func:`install` adds a meta-path finder that does this on the first
``import tensordict`` of the process (a CLI run, a spawned worker, a test),
and then removes itself. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

MARKERS = ("allow_in_graph", "assume_constant_result")


def _unmarked(fn: Any) -> Any:
    return fn


class _Loader:
    """tensordict's own loader, run with the compile markers switched off."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        import torch.compiler

        saved = {name: getattr(torch.compiler, name) for name in MARKERS}
        for name in MARKERS:
            setattr(torch.compiler, name, _unmarked)
        try:
            self.inner.exec_module(module)
        finally:
            for name, fn in saved.items():
                setattr(torch.compiler, name, fn)

    def __getattr__(self, name: str) -> Any:  # resource readers and the like
        return getattr(self.inner, name)


class _Finder:  # a meta path finder (importlib.abc costs 16 ms of every start)
    def find_spec(self, name, path=None, target=None):
        if name != "tensordict":
            return None
        uninstall()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


_finder = _Finder()


def install() -> None:
    """Take the next ``import tensordict`` (if it is not imported yet)."""
    if "tensordict" not in sys.modules and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
