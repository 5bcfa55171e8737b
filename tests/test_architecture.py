"""What docs/ARCHITECTURE.md promises about the tree, checked on the syntax tree (issue 29).

- one RNG entry point for directions: only ``stats/null.py`` draws from a normal distribution;
- single homes: a name the issue found defined twice is defined once.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "valueprobe"

# A random direction is a normal draw normalised; every such draw goes through stats/null.py
# (`random_directions` by seed, `unit_directions` on a generator a caller also shuffles with).
# These are the samplers that can make one: numpy's Generator / np.random methods and torch's.
# Uniform draws (the sampler's `torch.rand` for inverse-CDF sampling), permutations, integers and
# choices (bootstrap resampling, splits) and `random.Random` (dataset generators) are not
# directions and stay where they are.
NORMAL_SAMPLERS = {"standard_normal", "normal", "multivariate_normal", "randn", "randn_like", "normal_"}
RNG_HOME = Path("stats/null.py")


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE), ast.parse(path.read_text(encoding="utf-8"))


def normal_draws(tree: ast.AST) -> list[int]:
    """Lines that call a normal sampler (``x.standard_normal(...)``, ``torch.randn(...)``, ...)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in NORMAL_SAMPLERS:
                lines.append(node.lineno)
    return lines


def test_only_stats_null_draws_random_directions():
    outside = [f"{rel}:{line}" for rel, tree in _modules() if rel != RNG_HOME for line in normal_draws(tree)]
    assert not outside, f"draw random directions through valueprobe.stats.null: {outside}"
    assert normal_draws(ast.parse((PACKAGE / RNG_HOME).read_text(encoding="utf-8")))  # the home draws


def test_the_rng_rule_sees_each_kind_of_draw():
    for src in (
        "torch.randn(5, generator=g)",
        "rng.standard_normal((3, 4))",
        "np.random.normal(0, 1, 3)",
        "v.normal_()",
        "randn(3)",
    ):
        assert normal_draws(ast.parse(src)) == [1], src
    assert not normal_draws(ast.parse("torch.rand(1, generator=g); rng.permutation(4); rng.integers(0, 3)"))


def _top_level_functions() -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for rel, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                where.setdefault(node.name, []).append(str(rel))
    return where


def test_single_homes():
    where = _top_level_functions()
    for name in ("is_refusal", "null_range", "trace_figure"):
        assert len(where.get(name, [])) == 1, (name, where.get(name))
