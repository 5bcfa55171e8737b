"""Byte-identity of a fixed set of outputs between two source trees: run them, then compare.

    git archive main | tar -x -C /tmp/main-src                     # the tree to compare against
    python tools/identity.py run --src /tmp/main-src --out /tmp/identity-main
    git archive HEAD | tar -x -C /tmp/branch-src                  # a snapshot: later edits stay out
    python tools/identity.py run --src /tmp/branch-src --out /tmp/identity-branch
    python tools/identity.py compare /tmp/identity-main /tmp/identity-branch

``run`` executes `CASES` in order with the ``valueprobe`` of ``--src`` (``PYTHONPATH``; the
interpreter and its libraries are this one's), one thread, ``PYTHONHASHSEED=0``, fixed seeds and
reduced sizes, offline. Every command runs in ``--out`` with relative paths, so two runs record
the same paths; what is left absolute is masked (``<OUT>``, and ``<SRC>`` for the source tree's
shipped axes and datasets). The tiny models are built here, by
this script, from seeded configs, so both trees read the same weights. ``--only`` runs the cases
whose name contains a word (a case needs the ones before it for its inputs: ``tiny`` first;
``steer`` also matches ``replicate-steer``).

``compare`` hashes every file under both folders (sha256) after masking what differs from run to
run by design: wall-clock fields (``seconds``, ``elapsed``... in JSON; the same columns in CSV)
and plotly's random div ids in HTML. It prints the files that differ, and which bytes, and exits
1 if any differs or is missing on one side.

Cases: ``tiny`` (models, data), then on a tiny llama a capture, score (with a null), steer (with
side effects), shift and attribution, each as one process and as parts merged by ``valueprobe
merge``; then on the default model (smollm2-135m, cached) ``demo --quick``, a reduced ``replicate
steer`` (with its evaluation), a reduced ``replicate guide`` and an ``attribute``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

MODEL = "smollm2-135m"
# Keys whose values are wall-clock readings (masked in JSON, and as columns of CSV).
CLOCK_KEYS = re.compile(r"(^|_)(seconds|elapsed|wall|wall_s|time_s|started|finished|timestamp|created)$")
PLOTLY_ID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TEXT = {".json", ".jsonl", ".csv", ".md", ".html", ".txt", ".log"}


# ---- running ----------------------------------------------------------------------------------


def env_for(src: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(src),
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "COLUMNS": "200",
    }


class Runner:
    """Runs ``valueprobe`` commands of one source tree in ``out``, logging each to ``out/logs``."""

    def __init__(self, src: Path, out: Path) -> None:
        self.src, self.out = src, out
        self.env = env_for(src)
        self.n = 0

    def vp(self, *argv: str) -> None:
        self.n += 1
        log = self.out / "logs" / f"{self.n:03d}-{argv[0]}.log"
        t0 = time.perf_counter()
        with log.open("w") as f:
            code = subprocess.run(
                [sys.executable, "-m", "valueprobe", *argv],
                cwd=self.out,
                env=self.env,
                stdout=f,
                stderr=subprocess.STDOUT,
            ).returncode
        print(f"  {time.perf_counter() - t0:7.1f} s  rc={code}  valueprobe {' '.join(argv)}", flush=True)
        if code != 0:
            print(log.read_text()[-3000:], file=sys.stderr)
            raise SystemExit(f"valueprobe {' '.join(argv)} failed (rc={code}); log: {log}")

    def python(self, code: str) -> None:
        subprocess.run([sys.executable, "-c", code], cwd=self.out, env=self.env, check=True)


def _head(src: Path, dst: Path, n: int) -> None:
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    dst.write_text("".join(lines[:n]), encoding="utf-8")


TINY = """
import copy, torch, transformers as tf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
corpus = ["The capital of France is Paris, and the capital of Italy is Rome.",
          "def add(a, b):\\n    return a + b\\n", "Wait, that's not right. Let me recompute: 12 * 7 = 84.",
          "Do you think your answer is correct? Yes. No.", "(A) yes (B) no. Answer: (A",
          "The quick brown fox jumps over the lazy dog - twice, maybe 3 times?"] * 4
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.post_processor = processors.ByteLevel(trim_offsets=True)
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = tf.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>", unk_token="<|endoftext|>")
fast.chat_template = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\\n{{ message['content'] }}"
                      "<|im_end|>\\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")
cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=2048, vocab_size=len(fast),
                     pad_token_id=0, bos_token_id=0, eos_token_id=0)
torch.manual_seed(0)
base = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
tuned = copy.deepcopy(base)
noise = torch.Generator().manual_seed(0)
with torch.no_grad():
    for p in tuned.parameters():
        p.add_(0.02 * torch.randn(p.shape, generator=noise, dtype=p.dtype))
for name, model in (("base", base), ("tuned", tuned)):
    model.save_pretrained(f"tiny/{name}")
    fast.save_pretrained(f"tiny/{name}")
"""


def case_tiny(r: Runner) -> None:
    """The tiny models and the data the tiny cases read (heads of the shipped sets)."""
    r.python(TINY)
    data = r.src / "data"
    (r.out / "d").mkdir()
    _head(data / "icrl.jsonl", r.out / "d" / "icrl.jsonl", 24)
    _head(data / "icrl_pairs.jsonl", r.out / "d" / "pairs.jsonl", 6)
    _head(data / "steer_confidence.jsonl", r.out / "d" / "steer_confidence.jsonl", 5)
    for name in ("neutral_text.jsonl", "task_arithmetic.jsonl", "task_code.jsonl", "steer_conditions.jsonl"):
        shutil.copy2(data / name, r.out / "d" / name)


def _sharded(r: Runner, argv: list[str], folder: str, n: int) -> None:
    """``argv --out folder/one``, then ``n`` parts (last first) and ``merge folder/merged``."""
    r.vp(*argv, "--out", f"{folder}/one")
    for i in reversed(range(n)):
        r.vp(*argv, "--out", f"{folder}/p{i}", "--shard", f"{i}/{n}")
    r.vp("merge", f"{folder}/merged", *(f"{folder}/p{i}" for i in range(n)))


TINY_MODEL = ["--model", "tiny/base"]


def case_capture(r: Runner) -> None:
    argv = ["capture", "--data", "d/icrl.jsonl", *TINY_MODEL, "--layers", "all", "--positions", "spans",
            "--examples-per-shard", "4", "--batch-size", "3", "--dtype", "float32"]  # fmt: skip
    _sharded(r, argv, "capture", 3)
    r.vp("fit", "--store", "capture/one", "--out", "probe", "--splits", "2")


def case_score(r: Runner) -> None:
    argv = ["score", "--probe", "probe", "--data", "d/icrl.jsonl", *TINY_MODEL, "--batch-size", "2",
            "--bootstrap", "50", "--null", "32"]  # fmt: skip
    _sharded(r, argv, "score", 3)


def case_steer(r: Runner) -> None:
    argv = ["steer", "--probe", "probe", "--prompts", "d/steer_confidence.jsonl", *TINY_MODEL,
            "--alphas=-2,0,2", "--max-new-tokens", "4", "--random-directions", "2", "--samples", "2",
            "--seed", "3", "--bootstrap", "50", "--chunk-prompts", "2", "--conditions", "none"]  # fmt: skip
    _sharded(r, argv, "steer", 2)
    r.vp(*argv, "--greedy", "--side-effects", "--out", "steer/side")


def case_shift(r: Runner) -> None:
    argv = ["shift", "--probe", "probe", "--base", "tiny/base", "--tuned", "tiny/tuned", "--data",
            "d/icrl.jsonl", "--targeted", "icrl/all_lowercase,icrl/contains_dash", "--bootstrap", "100", "--batch-size", "4"]  # fmt: skip
    _sharded(r, argv, "shift", 3)


def case_attribute(r: Runner) -> None:
    for method in ("direct", "patch"):
        argv = ["attribute", "--probe", "probe", "--data", "d/pairs.jsonl", *TINY_MODEL, "--method", method,
                "--positions", "spans", "--span-labels", "post", "--resid-layers", "all", "--batch-size", "2",
                "--bootstrap", "50", "--random", "8"]  # fmt: skip
        _sharded(r, argv, f"attribute-{method}", 2)


def case_demo(r: Runner) -> None:
    r.vp("demo", "--quick", "--out", "demo")


def case_replicate_steer(r: Runner) -> None:
    r.vp("replicate", "steer", "--out", "rsteer", "--runs", "rsteer-runs", "--prompts", "2",
         "--alphas=-15,0,15", "--random-directions", "2", "--tokens", "0.1", "--benchmarks",
         "confidence,length", "--conditions", "toward,reworded", "--batch-size", "8")  # fmt: skip


def case_replicate_guide(r: Runner) -> None:
    r.vp("replicate", "guide", "--out", "rguide", "--prompts", "2", "--samples", "2", "--max-new-tokens",
         "12", "--random-directions", "2", "--every", "4", "--alphas", "0,2", "--batch-size", "8")  # fmt: skip


def case_attribute_real(r: Runner) -> None:
    r.vp("attribute", "--probe", "smollm2-135m-value", "--data", "d/pairs.jsonl", "--method", "direct",
         "--positions", "spans", "--span-labels", "post", "--limit", "4", "--random", "8", "--bootstrap",
         "50", "--out", "attribute-real")  # fmt: skip


CASES: dict[str, Callable[[Runner], None]] = {
    "tiny": case_tiny,
    "capture": case_capture,
    "score": case_score,
    "steer": case_steer,
    "shift": case_shift,
    "attribute": case_attribute,
    "demo": case_demo,
    "replicate-steer": case_replicate_steer,
    "replicate-guide": case_replicate_guide,
    "attribute-real": case_attribute_real,
}


def run(src: Path, out: Path, only: list[str] | None) -> None:
    src, out = src.resolve(), out.resolve()
    if not (src / "valueprobe" / "__init__.py").is_file():
        raise SystemExit(f"--src {src} holds no valueprobe/ package")
    if only is None and out.exists():
        shutil.rmtree(out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    r = Runner(src, out)
    r.n = len(list((out / "logs").glob("*.log")))
    where = subprocess.run(
        [sys.executable, "-c", "import valueprobe; print(valueprobe.__file__)"],
        cwd=out,
        env=r.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(src):
        raise SystemExit(f"valueprobe imported from {where}, not from --src {src}")
    print(f"valueprobe from {where}")
    (out / "logs" / "src.txt").write_text(str(src))  # masked by compare: shipped paths lie under it
    for name, case in CASES.items():
        if only is not None and not any(word in name for word in only):
            continue
        print(f"[{name}]", flush=True)
        t0 = time.perf_counter()
        case(r)
        print(f"[{name}] {time.perf_counter() - t0:.0f} s", flush=True)


# ---- comparing --------------------------------------------------------------------------------


def _mask_json(value: object) -> object:
    if isinstance(value, dict):
        return {k: "<clock>" if CLOCK_KEYS.search(str(k)) else _mask_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_json(v) for v in value]
    return value


def _mask_table(text: str, sep: str) -> str:
    """Blank every column whose header is a wall-clock key (``sep`` separates the cells)."""
    lines = text.splitlines(keepends=True)
    if not lines:
        return text
    header = [h.strip() for h in lines[0].split(sep)]
    clock = [i for i, h in enumerate(header) if CLOCK_KEYS.search(h.lower().replace(" ", "_"))]
    if not clock:
        return text
    out = [lines[0]]
    for line in lines[1:]:
        cells = line.split(sep)
        for i in clock:
            if i < len(cells):
                cells[i] = "<clock>"
        out.append(sep.join(cells))
    return "".join(out)


def masked(path: Path, root: Path) -> bytes:
    """The bytes compared: ``root`` replaced by ``<OUT>`` and the source tree the run read (its
    shipped axes and datasets) by ``<SRC>``; clock fields and plotly ids masked."""
    data = path.read_bytes()
    if path.suffix not in TEXT:
        return data
    data = data.replace(str(root).encode(), b"<OUT>")
    src = root / "logs" / "src.txt"
    if src.is_file():
        data = data.replace(src.read_text().encode(), b"<SRC>")
    if path.suffix == ".html":
        return PLOTLY_ID.sub(b"<id>", data)
    if path.suffix == ".json":
        try:
            return json.dumps(_mask_json(json.loads(data)), sort_keys=False).encode()
        except ValueError:
            return data
    if path.suffix == ".jsonl":
        lines = []
        for line in data.decode().splitlines():
            try:
                lines.append(json.dumps(_mask_json(json.loads(line))))
            except ValueError:
                lines.append(line)
        return "\n".join(lines).encode()
    if path.suffix == ".csv":
        return _mask_table(data.decode(), ",").encode()
    return data


def files(root: Path) -> dict[str, Path]:
    skip = {"logs"}
    return {
        str(p.relative_to(root)): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in skip
    }


def _first_diff(a: bytes, b: bytes) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo = max(0, i - 60)
    return f"at byte {i}: {a[lo : i + 60]!r}\n      vs   {b[lo : i + 60]!r}"


def compare(a: Path, b: Path) -> int:
    a, b = a.resolve(), b.resolve()
    fa, fb = files(a), files(b)
    both = sorted(set(fa) & set(fb))
    raw_same = same = 0
    differ: list[str] = []
    for name in both:
        ra, rb = fa[name].read_bytes(), fb[name].read_bytes()
        if ra == rb:
            raw_same += 1
        ma, mb = masked(fa[name], a), masked(fb[name], b)
        if hashlib.sha256(ma).digest() == hashlib.sha256(mb).digest():
            same += 1
        else:
            differ.append(name)
            print(f"DIFFERS {name} {_first_diff(ma, mb)}")
    only_a, only_b = sorted(set(fa) - set(fb)), sorted(set(fb) - set(fa))
    for name in only_a:
        print(f"ONLY IN {a}: {name}")
    for name in only_b:
        print(f"ONLY IN {b}: {name}")
    print(
        f"\n{len(both)} files compared: {same} identical ({raw_same} byte for byte, {same - raw_same} after"
        f" masking clocks, plotly ids and the run folder), {len(differ)} differ; {len(only_a)} only in {a},"
        f" {len(only_b)} only in {b}"
    )
    return 1 if differ or only_a or only_b else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the fixed outputs with one source tree")
    r.add_argument("--src", type=Path, required=True, help="a source tree (holds valueprobe/ and data/)")
    r.add_argument("--out", type=Path, required=True, help="output folder (replaced unless --only)")
    r.add_argument("--only", nargs="+", help=f"cases whose name contains one of these: {', '.join(CASES)}")
    c = sub.add_parser("compare", help="compare two output folders")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    if args.command == "run":
        run(args.src, args.out, args.only)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
