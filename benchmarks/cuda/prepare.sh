# Sourced by tables.sh and captured.sh with $name set (smollm2|gemma3): unpacks the pieces
# stage.sh wrote in .gpu/ (carried one call at a time, kept in /tmp/pieces there), installs
# the carried wheels where the machine's transformers is older, and converts the model; sets
# $out, $work, $python, $builtin, $dtype and $model.
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
    "$python" -c 'import sys; from pathlib import Path; from rag_lookahead.models import convert_gguf
convert_gguf(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], progress=True)' "$work/$name/model.gguf" "$model" "$builtin"
fi
