"""collect_cli._startup: tensordict imported without torch._dynamo, markers restored."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import collect_cli
import torch.compiler
before = (torch.compiler.allow_in_graph, torch.compiler.assume_constant_result)
from tensordict import TensorDict
import tensordict.nn
from collect_cli.run import run
import torch
td = TensorDict({"a": torch.arange(6.0).reshape(3, 2)}, [3])
assert torch.cat([td, td])["a"].sum().item() == 30.0
assert (torch.compiler.allow_in_graph, torch.compiler.assume_constant_result) == before
assert "torch._dynamo" not in sys.modules, "torch._dynamo was imported"
assert not any(type(f).__module__ == "collect_cli._startup" for f in sys.meta_path)
print("ok")
"""


def test_tensordict_import_skips_dynamo_and_restores_torch_compiler():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_torch_compile_still_works_after_the_import():
    code = (
        "import collect_cli, tensordict, torch\n"
        "f = torch.compile(lambda x: x * 2, backend='eager')\n"
        "print(f(torch.ones(3)).tolist())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[2.0, 2.0, 2.0]"
