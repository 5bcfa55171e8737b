"""Shipped axes and datasets by name (valueprobe.probe.registry, valueprobe.datasets.shipped).

The package carries copies of probes/NAME and data/: these tests keep them byte-equal to the repo's
files (the source of truth), check that a name reads exactly what the repo path reads, from any
folder, and that names and paths never collide silently. Also here: the version has one source,
newer artifact formats are refused in one line, and no command's default output is the package or
the repository's result folders.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import torch
import typer
from conftest import run_cli

import valueprobe as vp
from valueprobe.activations.manifest import StoreManifest
from valueprobe.cli.app import app
from valueprobe.datasets.shipped import DATA_DIR, dataset_path, shipped_datasets
from valueprobe.errors import ValueprobeError
from valueprobe.files import PACKAGE_DIR, check_output_dir, check_output_file
from valueprobe.probe.registry import AXES_DIR, probe_path, shipped_axes
from valueprobe.version import __version__

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("smollm2-135m-value", "smollm2-135m-reward-history", "smollm2-135m-value-orthogonal")


# ---- the package copies cannot drift from the repo ------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_a_shipped_axis_is_a_byte_copy_of_its_probes_folder(name):
    entry = shipped_axes()[name]
    for file in ("axis.safetensors", "probe.json"):
        source, copy = ROOT / entry.source / file, entry.path / file
        assert copy.read_bytes() == source.read_bytes(), (
            f"{copy} differs from {source}: copy it over (cp {entry.source}/{file} {copy.relative_to(ROOT)})"
        )


def test_the_registry_lists_exactly_the_shipped_folders():
    folders = sorted(p.name for p in AXES_DIR.iterdir() if p.is_dir())
    assert sorted(shipped_axes()) == folders == sorted(NAMES)


def test_the_shipped_datasets_are_a_byte_copy_of_data():
    # data/caa/ (CAA's behaviours, read by `replicate caa`) is shipped too: compare file by file, down
    ours = sorted(p.relative_to(DATA_DIR).as_posix() for p in DATA_DIR.rglob("*") if p.is_file())
    theirs = sorted(
        p.relative_to(ROOT / "data").as_posix() for p in (ROOT / "data").rglob("*") if p.is_file()
    )
    assert ours == theirs, "data/ and its package copy list other files"
    for name in ours:
        assert (DATA_DIR / name).read_bytes() == (ROOT / "data" / name).read_bytes(), (
            f"valueprobe/datasets/data/{name} differs from data/{name}: cp data/{name} valueprobe/datasets/data/"
        )
    assert set(shipped_datasets()) == {Path(n).stem for n in ours if n.endswith(".jsonl") and "/" not in n}


# ---- names resolve to exactly what the repo paths hold ---------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_a_name_loads_the_shipped_axis_from_any_folder(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an empty folder: nothing relative can resolve into the checkout
    by_name = vp.ValueAxis.load(name)
    by_path = vp.ValueAxis.load(ROOT / "probes" / name)
    assert probe_path(name).is_relative_to(PACKAGE_DIR)
    for field in ("directions", "mu", "sigma", "mean_norm"):
        assert torch.equal(getattr(by_name, field), getattr(by_path, field))
    assert (by_name.layers, by_name.best_layer, by_name.fingerprint) == (
        by_path.layers,
        by_path.best_layer,
        by_path.fingerprint,
    )


def test_a_spec_names_a_shipped_axis_by_name_not_by_its_installed_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the spec is read in another folder, as after another install
    installed = str(probe_path("smollm2-135m-value"))  # what --probe NAME resolves to
    spec = vp.SteeringSpec(probe=installed, layers=[16], unit="norm")
    spec.save(tmp_path / "spec.json")
    assert json.loads((tmp_path / "spec.json").read_text())["probe"] == "smollm2-135m-value"
    again = vp.SteeringSpec.load(tmp_path / "spec.json")
    assert again.axes()[0].fingerprint == vp.ValueAxis.load("smollm2-135m-value").fingerprint
    other = tmp_path / "mine"
    shutil.copytree(installed, other)  # a copy elsewhere is a folder of its own: kept as written
    assert vp.SteeringSpec(probe=str(other)).to_dict()["probe"] == str(other)
    # a string no file system can hold (hypothesis found NUL in CI) is written as given, not raised
    assert vp.SteeringSpec(probe="a\x00b").to_dict()["probe"] == "a\x00b"


def test_an_unknown_name_lists_the_names_and_says_a_path_works(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueprobeError) as err:
        vp.ValueAxis.load("smollm2-135m-valu")
    line = str(err.value)
    assert "\n" not in line and all(name in line for name in NAMES) and "path of a folder" in line


def test_a_name_that_is_also_a_folder_here_is_refused_naming_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = vp.ValueAxis.load(NAMES[0])[18]  # a different axis (one layer) saved under the name
    local.save(tmp_path / NAMES[0])
    with pytest.raises(ValueprobeError) as err:
        vp.ValueAxis.load(NAMES[0])
    line = str(err.value)
    assert f"./{NAMES[0]}" in line and str(AXES_DIR / NAMES[0]) in line and "\n" not in line
    # each stays reachable: ./NAME (or a Path) is the folder here
    assert vp.ValueAxis.load(f"./{NAMES[0]}").layers == (18,)
    assert vp.ValueAxis.load(Path(NAMES[0])).layers == (18,)


def test_a_dataset_name_reads_the_shipped_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert vp.read_jsonl("steer_refusal") == vp.read_jsonl(ROOT / "data" / "steer_refusal.jsonl")
    assert len(vp.read_pairs("preference_words", split="train")) == len(
        vp.read_pairs(ROOT / "data" / "preference_words.jsonl", split="train")
    )
    with pytest.raises(ValueprobeError, match="code, confidence"):
        dataset_path("cod")
    (tmp_path / "code").mkdir()
    with pytest.raises(ValueprobeError, match=r"both a shipped dataset .* and ./code"):
        vp.read_jsonl("code")


def test_the_cli_takes_names_and_refuses_bad_ones_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["score", "--data", "steer_refusal", "--out", "o"]
    code, _, err = run_cli([*argv, "--probe", "nope"], capsys)
    assert code == 2 and err.count("\n") == 1 and all(name in err for name in NAMES), err
    code, _, err = run_cli([*argv, "--probe", NAMES[1], "--data", "nope"], capsys)
    assert code == 2 and err.count("\n") == 1 and "steer_refusal" in err and "nope" in err, err
    (tmp_path / NAMES[1]).mkdir()
    code, _, err = run_cli([*argv, "--probe", NAMES[1]], capsys)
    assert code == 2 and err.count("\n") == 1 and f"./{NAMES[1]}" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAMES[1]]  # nothing written


# ---- versions: one source, newer formats refused ---------------------------------------------------


def test_the_version_has_one_source(capsys):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "valueprobe.version.__version__"}
    assert metadata.version("valueprobe") == __version__ == vp.__version__
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out == f"valueprobe {__version__}\n"


def test_a_probe_of_a_newer_format_is_refused_in_one_line(tmp_path, capsys):
    folder = tmp_path / "newer"
    shutil.copytree(AXES_DIR / NAMES[0], folder)
    info = json.loads((folder / "probe.json").read_text())
    assert info["format_version"] == 1 and info["valueprobe_version"]  # what every probe.json keeps
    (folder / "probe.json").write_text(json.dumps({**info, "format_version": 2}))
    with pytest.raises(ValueprobeError, match="format_version 2 is newer than this valueprobe"):
        vp.ValueAxis.load(folder)
    code, _, err = run_cli(
        ["score", "--probe", str(folder), "--data", "code", "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and err.count("\n") == 1 and "upgrade valueprobe" in err


def test_a_store_of_a_newer_format_is_refused_in_one_line(tmp_path, capsys):
    manifest = {"format": "valueprobe.activations.store", "format_version": 2, "version": 2, "model_id": "m"}
    with pytest.raises(ValueprobeError, match="format_version 2 is newer than this valueprobe"):
        StoreManifest.from_dict(manifest, where=tmp_path / "manifest.json")
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_cli(["fit", "--store", str(store), "--out", str(tmp_path / "p")], capsys)
    assert code == 2 and err.count("\n") == 1 and "upgrade valueprobe" in err


# ---- defaults: nothing lands in the package or the repository's results ----------------------------


def _options(command, path: str = "valueprobe"):
    if hasattr(command, "commands"):  # a group (typer vendors its own click)
        for name, sub in command.commands.items():
            yield from _options(sub, f"{path} {name}")
    else:
        for param in command.params:
            yield path, param


def test_no_default_points_into_the_repository_or_the_package():
    """Outputs default under runs/ (or are required); inputs default to shipped names and data."""
    checked = 0
    for where, param in _options(typer.main.get_command(app)):
        default = param.default
        if not isinstance(default, Path):
            continue
        checked += 1
        shipped = {**shipped_axes(), **shipped_datasets()}
        shipped_name = len(default.parts) == 1 and default.name in shipped
        assert default.parts[0] == "runs" or default == DATA_DIR or shipped_name, (
            f"{where} {param.name}={default}"
        )
    assert checked >= 10


@pytest.mark.parametrize("command", [["steer", "--prompts", "steer_open"], ["replicate", "steer"]])
def test_steering_checks_its_out_before_loading_a_model(command, tmp_path, capsys):
    """An --out that cannot be a folder is refused first (these two loaded the model, or ran, before)."""
    (tmp_path / "file").write_text("x")
    argv = [
        *command,
        "--probe",
        NAMES[0],
        "--model",
        str(tmp_path / "no-model"),
        "--out",
        str(tmp_path / "file" / "o"),
    ]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.startswith("error: --out") and "is a file, not a folder" in err, err


@pytest.mark.parametrize("by", ["options", "spec file"])
def test_the_steering_spec_takes_shipped_names(by, tmp_path, capsys):
    """The spec group's --probe, steer's --other-probe and a spec file's probe read a shipped name: the
    run gets past every probe check to the prompts (a name not resolved stops at the probe)."""
    if by == "options":
        given = ["--probe", NAMES[0]]
    else:
        vp.SteeringSpec(probe=NAMES[0], unit="norm").save(tmp_path / "spec.json")
        given = ["--spec", str(tmp_path / "spec.json")]
    argv = [
        "steer",
        *given,
        "--other-probe",
        NAMES[1],
        "--prompts",
        str(tmp_path / "missing.jsonl"),
        "--model",
        str(tmp_path / "no-model"),
        "--out",
        str(tmp_path / "o"),
    ]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.startswith("error: --prompts") and "missing.jsonl" in err, err
    argv[argv.index(NAMES[1])] = "no-such-axis"
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "no-such-axis" in err and "--prompts" not in err, err


def test_nothing_is_written_inside_the_package(tmp_path):
    with pytest.raises(ValueprobeError, match="inside the installed valueprobe package"):
        check_output_dir(AXES_DIR / "mine", holds="probe")
    with pytest.raises(ValueprobeError, match="inside the installed valueprobe package"):
        check_output_file(PACKAGE_DIR / "report.html")
    assert check_output_dir(tmp_path / "mine", holds="probe") == tmp_path / "mine"


# ---- the real model: a name gives what the repo path gives -----------------------------------------


@pytest.mark.slow
def test_score_by_name_equals_score_by_repo_path(tmp_path, monkeypatch, capsys):
    by_path = tmp_path / "by-path"
    argv = ["score", "--bootstrap", "50", "--batch-size", "16"]
    repo = [
        *argv,
        "--probe",
        str(ROOT / "probes" / NAMES[1]),
        "--data",
        str(ROOT / "data" / "steer_refusal.jsonl"),
    ]
    assert run_cli([*repo, "--out", str(by_path)], capsys)[0] == 0
    monkeypatch.chdir(tmp_path)
    assert (
        run_cli([*argv, "--probe", NAMES[1], "--data", "steer_refusal", "--out", "by-name"], capsys)[0] == 0
    )
    assert (tmp_path / "by-name" / "scores.csv").read_text() == (by_path / "scores.csv").read_text()
