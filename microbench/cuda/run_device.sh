#!/usr/bin/env bash
# The GPU checks of docs/PERFORMANCE.md ("GPU"), on a machine with a CUDA GPU. Logs and tables go to ${OUT}.
#   1. test_unit_cuda: every CUDA kernel and the GPU model against the CPU ones (they skip without a GPU).
#   2. trident train on cpu and on cuda, same config (float32): the loss sequences; the CUDA run's checkpoint
#      evaluated, sampled (greedy) and resumed on both devices.
#   3. GPT-2 124M (T = 1024, vocabulary padded to 50304, B = 16) in bf16 and float32: tokens/s, MFU and the
#      planner's predicted step beside the measured one, as `trident train` prints them; TinyLlama 1.1B's shape
#      (grouped-query attention, SwiGLU, rotary embeddings; GPT-2's tokenizer) in bf16 the same way.
#   4. bench_cuda: GEMM, kernel, attention, bandwidth and NCCL tables, and the GPT step.
#   5. Collectives on GPU buffers, 2 ranks on GPU 0: the CUDA IPC device path and staged through host memory
#      (trident bench comm --device cuda), and GPT-2 124M bf16 with 2 ranks sharing the GPU (DDP, ZeRO-2).
# On a lent GPU machine that cannot build trident (the workplace's device tool: no Debian packages, no network),
# pack here and carry the file (about 24 MB), then in one call of about 6-8 minutes:
#   here:  microbench/cuda/pack.sh build            (binaries of a Release build with -DTRIDENT_BUILD_BENCH=ON)
#   there: tar xzf .device/trident-gpu.tgz -C /tmp && export LD_LIBRARY_PATH=/tmp/trident-gpu/lib &&
#          SKIP_BUILD=1 F32=0 COMM=0 TINYLLAMA=0 MPS=1 PROFILE=1 BENCH_ARGS=--quick DATA=/tmp/trident-gpu/data \
#          OUT=/tmp/o microbench/cuda/run_device.sh /tmp/trident-gpu; tar czf $OUT/run.tgz -C /tmp o
#   (more than 8 files in $OUT do not come back: tar them.)
# Usage (repo root): microbench/cuda/run_device.sh [build-dir]
#   DATA: folder with tinyshakespeare/input.txt and gpt2-bpe/{encoder.json,vocab.bpe} (default ../shared/data)
#   SKIP_BUILD=1: use the binaries already in build-dir (trident, bench_cuda, tests/test_unit_cuda), for
#     example those microbench/cuda/pack.sh packed on a machine that builds trident.
#   F32=0, COMM=0, PARITY=0, TINYLLAMA=0, LLAMA8B=0, BENCH=0, RANKS2=0: leave out the float32 GPT-2 run, the
#     collective benchmarks, the cpu/cuda parity runs, the TinyLlama run, the Llama 3 8B offload runs,
#     bench_cuda, the 2-rank runs (shorter device time).
#   PROFILE=1: Nsight Compute's time of every kernel of one GPT-2 124M bf16 step (batch 4), summed by kernel
#     name (ncu --clock-control none: the clocks as found).
#   MPS=1: the 2-rank runs again under CUDA's Multi-Process Service (nvidia-cuda-mps-control), which lets
#     the ranks' kernels share the GPU at once instead of taking turns.
set -u
# cuBLAS and NCCL come from this machine's CUDA installation, or from the Python wheels that bring them.
for lib in libcublas.so.13 libnccl.so.2; do
  ldconfig -p | grep -q "$lib" && continue
  d=$(find /usr/local/cuda/ /usr/local/cuda/lib64/ /opt /usr/lib -name "$lib" 2>/dev/null | head -1)
  [ -n "$d" ] && export LD_LIBRARY_PATH=$(dirname "$d")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
stamp() { echo "== $(date -u +%T) $*"; }
OUT=${OUT:-$PWD/out/cuda-run}
B=${1:-build-cuda-release}
DATA=${DATA:-$PWD/../shared/data}
mkdir -p "$OUT"
{ nvidia-smi; nvcc --version; lscpu | grep 'Model name'; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  find /usr /opt \( -name 'libcudnn.so*' -o -name 'libcublasLt.so*' -o -name 'libnccl.so*' \) 2>/dev/null; } > "$OUT/device.txt" 2>&1
head -20 "$OUT/device.txt" | grep -E "Driver|H200|H100|NVIDIA"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DTRIDENT_BUILD_BENCH=ON > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  cmake --build "$B" -j"$(nproc)" --target trident test_unit_cuda bench_cuda > "$OUT/build.log" 2>&1 ||
    { grep -E "error" "$OUT/build.log" | head -30; tail -20 "$OUT/build.log"; exit 1; }
  echo "build ok"
fi
T=$(realpath "$B/trident")
stamp test_unit_cuda
TRIDENT_TEST_BIN=$T timeout ${TEST_TIMEOUT:-420} "$B/tests/test_unit_cuda" > "$OUT/test.log" 2>&1; echo "test_unit_cuda rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |worst" "$OUT/test.log"
grep -B2 -A6 "Failure" "$OUT/test.log" | head -60

W=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)  # checkpoints of the 1B models: 15 GB each
if [ "${PARITY:-1}" != 0 ]; then
stamp parity
S="--data $DATA/tinyshakespeare/input.txt --eval_interval 1000 --eval_iters 2 --sample_tokens 0 --json"
timeout 300 "$T" train $S --max_iters 20 --out_dir "$W/cpu" > "$W/cpu.jsonl" 2>&1; echo "train cpu rc=$?"
timeout 120 "$T" train $S --max_iters 20 --out_dir "$W/cuda" --device cuda > "$W/cuda.jsonl" 2>&1; echo "train cuda rc=$?"
cp -r "$W/cuda" "$W/on_cpu"; cp -r "$W/cuda" "$W/on_cuda"
timeout 120 "$T" train $S --max_iters 25 --out_dir "$W/on_cpu" --resume true > "$W/res_cpu.jsonl" 2>&1; echo "resume on cpu rc=$?"
timeout 120 "$T" train $S --max_iters 25 --out_dir "$W/on_cuda" --resume true --device cuda > "$W/res_cuda.jsonl" 2>&1
echo "resume on cuda rc=$?"
for d in cpu cuda; do
  echo "eval on $d: $(timeout 120 "$T" eval --checkpoint "$W/cuda" --windows 64 --json --device $d 2>&1 | tail -1)"
  timeout 120 "$T" sample --checkpoint "$W/cuda" --tokens 40 --temperature 0 --device $d > "$W/sample_$d.txt" 2>&1
done
cmp -s "$W/sample_cpu.txt" "$W/sample_cuda.txt" && echo "greedy samples: cpu == cuda" || echo "greedy samples differ"
cat "$W"/cpu.jsonl "$W"/cuda.jsonl "$W"/res_cpu.jsonl "$W"/res_cuda.jsonl > "$OUT/parity.jsonl"
python3 - "$W" <<'PY'
import json, sys
def losses(f):
    return {r["step"]: r["loss"] for r in (json.loads(l) for l in open(f) if l.startswith("{")) if r.get("type") == "step"}
def worst(a, b):
    d = [abs(a[k] - b[k]) / abs(b[k]) for k in a if k in b]
    return f"{len(d)} steps, worst relative loss difference {max(d):.3g}" if d else "no common steps"
w = sys.argv[1]
print("train cpu vs cuda:", worst(losses(f"{w}/cpu.jsonl"), losses(f"{w}/cuda.jsonl")))
print("cuda checkpoint resumed on cpu vs on cuda:", worst(losses(f"{w}/res_cpu.jsonl"), losses(f"{w}/res_cuda.jsonl")))
PY
fi

G="--model gpt2 --tokenizer gpt2 --tokenizer_dir $DATA/gpt2-bpe --vocab_multiple 128 --data $DATA/tinyshakespeare/input.txt
   --device cuda --block_size 1024 --batch_size 16 --eval_interval 100000 --eval_iters 1 --sample_tokens 0 --warmup_iters 5"
stamp GPT-2 124M
timeout 300 "$T" train $G --dtype bfloat16 --max_iters 50 --log_interval 10 --out_dir "$W/g_bf16" > "$OUT/gpt2_bf16.txt" 2>&1
echo "gpt2 bf16 rc=$?"; grep -E "^(prediction|measured|done)" "$OUT/gpt2_bf16.txt"
# The kernels that are off until measured here: the bias in cuBLASLt's epilogue, one-read cross-entropy.
TRIDENT_CUDA_BIAS_EPILOGUE=1 TRIDENT_CUDA_XENT_ONE_PASS=1 timeout 300 "$T" train $G --dtype bfloat16 --max_iters 50 \
  --log_interval 10 --out_dir "$W/g_bf16_new" > "$OUT/gpt2_bf16_new.txt" 2>&1
echo "gpt2 bf16 with TRIDENT_CUDA_BIAS_EPILOGUE=1 TRIDENT_CUDA_XENT_ONE_PASS=1 rc=$?"; grep -E "^done" "$OUT/gpt2_bf16_new.txt"
# Optimizer offload: AdamW's moments in host memory, its update on the CPU (the same losses as the run above
# within float32 rounding of the two AdamW kernels; tokens/s shows its cost at this size).
timeout 300 "$T" train $G --dtype bfloat16 --max_iters 20 --log_interval 10 --offload optimizer \
  --out_dir "$W/g_bf16_offload" > "$OUT/gpt2_bf16_offload.txt" 2>&1
echo "gpt2 bf16 --offload optimizer rc=$?"; grep -E "^done" "$OUT/gpt2_bf16_offload.txt"
if [ "${F32:-1}" != 0 ]; then
  timeout 300 "$T" train $G --dtype float32 --max_iters 10 --log_interval 5 --out_dir "$W/g_f32" > "$OUT/gpt2_f32.txt" 2>&1
  echo "gpt2 f32 rc=$?"; grep -E "^(prediction|measured|done)" "$OUT/gpt2_f32.txt"
fi
[ "${TINYLLAMA:-1}" != 0 ] && timeout 300 "$T" train ${G/--model gpt2/--model tinyllama-1.1b} --batch_size 4 --dtype bfloat16 --max_iters 20 \
  --log_interval 5 --out_dir "$W/tinyllama" > "$OUT/tinyllama_bf16.txt" 2>&1
echo "tinyllama-1.1b bf16 rc=$?"; grep -E "^(prediction|measured|done)" "$OUT/tinyllama_bf16.txt"
# Llama 3.2 1B's shapes at T = 2048; GPT-2's tokenizer padded to Llama 3's 128,256 ids (the classifier's
# shape; the padded ids take no probability).
stamp llama3.2-1b
L=${G/--model gpt2/--model llama3.2-1b}
timeout 300 "$T" train ${L/--block_size 1024/--block_size 2048} --vocab_multiple 128256 --batch_size 4 --dtype bfloat16 \
  --max_iters 12 --log_interval 4 --out_dir "$W/llama1b" 2>&1 | while IFS= read -r line; do echo "$(date -u +%T) $line"; done \
  > "$OUT/llama1b_bf16.txt"
echo "llama3.2-1b bf16 rc=${PIPESTATUS[0]}"; cat "$OUT/llama1b_bf16.txt"
# Llama 3 8B on one GPU: without offload the planner's device memory is over the H200's and the run must stop
# before allocating, naming the bytes; with --offload optimizer (moments on the host, AdamW on the CPU) it
# must train, its GPU memory within 10% of the printed prediction (nvidia-smi's peak sampled beside it). No
# checkpoint: weights and moments (96 GB) are more than the machine's disk.
if [ "${LLAMA8B:-1}" != 0 ]; then
  stamp llama3-8b
  L8="${G/--model gpt2/--model llama3-8b} --vocab_multiple 128256 --batch_size 1 --dtype bfloat16 --activation_checkpointing true --save_final false"
  timeout 120 "$T" train $L8 --max_iters 2 --out_dir "$W/l8_refused" > "$OUT/llama8b_no_offload.txt" 2>&1
  echo "llama3-8b without offload rc=$? (expected: refused before allocating)"; tail -3 "$OUT/llama8b_no_offload.txt"
  (while sleep 2; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done) > "$OUT/llama8b_mem.txt" &
  smi=$!
  timeout 420 "$T" train $L8 --offload optimizer --max_iters 4 --log_interval 1 --out_dir "$W/l8_offload" \
    > "$OUT/llama8b_offload.txt" 2>&1
  echo "llama3-8b --offload optimizer rc=$?"; grep -E "^(prediction|measured|done)|memory|step" "$OUT/llama8b_offload.txt" | tail -12
  kill $smi 2>/dev/null
  echo "llama3-8b GPU memory peak (MiB, nvidia-smi every 2 s): $(sort -n "$OUT/llama8b_mem.txt" | tail -1)"
fi
rm -rf "$W"


for ipc in 1 0; do
  [ "${COMM:-1}" = 0 ] && break
  TRIDENT_CUDA_IPC=$ipc timeout 120 "$T" bench comm --nproc 2 --device cuda --op all_reduce,all_gather -b 8 -e 256M \
    -f 16 --iters 10 --warmup 2 > "$OUT/comm_cuda_ipc$ipc.txt" 2>&1
  echo "bench comm --device cuda (TRIDENT_CUDA_IPC=$ipc) rc=$?"; grep -vE "^# (Rank|op|time|group|note)" "$OUT/comm_cuda_ipc$ipc.txt"
done
stamp 2 ranks on one GPU
W=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)  # checkpoints of the 1B models: 15 GB each
for p in ddp zero2 zero3; do
  [ "${RANKS2:-1}" = 0 ] && break
  timeout 300 "$T" train $G --dtype bfloat16 --batch_size 8 --max_iters 16 --nproc 2 --parallel $p --out_dir "$W/$p" \
    > "$OUT/gpt2_${p}_2ranks.txt" 2>&1
  echo "gpt2 bf16, 2 ranks on one GPU, $p rc=$?"; grep -E "^done" "$OUT/gpt2_${p}_2ranks.txt"
done
if [ "${MPS:-0}" = 1 ]; then
  stamp 2 ranks on one GPU under MPS
  export CUDA_MPS_PIPE_DIRECTORY=$W/mps CUDA_MPS_LOG_DIRECTORY=$W/mpslog
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    for p in ddp zero2 zero3; do
      timeout 300 "$T" train $G --dtype bfloat16 --batch_size 8 --max_iters 16 --nproc 2 --parallel $p --out_dir "$W/mps_$p" \
        > "$OUT/gpt2_${p}_2ranks_mps.txt" 2>&1
      echo "gpt2 bf16, 2 ranks on one GPU under MPS, $p rc=$?"; grep -E "^done|hidden behind" "$OUT/gpt2_${p}_2ranks_mps.txt"
    done
    echo quit | nvidia-cuda-mps-control
  else
    echo "MPS: nvidia-cuda-mps-control -d failed"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
rm -rf "$W"
if [ "${BENCH:-1}" != 0 ]; then
  stamp bench_cuda
  timeout ${BENCH_TIMEOUT:-300} "$B/bench_cuda" ${BENCH_ARGS:-} > "$OUT/bench.md" 2>&1; echo "bench_cuda rc=$?"
  cat "$OUT/bench.md"
fi
if [ "${PROFILE:-0}" = 1 ] && command -v ncu > /dev/null; then
  stamp ncu
  W=$(mktemp -d)
  timeout ${PROFILE_TIMEOUT:-150} ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 1500 \
    --log-file "$OUT/ncu.csv" "$T" train ${G/--batch_size 16/--batch_size 4} --dtype bfloat16 --max_iters 1 --out_dir "$W/p" \
    > "$OUT/ncu_train.txt" 2>&1
  echo "ncu rc=$?"
  python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows: sys.exit(print("ncu: no rows"))
h = rows[0]; ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
t, n = collections.Counter(), collections.Counter()
for r in rows[1:]:
    v = float(r[vi].replace(",", "")) * {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}.get(r[ui], 1.0)
    k = r[ki].split("(")[0].split("<")[0][:60]; t[k] += v; n[k] += 1
tot = sum(t.values())
print(f"ncu: {sum(n.values())} kernels, {tot:.1f} ms in all")
for k, v in t.most_common(25): print(f"  {v:8.2f} ms {100*v/tot:5.1f}%  x{n[k]:<5} {k}")
PY
  rm -rf "$W"
fi
stamp end
