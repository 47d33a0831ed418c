#!/usr/bin/env bash
# Interleaved rounds at nanoGPT's CPU config (configs/shakespeare_char.json: n_layer 4, n_head 4, n_embd 128,
# block 64, batch 12), one thread, OPENBLAS_CORETYPE unset on every side: trident GPT (float32 and
# --dtype bfloat16), trident Llama (--model llama: n_kv_head 4 and 2, intermediate_size 352, untied head;
# float32 and --dtype bfloat16), PyTorch 1.13 Llama (microbench/llama_torch_train.py, Hugging Face's
# LlamaForCausalLM semantics: n_kv_head 4 and 2 in float32, 4 under bfloat16 autocast). Prints the median
# per-step tokens/s of each (trident: after the first 10 steps, from --json; PyTorch: its own median after
# 10) and the ratios Llama / GPT and trident Llama / PyTorch Llama, per round.
# usage: scripts/llama_vs_pytorch.sh [TRIDENT_BIN] [ROUNDS]
# DATA=the tinyshakespeare text (default ../shared/data/tinyshakespeare/input.txt beside this repository).
# Per-run output and summary.json (every round's figures and the load) go to OUT (default out/llama-vs-pytorch).
set -u
B=${1:-build/trident}; REPS=${2:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
D=${DATA:-$ROOT/../shared/data/tinyshakespeare/input.txt}
OUTD=${OUT:-$ROOT/out/llama-vs-pytorch}; mkdir -p "$OUTD"
ITERS=${ITERS:-300}
med() { python3 -c "import sys,json,statistics as s; v=[json.loads(l)['tokens_per_s'] for l in open(sys.argv[1]) if l.startswith('{') and json.loads(l).get('type')=='step']; v=v[10:]; print(f'{s.median(v):.0f}')" "$1"; }
trident() {  # name, extra flags...
  local name=$1; shift
  env -u OPENBLAS_CORETYPE $B train --config $ROOT/configs/shakespeare_char.json --data $D --max_iters $ITERS \
    --eval_interval 1000 --eval_iters 1 --sample_tokens 0 --threads 1 --json --out_dir $OUTD/run_$name "$@" \
    > $OUTD/${name}_$r.jsonl 2>$OUTD/${name}_$r.err
  echo "$name $(med $OUTD/${name}_$r.jsonl)" | tee -a $OUTD/round_$r.txt
}
torch() {  # name, extra flags...
  local name=$1; shift
  env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 \
    $ROOT/microbench/llama_torch_train.py --data $D --iters $ITERS --threads 1 "$@" > $OUTD/${name}_$r.txt 2>&1
  echo "$name $(tail -1 $OUTD/${name}_$r.txt | sed -n 's/^tokens_per_s //p')" | tee -a $OUTD/round_$r.txt
}
for r in $(seq 1 $REPS); do
  : > $OUTD/round_$r.txt
  l0=$(cut -d' ' -f1 /proc/loadavg); echo "== rep $r load $l0"
  trident trident_gpt
  trident trident_llama --model llama
  torch pytorch_llama
  trident trident_llama_kv2 --model llama --n_kv_head 2
  torch pytorch_llama_kv2 --n_kv_head 2
  trident trident_gpt_bf16 --dtype bfloat16
  trident trident_llama_bf16 --model llama --dtype bfloat16
  torch pytorch_llama_bf16 --dtype bfloat16
  l1=$(cut -d' ' -f1 /proc/loadavg); echo "load at the end $l1"
  echo "load $l0 $l1" >> $OUTD/round_$r.txt
  python3 - $OUTD/round_$r.txt <<'EOF'
import sys
v = {}
for line in open(sys.argv[1]):
    k, *rest = line.split()
    if k != "load" and rest and rest[0]: v[k] = float(rest[0])
def q(a, b):
    return f"{v[a] / v[b]:.2f}x" if a in v and b in v and v[b] else "-"
print(f"ratios: Llama/GPT {q('trident_llama', 'trident_gpt')} (kv2 {q('trident_llama_kv2', 'trident_gpt')}, "
      f"bf16 {q('trident_llama_bf16', 'trident_gpt_bf16')}); trident/PyTorch Llama float32 "
      f"{q('trident_llama', 'pytorch_llama')} (kv2 {q('trident_llama_kv2', 'pytorch_llama_kv2')}), "
      f"trident bf16 / PyTorch float32 {q('trident_llama_bf16', 'pytorch_llama')}, "
      f"/ PyTorch bf16 autocast {q('trident_llama_bf16', 'pytorch_llama_bf16')}")
EOF
done
python3 - $OUTD $REPS <<'EOF' > $OUTD/summary.json
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
rounds = []
for r in range(1, n + 1):
    x = {}
    for line in open(f"{d}/round_{r}.txt"):
        k, *rest = line.split()
        x[k] = [float(t) for t in rest] if k == "load" else (float(rest[0]) if rest and rest[0] else None)
    rounds.append(x)
print(json.dumps({"unit": "median tokens/s per step (after the first 10)", "rounds": rounds}, indent=1))
EOF
echo "summary: $OUTD/summary.json"
