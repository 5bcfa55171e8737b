#!/usr/bin/env bash
# One GPU session for issue 27, in one go (~8 min on one H200, no network):
#   1. the CUDA tests (tests/test_gpu.py, marked gpu) and the compiled-decoding tests;
#   2. benchmarks/gpu.py at the Qwen3-8B shape in bf16 (every row of the issue's table).
# Everything it prints is also written under $OUT (default runs/gpu-session/): env.txt,
# tests.txt, bench.txt, bench.json. Nothing is downloaded: the tokenizer comes from a saved
# folder (made here by `--prepare`, from the default model's cache) and the weights are random.
#
#   bash benchmarks/gpu_session.sh --prepare     # where the model cache is: save the tokenizer folder
#   bash benchmarks/gpu_session.sh               # on the GPU machine (carry runs/tokenizer-smollm2)
#   bash benchmarks/gpu_session.sh --device cpu --shape tiny --dtype float32 --scale 0.1 --repeats 1 --loop-rows 2
#                                                # a dry run on a CPU: the gpu tests skip, the benchmark runs small
#
# Arguments after the options are handed to benchmarks/gpu.py (they replace its GPU defaults).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-session}
TOKENIZER=${TOKENIZER:-runs/tokenizer-smollm2}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}

if [ "${1:-}" = "--prepare" ]; then
    "$PY" - "$TOKENIZER" <<'EOF'
import sys
from valueprobe.model.load import load
load("smollm2-135m").tokenizer.save_pretrained(sys.argv[1])
print(f"saved the default model's tokenizer to {sys.argv[1]}")
EOF
    exit $?
fi

mkdir -p "$OUT"
start=$(date +%s)
{
    echo "date: $(date -u)"
    echo "load average: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4
    fi
    "$PY" - <<'EOF'
import importlib, sys
import torch, transformers
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
print(f"cuda available: {torch.cuda.is_available()}", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
missing = []
# what the tests and the benchmark import (the CLI, for tests/test_steer.py's helpers), one by one
for name in ("pytest", "valueprobe.cli.main", "valueprobe.guided.run", "valueprobe.steering.decode.rows",
             "valueprobe.activations.store", "valueprobe.serve.app"):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing.append(f"{exc.name} (for {name})")
print("missing modules:", ", ".join(missing) or "none")
EOF
} 2>&1 | tee "$OUT/env.txt"
if ! grep -q "missing modules: none" "$OUT/env.txt"; then
    echo "error: $(grep 'missing modules' "$OUT/env.txt" | head -1): install them (pip install --no-index --find-links <wheels> ...) and rerun" >&2
    exit 2
fi
if [ ! -f "$TOKENIZER/tokenizer.json" ] && [ ! -f "$TOKENIZER/tokenizer_config.json" ]; then
    echo "error: no tokenizer folder at $TOKENIZER: run 'bash benchmarks/gpu_session.sh --prepare' where the model cache is, and carry it" >&2
    exit 2
fi

# 1. the CUDA tests and the compiled-decoding tests (each runs its own timeout: the benchmark gets its turn)
timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_compiled.py \
    2>&1 | tee "$OUT/tests.txt"
echo "tests: exit ${PIPESTATUS[0]} after $(($(date +%s) - start)) s" | tee -a "$OUT/tests.txt"

# 2. the benchmark: its GPU defaults, or the arguments given
timeout 330 "$PY" benchmarks/gpu.py --tokenizer "$TOKENIZER" --out "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.txt"
status=${PIPESTATUS[0]}
echo "benchmark: exit $status; session $(($(date +%s) - start)) s; load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" \
    | tee -a "$OUT/bench.txt"
exit "$status"
