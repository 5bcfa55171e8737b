"""Every headline figure of the README and the results page is its committed file's value, printed
beside the command that writes it, and that command's defaults are the committed run's settings
(docs/figures.json: one row a figure). Figures read in σ before the neutral reference are restated
in the current σ: the committed value × the σ it was read in / the σ now (probe.json ``formerly``)."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer

from valueprobe.cli.main import app
from valueprobe.probe.axis import ValueAxis

ROOT = Path(__file__).resolve().parents[1]
ROWS = json.loads((ROOT / "docs" / "figures.json").read_text(encoding="utf-8"))["rows"]
IDS = [f"{r['page']}: {r['figure']}" for r in ROWS]


def _at(data: Any, key: str) -> Any:
    for part in key.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def _printed(row: dict) -> str:
    """The row's figure as the page prints it, from the committed file."""
    data = json.loads((ROOT / row["file"]).read_text(encoding="utf-8"))
    factor = float(row.get("scale", 1.0))
    if "sigma" in row:
        name, layer = row["sigma"]
        axis = ValueAxis.load(ROOT / "probes" / name)
        factor *= axis.former().sigma_at(layer) / axis.sigma_at(layer)
    values = [float(_at(data, key)) * factor for key in row["values"]]
    return row["format"].format(*values).replace("-", "−")


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_each_figure_is_its_committed_value_beside_its_command(row):
    page = (ROOT / row["page"]).read_text(encoding="utf-8")
    assert row["figure"] in page, f"{row['page']} no longer prints {row['figure']!r}"
    assert row["command"] in page, f"{row['page']} does not print the command {row['command']!r}"
    assert _printed(row) == row["figure"], (row["file"], _printed(row))


def _command(words: list[str]) -> Any:
    command = typer.main.get_command(app)
    for word in words:
        command = command.commands[word]  # type: ignore[attr-defined]
    return command


def _same(default: Any, committed: Any) -> bool:
    if isinstance(default, Enum):
        default = default.value
    if isinstance(committed, list) and isinstance(default, str):
        return [float(x) for x in default.split(",")] == [float(x) for x in committed]
    return default == committed


@pytest.mark.parametrize("row", [r for r in ROWS if r.get("settings")], ids=lambda r: r["figure"])
def test_each_command_s_defaults_are_the_committed_settings(row):
    """What the printed command runs with (its options' defaults) is what the committed run recorded."""
    words = [w for w in row["command"].split() if not w.startswith("-")][:2]
    params = {p.name: p for p in _command(words).params}
    data = json.loads((ROOT / row["file"]).read_text(encoding="utf-8"))
    for option, key in row["settings"]:
        assert _same(params[option].default, _at(data, key)), (option, params[option].default, _at(data, key))


def test_the_figure_check_fails_on_a_changed_value():
    row = next(r for r in ROWS if r["figure"] == "0.873 [0.832, 0.908]")
    assert (
        _printed({**row, "values": [*row["values"][:1], row["values"][1], row["values"][1]]}) != row["figure"]
    )
    assert _printed({**row, "sigma": ["smollm2-135m-value", 20]}) != row["figure"]


@pytest.mark.slow
@pytest.mark.parametrize("row", [r for r in ROWS if r.get("run")], ids=lambda r: r["figure"])
def test_the_printed_command_gives_the_figure(row, tmp_path, capsys, monkeypatch):
    """The command as printed (from a folder outside the checkout) gives the figure's AUROC."""
    from valueprobe.cli.main import main

    monkeypatch.chdir(tmp_path)
    argv = ["valueprobe", *row["command"].split()]
    main([*argv[1:], "--bootstrap", "0", "--out", str(tmp_path / "out")])  # returns on success
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    committed = _at(json.loads((ROOT / row["file"]).read_text()), row["values"][0])
    overall = next(g for g in summary["summary"] if g["group"] == "all")
    assert summary["tokens"] == "last"  # as the figure was read, with no --tokens given
    assert overall["score_auroc"] == pytest.approx(committed, abs=5e-4)  # the store was float16
