#!/usr/bin/env bash
# One measurement pass of the collectives headline in docs/PERFORMANCE.md: trident interleaved with
# OpenMPI (and Gloo over TCP), 2 ranks bound to cores unless stated, float32 sum; then every trident row
# once more with --check. Raw tables go to OUTDIR (one file per row; *_mpi.txt, tcp_gloo.txt are the peers').
#
# Needs the peer programs of ../shared/peers (beside this repository; not part of it), built into PEERS_BUILD.
# Usage: scripts/collectives_pass.sh [OUTDIR]      (default out/collectives-pass)
#   TRIDENT=path/to/trident (default build/trident), PEERS_BUILD=the folder ../shared/peers/build.sh built
#   into (required), GLOO_RUN=path/to/shared/peers/run_gloo.sh (default: ../shared next to this repository).
# Run it on a quiet machine, several times; compare each row with its peer from the same pass.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
T="${TRIDENT:-$here/../build/trident}"
P="${PEERS_BUILD:?set PEERS_BUILD to the build folder of ../shared/peers (cd ../shared/peers && PEERS_BUILD=DIR ./build.sh)}"
G="${GLOO_RUN:-$here/../../shared/peers/run_gloo.sh}"
O="${1:-$here/../out/collectives-pass}"
[ -x "$T" ] || { echo "collectives_pass.sh: no trident at $T (set TRIDENT=)" >&2; exit 2; }
[ -x "$P/mpi_bench" ] || { echo "collectives_pass.sh: no $P/mpi_bench; build shared/peers first" >&2; exit 2; }
mkdir -p "$O"
unset OPENBLAS_CORETYPE
echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" > "$O/load_before"
"$P/membw" 1 256 10 > "$O/membw1"
"$P/membw" 2 256 10 > "$O/membw2"
B=(--nproc 2 --bind core)
M=(mpirun --allow-run-as-root -np 2 --bind-to core "$P/mpi_bench")
"$T" bench comm "${B[@]}" --op all_reduce -b 1M -e 256M -f 2 --iters 20 --warmup 3 > "$O/ar.txt" 2>&1
"${M[@]}" -b 1M -e 256M -f 2 -c allreduce > "$O/ar_mpi.txt" 2>&1
"$T" bench comm "${B[@]}" --op all_reduce -b 1G -e 1G --iters 3 --warmup 1 > "$O/ar1g.txt" 2>&1
"${M[@]}" -b 1G -e 1G -c allreduce > "$O/ar1g_mpi.txt" 2>&1
for op in all_gather:allgather reduce_scatter:reducescatter broadcast:bcast; do
  "$T" bench comm "${B[@]}" --op "${op%%:*}" -b 64M -e 64M --iters 10 --warmup 2 > "$O/${op%%:*}.txt" 2>&1
  "${M[@]}" -b 64M -e 64M -c "${op##*:}" > "$O/${op%%:*}_mpi.txt" 2>&1
done
"$T" bench comm "${B[@]}" --op all_reduce -b 8 -e 8 --iters 20000 --warmup 1000 > "$O/lat.txt" 2>&1
"${M[@]}" -b 8 -e 8 -c allreduce > "$O/lat_mpi.txt" 2>&1
"$T" bench comm --nproc 4 --bind core --op all_reduce -b 1M -e 1M --iters 50 --warmup 5 > "$O/ar4.txt" 2>&1
mpirun --allow-run-as-root --oversubscribe --bind-to core:overload-allowed -np 4 "$P/mpi_bench" -b 1M -e 1M \
  -c allreduce > "$O/ar4_mpi.txt" 2>&1
"$T" bench comm --nproc 4 --bind none --op all_reduce -b 1M -e 1M --iters 50 --warmup 5 > "$O/ar4u.txt" 2>&1
mpirun --allow-run-as-root --oversubscribe -np 4 "$P/mpi_bench" -b 1M -e 1M -c allreduce > "$O/ar4u_mpi.txt" 2>&1
# TCP loopback: 700 calls at 1 MiB (as many as mpi_bench's 0.3 s; short runs overstate), 10 at 64 MiB.
MT=(mpirun --allow-run-as-root -np 2 --bind-to core --mca btl tcp,self --mca btl_tcp_if_include lo "$P/mpi_bench")
"$T" bench comm "${B[@]}" --transport tcp --op all_reduce -b 1M -e 1M --iters 700 --warmup 20 --algo ring,tree,auto \
  > "$O/tcp1.txt" 2>&1
"${MT[@]}" -b 1M -e 1M -c allreduce > "$O/tcp1_mpi.txt" 2>&1
"$T" bench comm "${B[@]}" --transport tcp --op all_reduce -b 64M -e 64M --iters 10 --warmup 2 --algo ring,tree,auto \
  > "$O/tcp64.txt" 2>&1
"${MT[@]}" -b 64M -e 64M -c allreduce > "$O/tcp64_mpi.txt" 2>&1
if [ -x "$G" ]; then PEERS_BUILD="$P" "$G" 2 -b 1M -e 64M -f 64 > "$O/tcp_gloo.txt" 2>&1 || true
else echo "no Gloo runner at $G (set GLOO_RUN=)" > "$O/tcp_gloo.txt"; fi
echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" > "$O/load_after"
# Correctness of the same rows: every element of every iteration.
{
  "$T" bench comm "${B[@]}" --op all_reduce -b 1M -e 1G -f 4 --iters 2 --warmup 1 --check
  "$T" bench comm "${B[@]}" --op all_gather,reduce_scatter,broadcast -b 64M -e 64M --iters 2 --warmup 1 --check
  "$T" bench comm "${B[@]}" --op all_reduce -b 8 -e 8 --iters 100 --warmup 1 --check
  "$T" bench comm --nproc 4 --bind core --op all_reduce -b 1M -e 1M --iters 3 --warmup 1 --check
  "$T" bench comm "${B[@]}" --transport tcp --op all_reduce -b 1M -e 64M -f 64 --iters 2 --warmup 1 \
    --algo ring,tree,auto --check
} > "$O/check.txt" 2>&1
grep -h "Out of bounds" "$O/check.txt"
