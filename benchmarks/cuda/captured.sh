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
. "$(dirname "$0")/prepare.sh"
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
