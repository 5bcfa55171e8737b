"""The parts protocol alone (valueprobe/sharded.py): which parts belong together, and a merge of a
kind made up here — every kind of part (capture, score, steer, shift, attribute) goes through it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from conftest import run_cli

import valueprobe
from valueprobe import sharded
from valueprobe.cli.app import PART_MODULES
from valueprobe.errors import ValueprobeError
from valueprobe.sharded import Part, PartKind, check_together, declare, kind_of, merge, reread
from valueprobe.vocab import ShardSpec


def _read_count(path: Path) -> Part[int]:
    head = json.loads((path / "count.json").read_text())
    return Part(path, ShardSpec(head["i"], head["n"]), head["count"], settings={"seed": head["seed"]})


def _join_counts(out: Path, parts: Sequence[Part[int]]) -> int:
    out.mkdir()
    (out / "order.txt").write_text(" ".join(str(p.shard.index) for p in parts))
    return sum(p.body for p in parts)


# Parts holding a count each (count.json); the merge writes their sum in shard order.
COUNT = PartKind(
    command="count",
    marker="count.json",
    read=_read_count,
    join=_join_counts,
    did="was counted",
    source="was counted on",
    result="count",
)


def _part(i: int, n: int = 3, **kw) -> Part[None]:
    base: Part[None] = Part(
        Path(f"p{i}"), ShardSpec(i, n), None, model="fp", dataset=("d.jsonl", "abc", 9),
        settings={"seed": 0, "layers": [1, 2]}, other=(("probe", "x"),),
    )  # fmt: skip
    return replace(base, **kw)


def _refused(parts: list[Part[None]], match: str) -> None:
    with pytest.raises(ValueprobeError, match=match):
        check_together(parts, COUNT)


def test_parts_that_belong_together_pass_in_any_order():
    check_together([_part(2), _part(0), _part(1)], COUNT)
    # the dataset's path is not its identity: the same bytes under another name belong
    check_together([_part(0), _part(1, dataset=("copy.jsonl", "abc", 9)), _part(2)], COUNT)


def test_each_difference_is_one_line_naming_the_part_and_what_differs():
    _refused(
        [_part(0), _part(1, model="other"), _part(2)],
        r"part p1 was counted on another model \(fingerprint other, not fp as p0\)",
    )
    _refused(
        [_part(0), _part(1, dataset=("e.jsonl", "def", 9)), _part(2)],
        r"part p1 was counted on another dataset \(e.jsonl, 9 examples\) than p0",
    )
    _refused([_part(0), _part(1, dataset=("d.jsonl", "abc", 8)), _part(2)], "another dataset")
    _refused([_part(0), _part(1), _part(2, other=(("probe", "y"),))], "part p2 differs from p0 in its probe")
    _refused(
        [_part(0), _part(1, settings={"seed": 3, "layers": [1, 2]}), _part(2)],
        "part p1 was counted with seed=3, not 0 as p0",
    )
    # a setting only one part has differs too (its absence reads as None)
    _refused(
        [_part(0), _part(1, settings={"seed": 0, "layers": [1, 2], "k": 4}), _part(2)], "with k=4, not None"
    )
    _refused([_part(0), _part(2)], "shard 1/3 is missing")
    _refused([_part(0), _part(1), _part(1), _part(2)], "parts p1 and p1 are both shard 1/3")
    _refused([_part(0), _part(1, n=2), _part(2)], "part p1 is shard 1/2, of another split than p0")  # fmt: skip


def test_a_setting_written_before_it_was_recorded_matches_any_value():
    old = _part(1, settings={"seed": 0, "layers": [1, 2], "dtype": None}, unrecorded=frozenset({"dtype"}))
    new = [_part(0, settings={"seed": 0, "layers": [1, 2], "dtype": "bf16"}), _part(2, settings={"seed": 0, "layers": [1, 2], "dtype": "bf16"})]  # fmt: skip
    check_together([new[0], old, new[1]], COUNT)
    check_together([old, *new], COUNT)  # either side of the comparison may be the older part
    _refused([new[0], _part(1, settings={"seed": 0, "layers": [1, 2], "dtype": None}), new[1]], "dtype=None")


def _write(path: Path, i: int, n: int, count: int, seed: int = 0) -> Path:
    path.mkdir(parents=True)
    (path / "count.json").write_text(json.dumps({"i": i, "n": n, "count": count, "seed": seed}))
    return path


def test_merge_reads_checks_and_joins_in_shard_order(tmp_path):
    kind = COUNT
    parts = [_write(tmp_path / f"c{i}", i, 3, 10 * i + 1) for i in (2, 0, 1)]
    assert kind_of(parts[0], [kind]) is kind and kind_of(tmp_path, [kind]) is None
    assert merge(tmp_path / "out", parts, kind) == 33
    assert (tmp_path / "out" / "order.txt").read_text() == "0 1 2"
    with pytest.raises(ValueprobeError, match="merge OUT .* is one of its parts"):
        merge(parts[0], parts, kind)
    with pytest.raises(ValueprobeError, match="exists and is not an empty folder"):
        merge(tmp_path / "out", parts, kind)
    with pytest.raises(ValueprobeError, match="needs the part folders"):
        merge(tmp_path / "new", [], kind)
    seeded = _write(tmp_path / "seeded", 1, 3, 11, seed=5)
    with pytest.raises(ValueprobeError, match=f"part {seeded} was counted with seed=5, not 0"):
        merge(tmp_path / "new", [parts[1], seeded, parts[0]], kind)
    assert not (tmp_path / "new").exists()


def test_a_dataset_is_read_again_only_while_its_sha256_matches(tmp_path):
    from valueprobe.datasets.io import Example, write_jsonl
    from valueprobe.files import sha256_file

    data = tmp_path / "d.jsonl"
    write_jsonl(data, [Example(id="a", text="x", label=1, group="g")])
    digest = sha256_file(data)
    assert [e.id for e in reread(tmp_path / "p0", str(data), digest, COUNT)] == ["a"]
    data.write_text(data.read_text().replace('"x"', '"y"'))
    with pytest.raises(ValueprobeError, match=f"part {tmp_path / 'p0'} was counted on {data} .* has changed"):
        reread(tmp_path / "p0", str(data), digest, COUNT)
    with pytest.raises(ValueprobeError, match="which is not there"):
        reread(tmp_path / "p0", str(tmp_path / "gone.jsonl"), digest, COUNT)


@dataclass(frozen=True)
class Counted:
    """What the count kind's join returns for the merged summary: a total with its table."""

    total: int

    def table(self) -> tuple[list[str], list[list[object]]]:
        return ["total"], [[self.total]]


@pytest.fixture
def counted():
    """The toy kind, declared for one test and taken out after it (only it: the kinds the merge's
    imports declare meanwhile stay, as their modules stay imported)."""
    kind = declare(replace(COUNT, join=lambda out, parts: Counted(_join_counts(out, parts))))
    yield kind
    sharded.KINDS.remove(kind)


def test_a_kind_is_one_declaration_that_merge_and_the_cli_find_by_its_marker(tmp_path, counted, capsys):
    """Declared, the kind's parts merge with no kind named, through the library and `valueprobe merge`
    (its summary generic: the result's table); a folder of no declared kind is refused."""
    kind = counted
    assert kind in sharded.KINDS and declare(kind) is kind and sharded.KINDS.count(kind) == 1
    with pytest.raises(ValueError, match="two kinds of part are marked by count.json"):
        declare(replace(COUNT))
    parts = [_write(tmp_path / f"c{i}", i, 2, 5 + i) for i in (1, 0)]
    assert merge(tmp_path / "lib", parts) == Counted(11)
    code, out, err = run_cli(["merge", str(tmp_path / "cli"), *map(str, parts)], capsys)
    assert code == 0 and "(merged)" in out and "11" in out and "merged 2 parts" in out, err
    assert (tmp_path / "cli" / "order.txt").read_text() == "0 1"
    code, _, err = run_cli(["merge", str(tmp_path / "x"), str(tmp_path)], capsys)
    assert code == 2 and "holds no sharded result" in err and "count.json" in err


def test_merge_declares_every_kind_in_a_fresh_interpreter():
    """`valueprobe merge` finds a kind only once its module is imported. Command modules load the
    library when their command runs, so `declare_kinds` imports `PART_MODULES`: the CLI alone
    declares none, and after it every module that calls ``declare`` has declared its kind."""
    code = (
        "import valueprobe.cli.main; from valueprobe.sharded import KINDS; print(len(KINDS));"
        " from valueprobe.cli.app import declare_kinds; declare_kinds();"
        " print(sorted(k.command for k in KINDS))"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert got.split("\n")[:2] == [
        "0",
        str(sorted(["attribute", "capture", "eval", "score", "shift", "steer"])),
    ]
    package = Path(valueprobe.__file__).parent
    declaring = sorted(
        "valueprobe." + ".".join(p.relative_to(package).with_suffix("").parts)
        for p in package.rglob("*.py")
        if re.search(r"^[A-Z_]+ = declare\(", p.read_text(encoding="utf-8"), re.M)
    )
    assert declaring == sorted(PART_MODULES)
