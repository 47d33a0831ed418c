#!/usr/bin/env bash
# Measures trident's collectives and OpenMPI's side by side, in one session, 2 ranks, float32 sum, over
# shared memory and over TCP loopback (docs/PERFORMANCE.md, "Collectives (against OpenMPI and Gloo)").
# Each size is run by trident and then by OpenMPI right after, so machine drift hits both alike; the check
# runs (--check, every element of every iteration) follow the timed ones.
#
# Needs the peer programs of ../shared/peers (beside this repository; not part of it), built into PEERS_BUILD.
# Usage: scripts/run_peers.sh [OUTDIR]      (default out/bench-peers)
#   TRIDENT=path/to/trident (default build/trident), PEERS_BUILD=the folder ../shared/peers/build.sh built into
#   (required: cd ../shared/peers && PEERS_BUILD=DIR ./build.sh), TRANSPORTS="shm tcp".
# Writes OUTDIR/*.json (trident --json; OpenMPI converted to the same record shape), OUTDIR/*.txt (raw
# tables), OUTDIR/summary.md (the tables with ratios). To see the lines, add to a trident run
#   --html busbw.html --peer openmpi=OUTDIR/openmpi_tcp.json
# (one HTML page of busbw against size, this run's algorithms beside OpenMPI's rows).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
trident="${TRIDENT:-$here/../build/trident}"
peers="${PEERS_BUILD:?set PEERS_BUILD to the build folder of ../shared/peers (cd ../shared/peers && PEERS_BUILD=DIR ./build.sh)}"
out="${1:-$here/../out/bench-peers}"
transports="${TRANSPORTS:-shm tcp}"
mkdir -p "$out"
[ -x "$trident" ] || { echo "run_peers.sh: no trident at $trident (set TRIDENT=)" >&2; exit 2; }
[ -x "$peers/mpi_bench" ] || { echo "run_peers.sh: no $peers/mpi_bench; build shared/peers first" >&2; exit 2; }

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "openmpi: $(mpirun --version 2>/dev/null | head -1)"
} > "$out/machine.txt"

# sizes as "MIN MAX FACTOR ITERS WARMUP"
allreduce_specs=("8 8 2 200 20" "4K 4K 2 200 20" "1M 1M 2 50 5" "4M 4M 2 20 5" "64M 64M 2 10 2" "256M 256M 2 5 1")
for tr in $transports; do
  mpi_flags=()
  [ "$tr" = tcp ] && mpi_flags=(--mca btl tcp,self --mca btl_tcp_if_include lo)
  i=0
  for spec in "${allreduce_specs[@]}"; do
    read -r b e f it w <<< "$spec"
    "$trident" bench comm --nproc 2 --transport "$tr" --op all_reduce -b "$b" -e "$e" -f "$f" --iters "$it" \
      --warmup "$w" --json "$out/trident_${tr}_all_reduce_$i.json" > "$out/trident_${tr}_all_reduce_$i.txt" 2>&1
    mpirun --allow-run-as-root -np 2 "${mpi_flags[@]}" "$peers/mpi_bench" -b "$b" -e "$e" -c allreduce \
      > "$out/mpi_${tr}_all_reduce_$i.txt" 2>&1
    i=$((i + 1))
  done
  "$trident" bench comm --nproc 2 --transport "$tr" --op all_gather,reduce_scatter,broadcast -b 64M -e 64M \
    --iters 10 --warmup 2 --json "$out/trident_${tr}_others.json" > "$out/trident_${tr}_others.txt" 2>&1
  mpirun --allow-run-as-root -np 2 "${mpi_flags[@]}" "$peers/mpi_bench" -b 64M -e 64M \
    -c allgather,reducescatter,bcast > "$out/mpi_${tr}_others.txt" 2>&1
  # Correctness of the same rows: every element of every iteration.
  "$trident" bench comm --nproc 2 --transport "$tr" --op all_reduce -b 8 -e 256M -f 8 --iters 3 --warmup 1 --check \
    --json "$out/check_${tr}_all_reduce.json" > "$out/check_${tr}_all_reduce.txt" 2>&1 || true
  "$trident" bench comm --nproc 2 --transport "$tr" --op all_reduce,all_gather,reduce_scatter,broadcast -b 1M \
    -e 64M -f 4 --iters 3 --warmup 1 --check --json "$out/check_${tr}_others.json" > "$out/check_${tr}_others.txt" 2>&1 || true
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

python3 - "$out" "$transports" <<'EOF'
import glob, json, os, sys
out, transports = sys.argv[1], sys.argv[2].split()
names = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter", "bcast": "broadcast"}

def mpi_records(path, tr):
    recs = []
    for line in open(path):
        p = line.split()
        if len(p) == 9 and p[0] in names:
            recs.append({"op": names[p[0]], "algo": "openmpi", "size": int(p[1]), "count": int(p[2]),
                         "time_us": float(p[4]), "algbw": float(p[6]), "busbw": float(p[7]),
                         "check": p[8], "transport": tr})
    return recs

def human(n):
    for u, d in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= d:
            return f"{n / d:g} {u}"
    return f"{n} B"

lines = []
for tr in transports:
    tri, mpi = [], []
    for f in sorted(glob.glob(f"{out}/trident_{tr}_*.json")):
        tri += json.load(open(f))
    for f in sorted(glob.glob(f"{out}/mpi_{tr}_*.txt")):
        mpi += mpi_records(f, tr)
    json.dump(mpi, open(f"{out}/openmpi_{tr}.json", "w"), indent=0)
    checks = []
    for f in sorted(glob.glob(f"{out}/check_{tr}_*.json")):
        checks += json.load(open(f))
    wrong = sum(r["wrong"] or 0 for r in checks)
    lines.append(f"\n### {tr}: trident vs OpenMPI (2 ranks, float32 sum)\n")
    lines.append("| collective | size | trident time (us) | trident busbw (GB/s) | algo | OpenMPI time (us) | OpenMPI busbw (GB/s) | trident / OpenMPI busbw |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in sorted(tri, key=lambda r: (r["op"], r["size"], r["inplace"])):
        # OpenMPI's rows are out-of-place (broadcast in place): compare like with like.
        if r["inplace"] != (r["op"] == "broadcast"):
            continue
        m = [x for x in mpi if x["op"] == r["op"] and x["size"] == r["size"]]
        if not m:
            continue
        m = m[0]
        ratio = r["busbw"] / m["busbw"] if m["busbw"] > 0 else float("nan")
        tlat = r["time_us"] / m["time_us"] if m["time_us"] > 0 else float("nan")
        cell = f"{ratio:.2f}x" if r["size"] > 64 else f"time ratio {tlat:.2f} (lower is better)"
        lines.append(f"| {r['op']} | {human(r['size'])} | {r['time_us']:.1f} | {r['busbw']:.3f} | {r['algo']} | "
                     f"{m['time_us']:.1f} | {m['busbw']:.3f} | {cell} |")
    lines.append(f"\n--check runs over {tr} ({len(checks)} rows, sizes 8 B..256 MiB): {wrong} wrong elements; "
                 f"OpenMPI's own check: {', '.join(sorted({m['check'] for m in mpi}))}")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
