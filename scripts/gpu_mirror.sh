#!/usr/bin/env bash
# Rehearse scripts/gpu_check.sh on this CPU under the lent GPU machine's own versions (docs/gpu.md, "Rehearsing
# the check under the GPU machine's versions"): our CI pins newer torch and transformers, so only this shows
# that the check's steps still import and run under what that machine has. Not part of CI (it downloads torch's
# CUDA build, about 4.6 GB installed).
#
#   bash scripts/gpu_mirror.sh                          # build the environment if absent, then calls 1 and 2
#   GPU_CHECK_SHAPE=small bash scripts/gpu_mirror.sh     # the check's own knobs pass through
#   MIRROR=/elsewhere bash scripts/gpu_mirror.sh         # the environment's folder (default /work/venvs/gpumirror)
#   GPU_CHECK_TIMEOUT_SCALE=1 bash scripts/gpu_mirror.sh # the check's timeouts as on the GPU machine (default 3x)
#
# Each call runs with OUT in a fresh /tmp folder, its output beside it in OUT.log (not inside: the check keeps
# OUT to its own files). Without a GPU every step must stop at its CUDA call for want of a GPU and for nothing
# else: the script lists any error line that does not say so, and any step that ran past its timeout here, and
# exits 1 if there was such an error.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${MIRROR:-/work/venvs/gpumirror}
# What the GPU machine has (../shared/gpu/README.md): Python 3.12.3 and these. numpy 2.5 needs Python 3.12: on an
# older Python the newest numpy it takes stands in. onnxruntime's CPU build stands in for onnxruntime-gpu 1.31.1,
# which the check unpacks there from staged parts.
pins=(torch==2.11.0 transformers==5.17.0 onnx==1.23.1 onnxscript==0.7.2 onnx-ir==1.0.0 einops==0.8.2
    safetensors tokenizers pytest==9.1.1 pytest-xdist hypothesis matplotlib onnxruntime==1.31.1)

if [ ! -e "$venv" ]; then
    host=$(command -v python3.12 || command -v python3)
    numpy=numpy==2.5.2
    "$host" -c 'import sys; sys.exit(sys.version_info < (3, 12))' || numpy=numpy==2.4.6
    echo "building $venv with $("$host" --version) and ${pins[*]} $numpy"
    "$host" -m venv "$venv" || exit 2
    "$venv/bin/python" -m pip install -q "${pins[@]}" "$numpy" || { rm -rf "$venv"; exit 2; }
elif [ ! -x "$venv/bin/python" ]; then
    echo "$venv exists but holds no environment (no bin/python): remove it or set MIRROR" >&2
    exit 2
fi

# The check's timeouts fit the GPU machine's 16 cores; here they are longer, so that a step cut short by a slow
# CPU does not hide what comes after its CUDA call.
export GPU_CHECK_TIMEOUT_SCALE=${GPU_CHECK_TIMEOUT_SCALE:-3}
# Lines that name the only acceptable reason to fail here: no GPU (torch's, ONNX Runtime's or the CLI's words)
no_gpu='no CUDA provider|CUDA provider (is installed but )?could not start|CUDA session failed to start|'
no_gpu+='no working CUDA provider|Found no NVIDIA driver|Torch not compiled with CUDA'
status=0
for call in 1 2; do
    out=$(mktemp -d /tmp/gpu-mirror-$call.XXXXXX)
    echo "== call $call under $venv ($("$venv/bin/python" --version)), OUT=$out"
    start=$SECONDS
    OUT=$out PY=$venv/bin/python bash scripts/gpu_check.sh "$call" > "$out.log" 2>&1
    rc=$?
    grep -E "^== [0-9]|^-- step ended" "$out.log"
    echo "== call $call: exit $rc after $((SECONDS - start)) s (on a CPU a failed CUDA step exits 1)"
    logs=("$out.log" "$out"/*.log "$out"/*.txt "$out"/*.md)
    other=$(grep -hE "Error:|Exception:|error:" "${logs[@]}" 2>/dev/null | grep -vE "$no_gpu" | sort -u)
    slow=$(grep -hE "step ended: timed out|: rc 124 " "${logs[@]}" 2>/dev/null | sort -u)
    if [ -n "$slow" ]; then
        echo "ran past a timeout here (a loaded CPU may; the GPU machine has 16 cores):"
        echo "$slow"
    fi
    if [ -n "$other" ]; then
        echo "failed for a reason other than the missing GPU:"
        echo "$other"
        status=1
    else
        echo "every failure was for want of a GPU"
    fi
done
exit $status
