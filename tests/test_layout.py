"""The layout's promises that no linter checks: few top-level modules, short functions.

The import order itself is checked by ``lint-imports`` (pyproject ``[tool.importlinter]``) in CI.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "valueprobe"
MAX_TOP_LEVEL = 8
MAX_LINES = 80  # outside datasets/, whose generators hold word tables


def test_at_most_eight_modules_at_the_top():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_no_function_over_80_lines_outside_datasets():
    long = []
    for path in PACKAGE.rglob("*.py"):
        if "datasets" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def _layers(container: str) -> set[str]:
    """The names the layers contract of ``container`` (pyproject) puts in its layers."""
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers" and c["containers"] == [container]]
    return {part.strip() for layer in layers["layers"] for part in layer.split("|")}


def test_the_layer_contract_names_every_subpackage():
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert subpackages | modules == _layers("valueprobe")


def test_steering_is_split_by_role_and_its_contract_names_every_folder():
    """steering/ holds only its three role folders, and their layers contract names each."""
    steering = PACKAGE / "steering"
    folders = {p.parent.name for p in steering.glob("*/__init__.py")}
    assert {p.name for p in steering.glob("*.py")} == {"__init__.py"}
    assert folders == _layers("valueprobe.steering") == {"hook", "decode", "experiment"}
