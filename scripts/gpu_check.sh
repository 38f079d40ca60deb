#!/usr/bin/env bash
# The CUDA checks on a lent GPU machine, in two calls of at most about 4 minutes each (docs/gpu.md).
#
#   bash scripts/gpu_check.sh 1     # first call: the open questions, most important first
#   bash scripts/gpu_check.sh 2     # second call: bf16 / int4 generation, the kernel choice, prefill, decode
#
# From the repository root; no install: it runs with what the machine has (torch, transformers, onnx) and
# onnxruntime-gpu unpacked from the parts ../shared/gpu/stage-ort-gpu staged in /tmp/parts (each call
# unpacks them once into /tmp/ortgpu, kept while the machine stays warm). It prints the versions it ran with.
# Every step has a timeout and leaves its file under $OUT (at most 8 a call), so a call cut short still
# answers what came before. Rehearsed on the CPU under that machine's versions (scripts/gpu_mirror.sh): every
# step reaches its CUDA call and fails there only for want of a GPU.
#
# Call 1: versions.txt (and whether the CUDA provider works, use_tf32 as the session reads it back);
#         gqa-probe.txt (what the CUDA GroupQueryAttention kernel accepts: total_sequence_length against the
#         bias's last axis, a shared or separate cache buffer, fp32, sinks and smooth softmax with a bias);
#         cuda-tests.log (the CUDA-marked parity tests at fp32 tolerances, use_tf32 off: a sample);
#         generate.txt + lm-cuda.json (whole-model generation on CUDA in fp16, packed rows, without and with
#         the decode step captured as a CUDA graph, against transformers' generate on the same GPU: the
#         156M-parameter random LLaMA, B 1, 64 new tokens, prompts 128 and 1024).
# Call 2: generate-more.txt + lm-cuda.json (fp32, bf16 and int4 weights, prompt 128 and 1024); batch.txt +
#         batch-cuda.json (the server's continuous batching of call 1's fp16 export, each answer against the
#         request alone, tok/s, without and with CUDA graphs: scripts/gpu_batch.py); kernels.txt (which
#         attention kernel each lowering ran: ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO); prefill.md (fp16,
#         T 2048..16384 against eager SDPA); decode.md (fp16 per-token decode of the llama-3-8b block).
set -uo pipefail
cd "$(dirname "$0")/.."
phase=${1:-}
case "$phase" in 1 | 2) ;; *) echo "usage: bash scripts/gpu_check.sh 1|2   (two calls of about 4 minutes each: docs/gpu.md)" >&2; exit 2 ;; esac
# Each step runs under `timeout`, in a process group of its own, which a terminal's Ctrl-C does not reach: to
# stop a rehearsal early, kill the step too (`pkill -TERM -f "^timeout [0-9]+ "`), or let its timeout end it
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
py=${PY:-python3}
# every step's timeout times this (a whole number): 1 on the GPU machine; a rehearsal on a slower CPU raises it
scale=${GPU_CHECK_TIMEOUT_SCALE:-1}
case "$scale" in '' | *[!0-9]* | 0) echo "GPU_CHECK_TIMEOUT_SCALE=$scale: give a whole number >= 1" >&2; exit 2 ;; esac
status=0
step() { echo "== $*"; }
# a step's exit status, said when not 0 (124: its timeout), so a log tells a cut-short step from a failed one
ended() { [ "$1" = 0 ] || { status=1; [ "$1" = 124 ] && echo "-- step ended: timed out" || echo "-- step ended: exit $1"; }; }

# onnxruntime-gpu from the staged parts (../shared/gpu/README.md), once per warm machine
if [ -d /tmp/parts ] && [ ! -d /tmp/ortgpu/onnxruntime ]; then
    step "unpacking onnxruntime-gpu from /tmp/parts"
    cat /tmp/parts/p[0-3] > /tmp/ort.tar.xz \
        && (cd /tmp && echo "$(cat /tmp/parts/SUM)  /tmp/ort.tar.xz" | sha256sum -c -) \
        && mkdir -p /tmp/ortgpu && tar -xJf /tmp/ort.tar.xz -C /tmp/ortgpu && rm -f /tmp/ort.tar.xz \
        || echo "the staged parts did not unpack: running with the machine's own onnxruntime"
fi
[ -d /tmp/ortgpu/onnxruntime ] && export PYTHONPATH="/tmp/ortgpu${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1

if [ "$phase" = 1 ]; then
    step "1. versions, and whether ONNX Runtime's CUDA provider works (use_tf32 as a session reads it back)"
    timeout $((60 * scale)) $py - <<'PY' 2>&1 | tee "$OUT/versions.txt"
import onnx, onnxruntime as ort, onnxscript, transformers
try:
    import torch  # also what lets ONNX Runtime find CUDA and cuDNN (the nvidia-* packages beside it)
    print(f"torch {torch.__version__} (cuda {torch.version.cuda}),", end=" ")
    print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible to torch")
except ImportError:
    print("no torch")
print(f"transformers {transformers.__version__}, onnx {onnx.__version__}, onnxscript {onnxscript.__version__}, "
      f"onnxruntime {ort.__version__} ({ort.get_device()}) from {ort.__file__}")
print("available providers:", ort.get_available_providers())
from runtime.session import cuda_status
ok, why = cuda_status()
print("ORT CUDA:", (ok, why))
if ok:
    import numpy as np
    from export import export_onnx
    import zoo, tempfile, os
    path = os.path.join(tempfile.mkdtemp(), "tb.onnx")
    export_onnx(zoo.create("transformer-base"), path)
    from runtime.session import OnnxSession
    for tf32 in (False, True):
        s = OnnxSession(path, provider="cuda", verbose=False, tf32=tf32)
        print(f"tf32={tf32}: use_tf32 read back =", s.session.get_provider_options()["CUDAExecutionProvider"]["use_tf32"])
PY
    ended "${PIPESTATUS[0]}"

    step "2. what the CUDA GroupQueryAttention kernel accepts (the rule behind 'got 9')"
    timeout $((60 * scale)) $py scripts/gqa_probe.py --provider cuda 2>&1 | tee "$OUT/gqa-probe.txt" | tail -12
    ended "${PIPESTATUS[0]}"

    step "3. CUDA-marked parity tests at fp32 tolerances (use_tf32 off), a sample of the matrix"
    timeout $((100 * scale)) $py -m pytest -m cuda -q -p no:cacheprovider -n 8 -rf \
        tests/export/test_session.py tests/export/test_parity.py -k "session or llama or gemma or transformer-base or gpt-oss" \
        2>&1 | tee "$OUT/cuda-tests.log" | tail -12
    ended "${PIPESTATUS[0]}"

    step "4. whole-model generation on CUDA, fp16, without and with a CUDA graph, against transformers (prompts 128, 1024)"
    PROVIDER=cuda SHAPE=${GPU_CHECK_SHAPE:-mid} PROMPTS=128,1024 NEW=64 OUT="$OUT" EXPORTS=float16:fp32 GRAPHS=off,on \
        CACHES=dynamic,static GUARD=60 timeout $((170 * scale)) $py scripts/gpu_lm.py 2>&1 | tee "$OUT/generate.txt" | tail -12
    ended "${PIPESTATUS[0]}"
else
    step "5. whole-model generation on CUDA in fp32, bf16 and with int4 weights (prompts 128 and 1024)"
    PROVIDER=cuda SHAPE=${GPU_CHECK_SHAPE:-mid} PROMPTS=128,1024 NEW=64 OUT="$OUT" EXPORTS=float32:fp32,bfloat16:fp32,float16:int4 \
        GRAPHS=off,on CACHES=dynamic GUARD=40 timeout $((110 * scale)) $py scripts/gpu_lm.py 2>&1 | tee "$OUT/generate-more.txt" | tail -12
    ended "${PIPESTATUS[0]}"

    step "6. the server's continuous batching over packed rows on CUDA (rows bound by pointer), fp16, without and with CUDA graphs"
    PROVIDER=cuda OUT="$OUT" EXPORT=/tmp/lmgpu-float16-fp32.onnx timeout $((45 * scale)) $py scripts/gpu_batch.py 2>&1 \
        | tee "$OUT/batch.txt" | tail -6
    ended "${PIPESTATUS[0]}"

    step "7. which attention kernel each lowering ran (fp16, T 4096)"
    : > "$OUT/kernels.txt"
    for lw in ort-mha onnx-attention; do
        f="/tmp/tb-$lw.onnx"
        timeout $((40 * scale)) $py -m cli export transformer-base -o "$f" --lowering "$lw" --dtype float16 --force >/dev/null 2>&1 \
            && ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1 timeout $((30 * scale)) $py -m cli run "$f" --provider cuda --batch 1 \
                --seq 4096 --steps 3 --placement 2>&1 | grep -E "SdpaKernel|ONNX Attention|AttentionKernelOptions|placement|latency|Error|error:" \
                | sort | uniq -c | sed "s/^/[$lw] /" >> "$OUT/kernels.txt"
    done
    cat "$OUT/kernels.txt"

    step "8. prefill on CUDA, fp16, against eager SDPA"
    timeout $((60 * scale)) $py scripts/bench.py transformer-base --provider cuda --dtype float16 --batch 1 --seq 2048,4096,16384 \
        --paths eager-sdpa,ort-mha --budget 1 2>&1 | tee "$OUT/prefill.md" | tail -8

    step "9. per-token decode on CUDA, fp16, the llama-3-8b block at past 4096"
    timeout $((60 * scale)) $py scripts/bench.py llama-3-8b --decode --provider cuda --dtype float16 --batch 1 --past 4096 \
        --budget 1 2>&1 | tee "$OUT/decode.md" | tail -8
fi
step "summary (call $phase)"
grep -hE "ORT CUDA|use_tf32|passed|failed|tok/s|refused|ran;" "$OUT"/*.txt "$OUT"/*.log 2>/dev/null | head -40
exit $status
