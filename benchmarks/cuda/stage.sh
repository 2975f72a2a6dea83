#!/usr/bin/env bash
# Stages what the GPU tables (tables.sh) need into .gpu/, which git ignores, as pieces small
# enough for one device call each: the device machine reaches no registry and takes at most
# 64 MiB per call, and the built-in models' GGUF files alone are 98 MB (SmolLM2) and 250 MB
# (Gemma 3 270M). Run here, in the repository root, from the project's virtual environment
# (which holds both models' packages):
#
#   benchmarks/cuda/stage.sh /path/to/shared/data
#
# It writes .gpu/smollm2-NN and .gpu/gemma3-NN. Carry them in turn, at most 64 MiB a call, each
# call copying what it carried out of the way (the next call's carry replaces .gpu/ there; /tmp
# stays while the machine is warm, 30 s after a call):
#     mkdir -p /tmp/pieces && cp .gpu/* /tmp/pieces/
# then run tables.sh (which reads /tmp/pieces) in the call that carries the last piece.
# The captured step's check (issue 62) reads the same pieces: captured.sh instead of tables.sh.
set -euo pipefail
data=${1:?usage: stage.sh DATA_DIR (holding dolly_context_qa.jsonl and llma_msmarco_rag.jsonl)}
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qsx '/.gpu/' .git/info/exclude || echo '/.gpu/' >>.git/info/exclude
rm -rf .gpu && mkdir -p .gpu/stage/smollm2/whl .gpu/stage/smollm2/data .gpu/stage/gemma3
# The device's Python is 3.12 with torch and an older transformers; these are what it lacks
# (faiss: the benchmark command imports the retrieval layer).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_27_x86_64 --platform any -d .gpu/stage/smollm2/whl \
    transformers==5.24.0 gguf==0.19.0 sentencex==1.0.32 faiss-cpu==1.15.1
cp "$data/dolly_context_qa.jsonl" "$data/llma_msmarco_rag.jsonl" .gpu/stage/smollm2/data/
python3 - <<'PY'
from pathlib import Path
from rag_lookahead.models import BUILTIN_MODELS

Path(".gpu/stage/smollm2/model.gguf").symlink_to(BUILTIN_MODELS["SmolLM2-135M-Instruct"].gguf(Path(".gpu")))
BUILTIN_MODELS["gemma3-270m"].gguf(Path(".gpu/stage/gemma3"))  # assembled from its part packages
PY
for name in smollm2 gemma3; do
    tar -ch -C .gpu/stage "$name" | split -b 58m -d - ".gpu/$name-"
done
rm -rf .gpu/stage
ls -l .gpu
