"""The page a result writes beside its files, by the result's type: what ``valueprobe merge`` draws.

    >>> write_view(merge("runs/steer", parts), Path("runs/steer"))      # runs/steer/dose.html

A merged run is the folder one process writes, its page included: a sweep's ``dose.html``, a
shift's ``shift.html``, an attribution's ``attribution.html``. The merge itself happens below
``report/`` (`valueprobe.sharded`), so the page is drawn here, after it, from the result the join
returns. A kind of part whose result has a page adds it to `VIEWS`; a result without one (a
store, scores) writes none.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from valueprobe.attribute.records import Attribution
from valueprobe.files import write_html
from valueprobe.report.attribution import write_attribution_html
from valueprobe.report.effects import dose_response_figure
from valueprobe.report.plots import shift_figure
from valueprobe.steering.experiment.dose import SteerSweep
from valueprobe.tune.shift_records import ShiftResult

__all__ = ["VIEWS", "write_view"]

# result type -> (its page's file name, what writes it there)
VIEWS: dict[type, tuple[str, Callable[[Any, Path], Path]]] = {
    SteerSweep: ("dose.html", lambda res, path: write_html(dose_response_figure(res), path)),
    ShiftResult: ("shift.html", lambda res, path: write_html(shift_figure(res), path)),
    Attribution: ("attribution.html", write_attribution_html),
}


def write_view(result: object, out: Path) -> Path | None:
    """Write ``result``'s page into the folder ``out``; None when its type has none."""
    view = VIEWS.get(type(result))
    if view is None:
        return None
    name, write = view
    return write(result, out / name)
