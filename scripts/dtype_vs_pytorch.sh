#!/usr/bin/env bash
# Interleaved rounds, one thread each, OPENBLAS_CORETYPE unset on every side: PyTorch 1.13 float32 and
# bfloat16 autocast (shared/peers/ref_train.py [--autocast]) against trident --dtype float32 and bfloat16, at
# the nanoGPT CPU config and at GPT 6 x 768 (T 256, batch 4, biases). Prints tokens/s per run: PyTorch's
# median of iterations 10.. (ref_train.py), trident's median of steps from a fifth of the run on.
# usage: scripts/dtype_vs_pytorch.sh [TRIDENT_BIN] [ROUNDS]. Needs ../shared beside this repository (PEERS,
# DATA override). RT=1 runs every process under `chrt -f 10` (root): on a machine shared with other work,
# the measured process then keeps its core. Per-run JSON goes to OUT (default out/dtype-vs-pytorch).
set -u
B=${1:-build/trident}; REPS=${2:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
D=${DATA:-$ROOT/../shared/data/tinyshakespeare/input.txt}
P=${PEERS:-$ROOT/../shared/peers}
OUTD=${OUT:-$ROOT/out/dtype-vs-pytorch}; mkdir -p "$OUTD"
RT=(); [ "${RT:-0}" = 1 ] && RT=(chrt -f 10)
big=(--n_layer 6 --n_head 12 --n_embd 768 --block_size 256 --batch_size 4)
med() { python3 -c "import sys,json,statistics as s; v=[json.loads(l)['tokens_per_s'] for l in open(sys.argv[1]) if l.startswith('{') and json.loads(l).get('type')=='step']; print(f'{s.median(v[len(v)//5:]):.0f}')" "$1"; }
torch_run() {  # name iters flags...
  local name=$1 iters=$2; shift 2
  echo "$name pytorch: $(cd $P && "${RT[@]}" env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 ref_train.py --data $D --threads 1 --iters $iters "$@" 2>&1 | grep tokens_per_s | cut -d' ' -f2)"
}
trident_run() {  # name iters dtype flags...
  local name=$1 iters=$2 dt=$3; shift 3
  "${RT[@]}" env -u OPENBLAS_CORETYPE $B train --config $ROOT/configs/shakespeare_char.json --data $D --out_dir $OUTD/run --max_iters $iters --eval_interval 100000 --eval_iters 1 --sample_tokens 0 --threads 1 --json --dtype $dt "$@" > $OUTD/$name.jsonl 2>/dev/null
  echo "$name trident: $(med $OUTD/$name.jsonl)"
}
for r in $(seq 1 $REPS); do
  echo "== round $r, load $(cut -d' ' -f1 /proc/loadavg)"
  torch_run "nanogpt float32" 200
  torch_run "nanogpt bfloat16" 200 --autocast
  trident_run "nanogpt-float32" 200 float32
  trident_run "nanogpt-bfloat16" 200 bfloat16
  torch_run "gpt6x768 float32" 24 "${big[@]}"
  torch_run "gpt6x768 bfloat16" 24 --autocast "${big[@]}"
  trident_run "gpt6x768-float32" 24 float32 "${big[@]}" --bias true
  trident_run "gpt6x768-bfloat16" 24 bfloat16 "${big[@]}" --bias true
done
