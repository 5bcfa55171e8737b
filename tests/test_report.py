"""The report: every section read from saved JSON as its record and drawn, absent or unreadable ones noted,
plotly inlined once, bad input one line."""

from __future__ import annotations

import json
import re

import pytest
from report_data import all_sections, matched_control_record, sweep_record

from valueprobe.cli.main import main
from valueprobe.errors import ValueprobeError
from valueprobe.report.page import RESULTS_FILE, SECTIONS, Results, load_results, render_report, write_report
from valueprobe.report.plots import sweep_figure


def test_every_section_drawn_and_plotly_inlined_once(tmp_path):
    results = Results.from_dict(all_sections())
    assert not results.unreadable and set(results.sections) == {s.key for s in SECTIONS}
    page = render_report(results)
    for sec in SECTIONS:
        assert sec.title.replace("'", "&#x27;") in page
    # 10 section figures + the shift pair + the trace's token strip (HTML, not a figure), and 9 of the
    # three attribution sections (heads, MLPs, then the ablation, or the residual grid of patching), CAA's,
    # and the audit's 3 (the 2×2's effects and cells, the lens's effects)
    assert len(re.findall(r'class="plotly-graph-div"', page)) == 24
    assert page.count("plotly.js v") == 1  # the library's own banner: inlined exactly once
    assert not re.search(r'src="https?://', page), "a script or image would be fetched from the network"
    assert "Not in this run" not in page
    # token text is escaped, and coloured by its value (the -1.5 σ token is blue)
    assert "&lt;there&gt;" in page and 'rgba(69,117,180,0.56)" title="-1.50 σ"' in page
    # captions carry the measured figure and its control
    assert "0.750 ± 0.020" in page and "embed" in page


def test_absent_sections_are_noted_not_faked(tmp_path):
    results = all_sections()
    for key in ("steer", "shift", "trace"):
        del results["sections"][key]
    results["missing"] = {"steer": "steering is not available in this build"}
    page = render_report(Results.from_dict(results))
    assert "Not in this run" in page
    assert "steering is not available in this build" in page
    assert "`valueprobe demo` or `valueprobe shift` writes them" in page
    assert len(re.findall(r'class="plotly-graph-div"', page)) == 20


def test_load_results_from_results_json_and_from_probe(tmp_path):
    (tmp_path / RESULTS_FILE).write_text(json.dumps(all_sections()))
    assert load_results(tmp_path) == Results.from_dict(all_sections())
    assert set(load_results(tmp_path).sections) >= {"sweep", "steer", "shift"}
    probe = tmp_path / "probe"
    probe.mkdir()
    mc = matched_control_record()
    (probe / "probe.json").write_text(
        json.dumps({"model_id": "m", "metrics": {"icrl_matched_control": mc.to_dict()}})
    )
    assert load_results(probe).sections == {"matched_control": mc}


def test_report_draws_the_sweep_with_the_plots_function():
    """One figure function: the report's sweep figure is sweep_figure of the record read from JSON."""
    d = json.loads(json.dumps(all_sections()))["sections"]["sweep"]
    (section,) = [s for s in SECTIONS if s.title.startswith("Where the value axis lives")]
    (drawn,) = section.draw(Results.from_dict({"sections": {"sweep": d}}).sections["sweep"])
    assert drawn.to_json() == sweep_figure(sweep_record()).to_json()


def test_unreadable_section_is_noted_not_drawn():
    results = all_sections()
    results["sections"]["matched_control"] = {"layer": 1}  # a partial record
    read = Results.from_dict(results)
    assert "matched_control" not in read.sections and "post_vs_pre_main" in read.unreadable["matched_control"]
    page = render_report(read)
    assert "Matched control: same text, different history</b>: results unreadable" in page
    assert len(re.findall(r'class="plotly-graph-div"', page)) == 23


@pytest.mark.parametrize("content", [None, "{not json", '{"sections": 3}'])
def test_folder_without_results_is_one_line(tmp_path, content):
    if content is not None:
        (tmp_path / RESULTS_FILE).write_text(content)
    with pytest.raises(ValueprobeError) as exc:
        load_results(tmp_path)
    assert "\n" not in str(exc.value)


def test_cli_report(tmp_path, capsys):
    (tmp_path / RESULTS_FILE).write_text(json.dumps(all_sections()))
    main(["report", "--from", str(tmp_path)])
    assert (tmp_path / "report.html").stat().st_size > 1_000_000  # plotly.js is in the file
    with pytest.raises(SystemExit) as exc:
        main(["report", "--from", str(tmp_path / "nowhere")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "valueprobe demo" in err


def test_unwritable_out_is_one_line(tmp_path, capsys):
    (tmp_path / RESULTS_FILE).write_text(json.dumps(all_sections()))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["report", "--from", str(tmp_path), "--out", str(blocker / "report.html")])
    assert exc.value.code == 2
    assert "\n" not in capsys.readouterr().err.strip()


def test_write_report_is_atomic(tmp_path, monkeypatch):
    path = write_report(Results.from_dict(all_sections()), tmp_path / "r.html")
    assert path.read_text().startswith("<!DOCTYPE html>")
    assert not list(tmp_path.glob("*.tmp"))
    old = path.read_bytes()

    # A render that raises: the page already there keeps its bytes, and no temporary file is left.
    def broken(*args, **kwargs):
        raise RuntimeError("render failed")

    with monkeypatch.context() as m:
        m.setattr("valueprobe.report.page.render_report", broken)
        with pytest.raises(RuntimeError, match="render failed"):
            write_report(Results.from_dict(all_sections()), path)
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]

    # A write that fails after the render (a lone surrogate in the title cannot be encoded as
    # UTF-8): still the old bytes, still no temporary file.
    with pytest.raises(UnicodeEncodeError):
        write_report(Results.from_dict(all_sections()), path, title="\ud800")
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]
