#!/usr/bin/env bash
# Interleaved rounds: trident 1 rank, PyTorch 1.13 1 rank (shared/peers/ref_train.py), trident DDP 2 ranks,
# PyTorch DDP (gloo) 2 ranks; nanoGPT CPU config, one thread per rank, OPENBLAS_CORETYPE unset on every side;
# prints the median per-step tokens/s (trident: after the first 10 steps). usage: scripts/train_vs_pytorch.sh [TRIDENT_BIN] [ROUNDS]
# Needs ../shared (beside this repository; not part of it): PEERS=its peers folder (ref_train.py), DATA=the
# tinyshakespeare text. Per-run JSON goes to OUT (default out/train-vs-pytorch). PT_CORETYPE=NAME also runs
# PyTorch with OPENBLAS_CORETYPE=NAME: where Debian's OpenBLAS does not know the CPU model it falls back to
# its slowest kernels (Prescott on an Emerald Rapids Xeon), and a forced core type gives the fair peer.
# CORUN=1 also runs two independent 1-rank trainings at once (cores 0 and 1, no communication) and prints
# DDP's efficiency against both 2x one rank and that pair: on a VM, two busy cores can each run slower than
# one alone (shared cache, memory, the host's clocks), and the pair shows how much of DDP's shortfall is that.
set -u
B=${1:-build/trident}; REPS=${2:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
D=${DATA:-$ROOT/../shared/data/tinyshakespeare/input.txt}
P=${PEERS:-$ROOT/../shared/peers}
OUTD=${OUT:-$ROOT/out/train-vs-pytorch}; mkdir -p "$OUTD"
med() { python3 -c "import sys,json,statistics as s; v=[json.loads(l)['tokens_per_s'] for l in open(sys.argv[1]) if l.startswith('{') and json.loads(l).get('type')=='step']; v=v[10:]; print(f'{s.median(v):.0f}')" "$1"; }
for r in $(seq 1 $REPS); do
  echo "== rep $r load $(cut -d' ' -f1 /proc/loadavg)"
  env -u OPENBLAS_CORETYPE $B train --config $ROOT/configs/shakespeare_char.json --data $D --max_iters 300 --eval_interval 1000 --eval_iters 1 --sample_tokens 0 --threads 1 --json > $OUTD/t1_$r.jsonl 2>/dev/null
  echo "trident 1 rank: $(med $OUTD/t1_$r.jsonl)"
  (cd $P && env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 ref_train.py --data $D --iters 300 2>&1 | grep tokens_per_s | sed 's/^/pytorch 1 rank: /')
  [ -n "${PT_CORETYPE:-}" ] && (cd $P && env OPENBLAS_CORETYPE=$PT_CORETYPE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 ref_train.py --data $D --iters 300 2>&1 | grep tokens_per_s | sed "s/^/pytorch 1 rank, OPENBLAS_CORETYPE=$PT_CORETYPE: /")
  env -u OPENBLAS_CORETYPE $B train --config $ROOT/configs/shakespeare_char.json --data $D --max_iters 300 --eval_interval 1000 --eval_iters 1 --sample_tokens 0 --threads 1 --nproc 2 --parallel ddp --json > $OUTD/t2_$r.jsonl 2>/dev/null
  echo "trident ddp 2: $(med $OUTD/t2_$r.jsonl)"
  if [ "${CORUN:-0}" = 1 ]; then
    for c in 0 1; do
      taskset -c $c env -u OPENBLAS_CORETYPE $B train --config $ROOT/configs/shakespeare_char.json --data $D --max_iters 300 --eval_interval 1000 --eval_iters 1 --sample_tokens 0 --threads 1 --json --out_dir $OUTD/corun$c > $OUTD/c${c}_$r.jsonl 2>/dev/null &
    done
    wait
    python3 -c "import sys; s,d,a,b=map(float,sys.argv[1:]); print(f'two 1-rank runs at once: {a:.0f} + {b:.0f}; ddp efficiency: {d/(2*s):.3f} of 2x one rank, {d/(a+b):.3f} of the pair')" \
      $(med $OUTD/t1_$r.jsonl) $(med $OUTD/t2_$r.jsonl) $(med $OUTD/c0_$r.jsonl) $(med $OUTD/c1_$r.jsonl)
  fi
  (cd $P && env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 ref_train.py --data $D --iters 300 --nproc 2 2>&1 | grep tokens_per_s | sed 's/^/pytorch ddp 2: /')
  [ -n "${PT_CORETYPE:-}" ] && (cd $P && env OPENBLAS_CORETYPE=$PT_CORETYPE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 ref_train.py --data $D --iters 300 --nproc 2 2>&1 | grep tokens_per_s | sed "s/^/pytorch ddp 2, OPENBLAS_CORETYPE=$PT_CORETYPE: /")
done
