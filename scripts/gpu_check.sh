#!/usr/bin/env bash
# The CUDA checks in one call on a GPU machine (see ../shared/gpu/README.md).
#
#   bash scripts/gpu_check.sh            # from the repository root; no install needed
#
# 1. versions and whether ONNX Runtime's CUDA provider really works;
# 2. the CUDA-marked tests (eager CUDA vs ORT CUDA, every variant x lowering, fp32 and fp16);
# 3. which provider each lowering's nodes actually ran on (a silent CPU fallback shows);
# 4. the benchmark on CUDA in fp16, up to T = 16384;
# 5. decode on CUDA: parity (a prompt then single tokens, ragged batch) for each decode lowering,
#    and the per-token benchmark of a LLaMA-style GQA block;
# 6. generation: models/tiny-stdlib-llama exported whole, 64 greedy tokens on CPU and on CUDA, compared;
# everything under $OUT (default ./gpu-out), a short table printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
py=python3
status=0

echo "== 1. versions"
$py - <<'PY' 2>&1 | tee "$OUT/versions.txt"
import torch, onnx, onnxruntime as ort, onnxscript
from runtime.session import cuda_status
print(f"torch {torch.__version__} (cuda {torch.version.cuda}), onnx {onnx.__version__}, "
      f"onnxscript {onnxscript.__version__}, onnxruntime {ort.__version__} ({ort.get_device()})")
print("available providers:", ort.get_available_providers())
print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible to torch")
print("ORT CUDA:", cuda_status())
PY

echo "== 2. CUDA-marked tests"
timeout 240 $py -m pytest -m cuda -q -p no:cacheprovider -n 8 tests/export/test_parity.py tests/export/test_session.py tests/export/test_decode.py \
  2>&1 | tee "$OUT/cuda-tests.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== 3. node placement per lowering (transformer-base, fp16)"
: > "$OUT/placement.txt"
for lw in decomposed onnx-attention ort-mha; do  # ort-gqa needs a causal block: in step 5
  f="$OUT/tb-$lw.onnx"
  timeout 120 $py -m cli export transformer-base -o "$f" --lowering "$lw" --dtype float16 --force >/dev/null \
    && timeout 60 $py -m cli run "$f" --provider cuda --batch 1 --seq 2048 --repeats 10 --placement \
       2>&1 | sed "s/^/[$lw] /" | tee -a "$OUT/placement.txt"
  rm -f "$f"
done

echo "== 4. benchmark on CUDA, fp16"
timeout 300 $py scripts/bench.py transformer-base --provider cuda --dtype float16 --batch 1 \
  --seq 1,16,512,2048,4096,8192,16384 --json "$OUT/bench-cuda.json" --plot "$OUT/bench-cuda.png" \
  2>"$OUT/bench-cuda.err" | tee "$OUT/bench-cuda.md"

echo "== 5. decode on CUDA, fp16 (llama-3-8b at 1024 wide: GQA + RoPE; gemma-2-9b adds window + softcap)"
: > "$OUT/decode-parity.md"
for name in llama-3-8b gemma-2-9b; do
  timeout 120 $py -m cli parity "$name" --decode --provider cuda --dtype float16 -q \
    --set d_model=1024 --set heads=8 --set kv_heads=2 --set d_k=128 2>&1 | tee -a "$OUT/decode-parity.md" | tail -8
done
timeout 300 $py scripts/bench.py llama-3-8b --decode --provider cuda --dtype float16 --batch 1,8 \
  --past 128,1024,4096,16384 --json "$OUT/bench-decode-cuda.json" 2>"$OUT/bench-decode-cuda.err" \
  | tee "$OUT/bench-decode-cuda.md"

echo "== 6. generation on CUDA: the shipped checkpoint exported whole, the same greedy tokens as on the CPU"
for prov in cpu cuda; do
  timeout 300 $py -m cli generate models/tiny-stdlib-llama --prompt "def main(" --max-new-tokens 64 \
    --provider "$prov" --json "$OUT/generate-$prov.json" 2>&1 | tee "$OUT/generate-$prov.txt" | tail -2
done
$py - "$OUT" <<'PY' 2>&1 | tee "$OUT/generate-compare.txt"
import json, sys
cpu, cuda = (json.load(open(f"{sys.argv[1]}/generate-{p}.json")) for p in ("cpu", "cuda"))
same = cpu["tokens"] == cuda["tokens"]
print(f"generation: CUDA tokens {'equal' if same else 'DIFFER from'} the CPU's; "
      f"{cuda['timings']['tokens_per_s']:.1f} tok/s on {cuda['provider']} vs {cpu['timings']['tokens_per_s']:.1f} on cpu")
sys.exit(0 if same else 1)
PY
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== summary"
grep -E "ORT CUDA" "$OUT/versions.txt"
tail -1 "$OUT/cuda-tests.log"
cat "$OUT/generate-compare.txt"
grep -E "placement|latency" "$OUT/placement.txt"
exit $status
