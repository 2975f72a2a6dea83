#!/usr/bin/env bash
# Issue 62's GPU check, one short call on the device machine, in parts, each writing its files
# before the next (slower) one begins:
#   tests      the CUDA cases of tests/test_static_step.py (tiny models, seconds)
#   step       the engine on its captured step (benchmarks/captured_engine.py): greedy
#              `generate`, the engine plain and with lookahead, 8 clients against the same
#              engine serialised; capture seconds, slot memory, ms per step by bucket
#   baselines  (same process, after step) transformers' compiled static-cache greedy
#              (compiling is most of this part's time) and today's eager engine, plain and
#              with lookahead, then the issue's targets against them
#
#   benchmarks/cuda/captured.sh [smollm2|gemma3 [LIMIT [SETS [PARTS]]]]
#
# smollm2 (the default) runs in fp32, gemma3 in bf16; LIMIT records per set single stream
# (default 4; the clients take 8), 128 new tokens; SETS default "dolly_context_qa
# llma_msmarco_rag"; PARTS default "tests step baselines". Needs the pieces stage.sh wrote in
# .gpu/, carried and kept in /tmp/pieces there as for tables.sh (the smollm2 pieces hold the
# wheels and data). To $OUT (the device tool's), else /tmp/gpu-out: captured-engine-NAME.json
# (rewritten after each set), captured-log-NAME.txt, captured-tests-NAME.txt. Sized to end
# within nine minutes for SmolLM2 (not yet timed there; give the call timeout_s 600): where
# it runs long, run the part step alone first (its JSON is what the issue asks for most).
set -euo pipefail
name=${1:-smollm2}
limit=${2:-4}
sets=${3:-dolly_context_qa llma_msmarco_rag}
parts=${4:-tests step baselines}
. "$(dirname "$0")/prepare.sh"
has() { [[ " $parts " == *" $1 "* ]]; }
log=$out/captured-log-$name.txt
"$python" -c 'import torch, transformers; print(torch.__version__, transformers.__version__,
    torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")' | tee "$log"
# A failing test is written down and the timings still run; a hung one stops after two minutes.
if has tests && "$python" -c 'import pytest' 2>/dev/null; then
    timeout 120 "$python" -m pytest tests/test_static_step.py -q -k cuda -p no:cacheprovider 2>&1 |
        tee "$out/captured-tests-$name.txt" || true
fi
data=()
for set in $sets; do data+=("$work/smollm2/data/$set.jsonl"); done
stages=()
for stage in step baselines; do has $stage && stages+=("$stage"); done
if ((${#stages[@]})); then
    joined=$(IFS=, && echo "${stages[*]}")
    "$python" benchmarks/captured_engine.py --model "$model" --device cuda --dtype "$dtype" --limit "$limit" \
        --clients 8 --max-new-tokens 128 --step captured --stages "$joined" --data "${data[@]}" \
        --json "$out/captured-engine-$name.json" 2>&1 | tee -a "$log"
fi
