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
. "$(dirname "$0")/prepare.sh"
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
