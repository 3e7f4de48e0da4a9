"""The package's shape: layers that import only downwards, no import cycle, and
the dataset's key names written in one module (``collect_cli/dataformat.py``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from collect_cli import dataformat as fmt

PACKAGE = Path(__file__).parent.parent / "collect_cli"

# lowest first: a module imports from its own layer or the ones before it; a
# folder (a package) is one layer with everything in it
LAYERS = [
    (
        "base",
        {
            "collect_cli",
            "collect_cli._startup",
            "collect_cli.errors",
            "collect_cli.dataformat",
            "collect_cli.specs",
            "collect_cli.rollout",
            "collect_cli.threads",
            "collect_cli.devices",
        },
    ),
    ("schema", {"collect_cli.schema", "collect_cli.config_checks"}),  # the options' classes
    ("envs", {"collect_cli.envs"}),
    ("policies", {"collect_cli.policies"}),
    ("collectors", {"collect_cli.collectors"}),
    ("dataset", {"collect_cli.dataset"}),  # the format on disk: a writer and a reader per backend
    ("ops", {"collect_cli.ops"}),  # whole-dataset operations above the format
    ("report", {"collect_cli.report"}),
    ("config", {"collect_cli.config"}),  # the Hydra groups: every registry's options
    ("stream", {"collect_cli.stream", "collect_cli.writer_process"}),
    ("record", {"collect_cli.record"}),  # a training loop's steps into a dataset
    ("run", {"collect_cli.run", "collect_cli.progress", "collect_cli.sweep"}),
    ("cli", {"collect_cli.cli", "collect_cli.__main__"}),
]
FOLDERS = {p.name for p in (Path(__file__).parent.parent / "collect_cli").iterdir() if p.is_dir()}
# neither knows of the other: batches are the only thing they share
APART = [("collectors", "dataset"), ("collectors", "ops"), ("dataset", "collectors")]


MODULE_PATH = re.compile(r"(collect_cli(?:\.[A-Za-z_]\w*)+)(?::\w+)?")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every collect_cli module ``path`` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "collect_cli":  # the names may be modules too
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("collect_cli")}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = MODULE_PATH.fullmatch(node.value)  # a registry's "module:NAME"
            found |= {match.group(1)} if match else set()
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: imports(path) & set(MODULES) - {name} for name, path in MODULES.items()}


def layer_of(name: str) -> int:
    parts = name.split(".")
    folder = ".".join(parts[:2]) if len(parts) > 1 and parts[1] in FOLDERS else None
    for index, (_, members) in enumerate(LAYERS):
        if name in members or folder in members:
            return index
    raise AssertionError(f"{name} has no layer: add it to LAYERS in {__file__}")


def test_every_module_imports_only_its_layer_or_below():
    wrong = []
    for name, deps in GRAPH.items():
        for dep in deps:
            if layer_of(dep) > layer_of(name):
                wrong.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {dep}")
            pair = (LAYERS[layer_of(name)][0], LAYERS[layer_of(dep)][0])
            if pair in APART:
                wrong.append(f"{name} imports {dep}: {pair[0]} know nothing of {pair[1]}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycle():
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for dep in sorted(GRAPH[name]):
            if state.get(dep) == "open":
                cycle = [*trail[trail.index(dep) :], dep] if dep in trail else [name, dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*trail, dep])
        state[name] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])


def format_keys() -> tuple[set[str], set[tuple[str, ...]]]:
    """The key names only the format module may spell out: frame keys (joined and
    as tuples), episodes columns, and the names of format-made entries."""
    tuples = {v for v in vars(fmt).values() if isinstance(v, tuple) and len(v) > 1}
    tuples = {t for t in tuples if all(isinstance(p, str) for p in t) and t[0] != "done"}
    names = {fmt.path(t) for t in tuples} | {fmt.column(c) for c in fmt.COLUMNS}
    names |= {fmt.NEXT, fmt.LANE_STEPS, *fmt.STEPS_TO_NEXT_KEY, fmt.ORIGINAL_REWARD_KEY[1]}
    names |= {fmt.TRAJ_KEY[1]}
    return names, tuples


def test_key_names_come_from_the_format_module():
    names, tuples = format_keys()
    assert "collector/traj_ids" in names and ("next", "done") in tuples  # the scan is armed
    found = []
    for name, path in MODULES.items():
        if name == "collect_cli.dataformat":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
            elif isinstance(node, ast.Tuple) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
            ):
                value = tuple(e.value for e in node.elts)
                if value in tuples:
                    found.append(f"{path.name}:{node.lineno} {value!r}")
    assert not found, "dataset key literals outside dataformat.py:\n" + "\n".join(found)


def test_every_folder_is_a_package_the_wheel_ships():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    shipped = set(pyproject["tool"]["setuptools"]["packages"]) - {"collect_cli.conf"}
    folders = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert "collect_cli.dataset.hdf5" in folders  # the scan is armed
    assert shipped == folders, f"missing {folders - shipped}, gone {shipped - folders}"


def status_uses(tree: ast.AST) -> list[ast.Constant]:
    """String constants used as a dataset status: compared, a parameter's default,
    assigned to a ``*status*`` name, a ``"status"`` entry's value, or passed to ``close``."""
    uses: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            uses += [node.left, *node.comparators]
        elif isinstance(node, ast.arguments):
            uses += [*node.defaults, *node.kw_defaults]
        elif isinstance(node, ast.Assign) and any("status" in ast.unparse(t) for t in node.targets):
            uses.append(node.value)
        elif isinstance(node, ast.Dict):
            uses += [v for k, v in zip(node.keys, node.values, strict=True) if k is not None
                     and isinstance(k, ast.Constant) and k.value == "status"]  # fmt: skip
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("close"):
            uses += node.args
        elif isinstance(node, ast.IfExp):
            uses += [node.body, node.orelse]
    return [u for u in uses if isinstance(u, ast.Constant) and u.value in fmt.STATUSES]


def test_status_names_come_from_the_format_module():
    assert status_uses(ast.parse('s = "complete"\nif x == "running": f.close("interrupted")'))
    found = [
        f"{path.name}:{node.lineno} {node.value!r}"
        for name, path in MODULES.items()
        if name != "collect_cli.dataformat"
        for node in status_uses(ast.parse(path.read_text()))
    ]
    assert not found, "use dataformat.RUNNING / COMPLETE / INTERRUPTED:\n" + "\n".join(found)


def test_no_module_is_over_500_lines():
    long = {
        name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 500
    }
    assert not long, f"split these by what they do: {long}"
