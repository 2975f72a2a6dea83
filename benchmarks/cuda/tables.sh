#!/usr/bin/env bash
# The throughput issue's GPU tables for one built-in model, on the device machine (or, for a
# dry run, here): single stream (greedy, prompt lookup, lookahead) and 8 clients (serialised
# against batched), each answer checked against greedy `generate`, and for any that differ the
# position and generate's logit margin where it leaves greedy's (the JSON's `divergences`).
#
#   benchmarks/cuda/tables.sh smollm2|gemma3 [DEVICE [LIMIT [SETS]]]
#
# DEVICE defaults to cuda, LIMIT (questions per set) to 8, SETS to "dolly_context_qa
# llma_msmarco_rag". SmolLM2 runs in fp32, Gemma 3 270M in bf16. Needs the pieces stage.sh
# wrote in .gpu/, carried one call at a time and kept in /tmp/pieces there (stage.sh says how;
# the smollm2 pieces hold the wheels and the data for both models). JSON goes to
# $OUT (the device tool's; four files per model), else /tmp/gpu-out; the tables to the output.
set -euo pipefail
name=${1:?usage: tables.sh smollm2|gemma3 [DEVICE [LIMIT [SETS]]]}
device=${2:-cuda}
limit=${3:-8}
sets=${4:-dolly_context_qa llma_msmarco_rag}
out=${OUT:-/tmp/gpu-out}
work=/tmp/gpu
mkdir -p "$work" "$out"
# A call's carried pieces replace .gpu/ there: each earlier call copied its own to /tmp/pieces.
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
    # The GGUF file came without its pip package, so it is converted as the package's would be.
    "$python" - "$builtin" "$work/$name/model.gguf" "$model" <<'PY'
import sys
from pathlib import Path

from rag_lookahead.models import BUILTIN_MODELS, _convert_gguf
from rag_lookahead.progress import progress_bar

with progress_bar(False, "converting", total=3, unit="step") as bar:
    _convert_gguf(Path(sys.argv[2]), Path(sys.argv[3]), BUILTIN_MODELS[sys.argv[1]], bar)
PY
fi
"$python" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'
for set in $sets; do
    echo "== $(date +%T) $name $set"
    common=(--data "$work/smollm2/data/$set.jsonl" --limit "$limit" --max-new-tokens 128
        --model "$model" --device "$device" --dtype "$dtype")
    "$python" -m rag_lookahead bench "${common[@]}" --methods greedy,prompt_lookup,lookahead \
        --json "$out/$device-$name-$set.json"
    "$python" -m rag_lookahead bench "${common[@]}" --concurrency 8 --methods serialised,batched \
        --json "$out/$device-$name-$set-8clients.json"
done
