"""Stages whose results are cached by their inputs: a re-run reuses them, an interrupted run resumes.

    cache = StageCache(Path("runs/demo/stages"))
    sweep = cache.run("fit", {"data": data_key, "splits": 5}, lambda: fit(...).to_dict())

A stage's result is a JSON object saved (atomically) as ``FOLDER/NAME.json`` with the sha256 key
of its inputs. The next run with the same inputs reads it back instead of running; any change
in the inputs (a parameter, an upstream stage's key, the valueprobe version) runs it again. A run
killed mid-stage leaves no file for that stage, so it reruns from its start (stages that stream
to disk, like capture, resume inside themselves too).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from valueprobe.files import write_json
from valueprobe.version import __version__

__all__ = ["StageCache", "stage_key"]


def stage_key(name: str, inputs: dict) -> str:
    """sha256 of the stage name, its inputs (JSON, sorted keys) and the valueprobe version."""
    blob = json.dumps({"stage": name, "inputs": inputs, "version": __version__}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class StageCache:
    """Runs named stages once per distinct input; ``ran`` / ``reused`` list what happened."""

    folder: Path
    console: Console = field(default_factory=Console)
    ran: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)

    def run(self, name: str, inputs: dict, fn: Callable[[], dict], *, label: str = "") -> dict:
        """The cached result of stage ``name`` for ``inputs``, running ``fn()`` only if absent."""
        key = stage_key(name, inputs)
        self.keys[name] = key
        path = self.folder / f"{name}.json"
        if path.is_file():
            try:
                saved = json.loads(path.read_text())
            except json.JSONDecodeError:
                saved = {}
            if saved.get("key") == key:
                self.reused.append(name)
                self.console.print(f"[green]✓[/green] {name}: reused ({label or 'cached'}, {path})")
                return saved["result"]
        self.console.print(f"[bold]▶ {name}[/bold]{': ' + label if label else ''}")
        t0 = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - t0
        self.folder.mkdir(parents=True, exist_ok=True)
        payload = {"key": key, "inputs": inputs, "seconds": seconds, "result": result}
        write_json(path, payload, indent=1, default=float)
        self.ran.append(name)
        self.console.print(f"[green]✓[/green] {name}: {seconds:.1f}s")
        return result
