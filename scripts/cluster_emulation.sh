#!/usr/bin/env bash
# An emulated cluster on one machine: HOSTS network namespaces (scripts/netns_hosts.sh) with RANKS ranks each,
# one `trident launch` per host (TRIDENT_HOST_ID, --nnodes/--node-rank, node 0's store on its private
# address), and the checks a multi-host job must pass. Ranks of one host talk over shared memory, hosts over
# TCP through veth pairs, a bridge and shaped links. One PASS/FAIL line per check; the exit status is 1 when
# any check failed. Not part of CI (32 ranks on 2 cores take minutes): docs/TESTING.md, "Long runs".
#
#   scripts/cluster_emulation.sh [flags]
#
# Checks, in order (--checks picks some of a,b,c):
#   a  `trident bench comm --check` over all ranks: all_reduce, all_gather, reduce_scatter at 1K, 16K,
#      256K bytes, hierarchical and automatic algorithms; every element of every iteration verified.
#   b  a tiny GPT (corpus written by this script) trained under ZeRO-2 and under TP 2 x DP over all ranks;
#      each step's loss equals a one-process run at the same global batch within 1e-4 relative.
#   c  one host's link cut completely mid-training (its veth set down on the switch, or netem loss 100%
#      with --cut netem) under `trident launch --max-restarts 1`: every launcher must stop its ranks within
#      2 x TRIDENT_TIMEOUT + 15 s of the cut, the cut host (its ranks or the host) named in the other hosts'
#      output, the healthy launchers waiting for it to rejoin; then the link is restored, the cut host's
#      launcher rejoins, and the job must resume from the last checkpoint and end with the uninterrupted
#      run's losses, bit for bit, every launcher exiting 0.
#   --soak MINUTES (not run by default): ZeRO-2 training long enough to last MINUTES uninterrupted, with a
#      random rank SIGKILLed every --soak-every seconds (default 60) for MINUTES minutes, under one
#      `trident launch --max-restarts 30` per host (every failure restarts all hosts from the last
#      checkpoint), and the final weights and optimizer state must equal an uninterrupted run's bit for bit.
#
# Flags: --hosts H (default 8), --ranks R per host (default 4), --bin PATH (default build/trident),
#        --checks LIST (default abc; "" with --soak runs the soak alone), --soak MINUTES, --soak-every S,
#        --timeout S (TRIDENT_TIMEOUT of the ranks, default 15), --cut down|netem, --cut-host K (default 3,
#        or the last host when H <= 3; not 0, whose launcher hosts the store), --prefix P (default trcl),
#        --work DIR (kept; default a temporary folder, removed unless a check failed), --rate R (default 1gbit),
#        --steps N (ZeRO-2 steps of b and c, default 30; more when few ranks train too fast to cut mid-run).
# Needs root, iproute2, jq, cmp, bc; netem for --cut netem. The namespaces are removed on every exit path;
# one run per --prefix at a time (a lock file in /tmp).
# Exit status: 0 every check passed, 1 a check failed or setup failed, 2 bad usage.
set -euo pipefail

usage() { sed -n '2,35p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "cluster_emulation.sh: $*" >&2; exit 1; }

root=$(cd "$(dirname "$0")/.." && pwd)
hosts=8 ranks=4 bin="$root/build/trident" checks=abc soak=0 soak_every=60 timeout_s=15 cut=down cut_host=""
prefix=trcl work="" rate=1gbit zsteps=30
while [[ $# -gt 0 ]]; do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --checks) checks=$2; shift 2 ;;
    --soak) soak=$2; shift 2 ;;
    --soak-every) soak_every=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --cut) cut=$2; shift 2 ;;
    --cut-host) cut_host=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --steps) zsteps=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "cluster_emulation.sh: unknown flag '$1'" >&2; usage ;;
  esac
done
num() { [[ "$2" =~ ^[0-9]+$ ]] || { echo "cluster_emulation.sh: $1 '$2': expected a whole number" >&2; exit 2; }; }
num --hosts "$hosts"; num --ranks "$ranks"; num --steps "$zsteps"; num --soak "$soak"; num --soak-every "$soak_every"; num --timeout "$timeout_s"
[[ $hosts -ge 2 ]] || { echo "cluster_emulation.sh: --hosts $hosts: need at least 2 hosts" >&2; exit 2; }
[[ $ranks -ge 2 && $((ranks % 2)) -eq 0 ]] ||
  { echo "cluster_emulation.sh: --ranks $ranks: need an even number >= 2 (TP 2 pairs ranks of one host)" >&2; exit 2; }
[[ $zsteps -ge 20 ]] || { echo "cluster_emulation.sh: --steps $zsteps: at least 20 (c cuts the link after step 12)" >&2; exit 2; }
[[ "$checks" =~ ^[abc]*$ ]] || { echo "cluster_emulation.sh: --checks '$checks': letters a, b, c only" >&2; exit 2; }
[[ $cut == down || $cut == netem ]] || { echo "cluster_emulation.sh: --cut '$cut': down or netem" >&2; exit 2; }
[[ $timeout_s -ge 5 ]] || { echo "cluster_emulation.sh: --timeout $timeout_s: at least 5 s (rendezvous of all ranks)" >&2; exit 2; }
if [[ -z "$cut_host" ]]; then cut_host=$((hosts > 3 ? 3 : hosts - 1)); fi
num --cut-host "$cut_host"
[[ $cut_host -ge 1 && $cut_host -lt $hosts ]] ||
  { echo "cluster_emulation.sh: --cut-host $cut_host: pick a host in 1..$((hosts - 1)) (host 0 hosts the store)" >&2; exit 2; }
[[ -x "$bin" ]] || die "--bin $bin: no trident executable there; build it (ninja -C build trident) or pass --bin"
for tool in ip tc jq cmp timeout flock bc; do command -v $tool >/dev/null || die "'$tool' not found; install it (iproute2, jq, diffutils, coreutils)"; done
[[ $(id -u) -eq 0 ]] || die "network namespaces need root (run as root or with sudo)"

# One run per prefix: a second run would delete the first one's namespaces (netns_hosts.sh up starts clean)
# and its cleanup would end the first one's processes.
exec {lock_fd}>"/tmp/cluster_emulation.$prefix.lock"
flock -n "$lock_fd" || die "another cluster_emulation.sh run uses --prefix $prefix; wait for it to end, or pass another --prefix"

world=$((hosts * ranks))
subnet=10.77.0
master=$subnet.10
keep_work=1
if [[ -z "$work" ]]; then work=$(mktemp -d /tmp/cluster_emulation.XXXXXX); keep_work=0; fi
mkdir -p "$work" || die "--work $work: cannot create the folder"
job_pids=()    # background launchers of the job now running
failed=0
port=29400     # each job gets its own store port, so no job waits for the previous one's socket

# Every exit path: stop what this script started (launchers, then anything left in its namespaces) and
# remove the namespaces. The namespaces are this script's own, so every process in them is one of its jobs.
cleanup() {
  local rc=$?
  for p in "${job_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for ((h = 0; h < hosts; h++)); do
    for p in $(ip netns pids "$prefix-h$h" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  done
  "$root/scripts/netns_hosts.sh" down --prefix "$prefix" >/dev/null 2>&1 || true
  if [[ $keep_work -eq 0 && $failed -eq 0 && $rc -eq 0 ]]; then rm -rf "$work"; else echo "work folder (logs): $work"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc | xargs printf '%.1f'; }
result() {  # result NAME OK|FAIL SECONDS DETAIL
  if [[ $2 == OK ]]; then echo "PASS  $1 ($3 s) $4"; else echo "FAIL  $1 ($3 s) $4"; failed=1; fi
}

echo "== $hosts hosts x $ranks ranks = $world ranks; work folder $work"
"$root/scripts/netns_hosts.sh" up "$hosts" --prefix "$prefix" --subnet "$subnet" --rate "$rate" >"$work/hosts.log" 2>&1 ||
  { cat "$work/hosts.log" >&2; die "scripts/netns_hosts.sh up $hosts failed (above)"; }
head -1 "$work/hosts.log"

# start_job NAME ARGS...: one `trident launch` per host, in the background, each host's output in
# NAME.hostH.log; the command after -- is trident with ARGS. Extra environment: JOB_ENV; extra launcher
# flags: LAUNCH_FLAGS.
start_job() {
  local name=$1; shift
  port=$((port + 1))
  job_pids=()
  for ((h = 0; h < hosts; h++)); do
    ip netns exec "$prefix-h$h" env TRIDENT_HOST_ID="emu$h" TRIDENT_STORE_TOKEN="cluster-emulation" \
      TRIDENT_TIMEOUT="$timeout_s" ${JOB_ENV:-} timeout -k 5 "${JOB_LIMIT:-600}" "$bin" launch --nnodes "$hosts" \
      --node-rank "$h" -n "$ranks" --master-addr "$master" --master-port "$port" ${LAUNCH_FLAGS:-} -- "$bin" "$@" \
      >"$work/$name.host$h.log" 2>&1 &
    job_pids+=($!)
  done
}
# wait_job: waits for every launcher of the job; sets job_rcs (one status per host) and returns 1 if any failed.
wait_job() {
  job_rcs=()
  local bad=0 rc
  for p in "${job_pids[@]}"; do
    rc=0; wait "$p" || rc=$?
    job_rcs+=("$rc"); [[ $rc -eq 0 ]] || bad=1
  done
  job_pids=()
  return $bad
}
run_job() { local name=$1; start_job "$@"; wait_job || { echo "  $name: launcher exit statuses ${job_rcs[*]}; logs $work/$name.host*.log"; return 1; }; }

# A corpus of 16 distinct characters (so every TP size divides the vocabulary): random words, fixed seed.
corpus="$work/corpus.txt"
awk 'BEGIN { srand(11); n = split("the |cat |sat |on |a |mat |and |dog |ran.\n|far ", w, "|");
             s = ""; while (length(s) < 12000) s = s w[int(rand() * n) + 1]; printf "%s", s }' >"$corpus"

model=(--data "$corpus" --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --eval-iters 1 --learning-rate 3e-3
       --warmup-iters 2 --sample-tokens 0 --threads 1 --json)
# losses DIR: "step loss" per line, the step records of DIR/metrics.jsonl (the resumed run's replace the others).
losses() { { jq -r 'select(.type == "step") | "\(.step) \(.loss)"' "$1/metrics.jsonl" 2>/dev/null || true; } | awk '{l[$1] = $2} END {for (s in l) print s, l[s]}' | sort -n; }
# same_losses A B REL: every step of A within REL (relative) of B's, the same steps; prints the worst.
same_losses() {
  join <(losses "$1") <(losses "$2") | awk -v rel="$3" -v na="$(losses "$1" | wc -l)" -v nb="$(losses "$2" | wc -l)" '
    { d = $2 - $3; if (d < 0) d = -d; r = d / ($3 < 0 ? -$3 : $3); if (r > worst) { worst = r; at = $1 } n++ }
    END { ok = n > 0 && n == na && n == nb && worst <= rel;
          printf "%d steps, worst relative difference %.2g at step %s", n, worst, (at == "" ? "-" : at);
          if (n != na || n != nb) printf " (steps: %d here, %d in the reference)", na, nb; exit ok ? 0 : 1 }'
}
single_run() {  # single_run OUT BATCH STEPS ARGS...: one process, the reference
  local out=$1 batch=$2 steps=$3; shift 3
  "$bin" train "${model[@]}" --out_dir "$out" --batch-size "$batch" --max-iters "$steps" --lr-decay-iters "$steps" \
    "$@" >"$out.log" 2>&1
}

# ---- a: collectives
if [[ $checks == *a* ]]; then
  t0=$(now)
  if run_job bench bench comm --op all_reduce,all_gather,reduce_scatter -b 1K -e 256K -f 16 --algo hier,auto --check \
      -n 2 -w 1 --timeout "${timeout_s}s"; then
    rows=$(grep -cE '^ +[0-9]+ ' "$work/bench.host0.log" || true)
    wrong=$(awk '/^ +[0-9]+ / && ($10 != 0 || $17 != 0) {n++} END {print n + 0}' "$work/bench.host0.log")
    hier=$(grep -c 'algo hier' "$work/bench.host0.log" || true)
    if [[ $rows -eq 18 && $wrong -eq 0 && $hier -eq 3 ]] && grep -q "$world ranks on $hosts host(s) x $ranks rank(s)" "$work/bench.host0.log"; then
      result "a bench comm --check" OK "$(since "$t0")" "$world ranks: $rows rows (3 ops x 3 sizes x hier,auto), 0 wrong elements"
    else
      result "a bench comm --check" FAIL "$(since "$t0")" "$rows rows (want 18), $wrong with wrong elements, $hier hier tables; $work/bench.host0.log"
    fi
  else
    result "a bench comm --check" FAIL "$(since "$t0")" "a launcher failed: $(grep -h 'wrong\|error' "$work"/bench.host*.log | head -3)"
  fi
fi

# ---- b: training parity (the ZeRO-2 run is also c's uninterrupted reference)
zinterval=5
zero2=(train "${model[@]}" --parallel zero2 --batch-size 1 --max-iters $zsteps --lr-decay-iters $zsteps
       --eval-interval 1000 --checkpoint-interval $zinterval)
if [[ $checks == *b* || $checks == *c* ]]; then
  t0=$(now)
  single_run "$work/ref_zero2" "$world" $zsteps --eval-interval 1000 --checkpoint-interval $zinterval ||
    die "the one-process reference failed: $work/ref_zero2.log"
  if run_job zero2 "${zero2[@]}" --out_dir "$work/zero2" && detail=$(same_losses "$work/zero2" "$work/ref_zero2" 1e-4); then
    result "b ZeRO-2 = one process" OK "$(since "$t0")" "$world ranks, batch 1 each, against batch $world: $detail"
  else
    result "b ZeRO-2 = one process" FAIL "$(since "$t0")" "${detail:-the job failed}"
  fi
fi
if [[ $checks == *b* ]]; then
  t0=$(now); detail=""
  dp=$((world / 2)) tsteps=10
  single_run "$work/ref_tp" "$dp" $tsteps --eval-interval 1000 || die "the one-process reference failed: $work/ref_tp.log"
  if run_job tp train "${model[@]}" --tp 2 --dp "$dp" --batch-size 1 --max-iters $tsteps --lr-decay-iters $tsteps \
      --eval-interval 1000 --out_dir "$work/tp" && detail=$(same_losses "$work/tp" "$work/ref_tp" 1e-4); then
    result "b TP 2 x DP $dp = one process" OK "$(since "$t0")" "batch 1 per replica, against batch $dp: $detail"
  else
    result "b TP 2 x DP $dp = one process" FAIL "$(since "$t0")" "${detail:-the job failed}"
  fi
fi

# ---- c: one host's link cut mid-training, then restored and the job resumed
last_step() { { jq -r 'select(.type == "step") | .step' "$1/metrics.jsonl" 2>/dev/null || true; } | tail -1; }
cut_link() {
  if [[ $cut == down ]]; then ip -n "$prefix-sw" link set "v$cut_host" down
  else
    ip netns exec "$prefix-h$cut_host" tc qdisc replace dev eth0 root netem loss 100%
    ip netns exec "$prefix-sw" tc qdisc replace dev "v$cut_host" root netem loss 100%
  fi
}
restore_link() {
  if [[ $cut == down ]]; then ip -n "$prefix-sw" link set "v$cut_host" up
  else
    ip netns exec "$prefix-h$cut_host" tc qdisc replace dev eth0 root tbf rate "$rate" burst 256kb latency 5ms
    ip netns exec "$prefix-sw" tc qdisc replace dev "v$cut_host" root tbf rate "$rate" burst 256kb latency 5ms
  fi
}
if [[ $checks == *c* ]]; then
  t0=$(now)
  cut_ranks="$((cut_host * ranks))-$((cut_host * ranks + ranks - 1))"
  cut_alt=$(seq -s '|' $((cut_host * ranks)) $((cut_host * ranks + ranks - 1)))
  out="$work/cut"
  LAUNCH_FLAGS="--max-restarts 1 --join-timeout 300" JOB_LIMIT=600 start_job cut "${zero2[@]}" --out_dir "$out"
  # Cut once a checkpoint exists and a few steps past it have run.
  cut_after=$((2 * zinterval + 2)) reached=0
  for ((i = 0; i < 1200; i++)); do
    s=$(last_step "$out"); if [[ -n "$s" && $s -ge $cut_after ]]; then reached=1; break; fi
    sleep 0.1
  done
  if [[ $reached -eq 0 ]]; then
    wait_job || true
    result "c cut link: every rank fails" FAIL "$(since "$t0")" "training never reached step $cut_after; $work/cut.host0.log"
  else
    cut_link; tcut=$(now); cut_step=$(last_step "$out")
    ended_before=0; for p in "${job_pids[@]}"; do kill -0 "$p" 2>/dev/null || ended_before=1; done
    echo "  link of host $cut_host (ranks $cut_ranks) cut ($cut) after step $cut_step"
    # Every launcher stops its ranks and prints its restart line; the healthy ones then wait for the cut host.
    bound=$((2 * timeout_s + 15)) stops=() pending=$hosts
    for ((h = 0; h < hosts; h++)); do stops+=(""); done
    while [[ $pending -gt 0 ]] && awk -v t="$(since "$tcut")" -v b="$((bound + 60))" 'BEGIN {exit !(t < b)}'; do
      pending=0
      for ((h = 0; h < hosts; h++)); do
        if [[ -z "${stops[$h]}" ]]; then
          if grep -q "(restart 1 of 1)" "$work/cut.host$h.log" 2>/dev/null; then stops[$h]=$(since "$tcut"); else pending=$((pending + 1)); fi
        fi
      done
      sleep 0.2
    done
    # The healthy launchers name the host they wait for (after 5 s of waiting) before the link comes back.
    for ((i = 0; i < 100; i++)); do
      grep -q "waiting for node $cut_host (host emu$cut_host)" "$work/cut.host0.log" && break; sleep 0.2
    done
    restore_link; echo "  link restored $(since "$tcut") s after the cut"
    late=0 unnamed=""
    for ((h = 0; h < hosts; h++)); do
      t=${stops[$h]:-never}
      [[ $t != never ]] && awk -v t="$t" -v b="$bound" 'BEGIN {exit !(t > b)}' && late=1
      [[ $t == never ]] && late=1
      # Every other host must name a rank of the cut host (or the host itself) in its output.
      if [[ $h -ne $cut_host ]] && ! { grep -E "error|trident launch" "$work/cut.host$h.log" || true; } |
          grep -qE "emu$cut_host\b|not heard from: rank\(s\) ([0-9]+, )*($cut_alt)([^0-9]|$)"; then
        unnamed+=" $h"
      fi
    done
    echo "  launchers stopped their ranks (seconds after the cut): ${stops[*]}"
    for ((h = 0; h < hosts; h++)); do
      { grep -E "^\[rank [0-9]+\] trident: error|^trident launch: node [0-9]+ stopped|^trident launch: node [0-9]+ waiting" "$work/cut.host$h.log" || true; } |
        head -2 | cut -c1-300 | sed "s/^/  host $h: /"
    done
    if [[ $ended_before -eq 1 || $cut_step -ge $((zsteps - 1)) ]]; then
      result "c cut link: every rank fails" FAIL "$(since "$t0")" "a launcher had ended before the cut (step $cut_step of $zsteps): this layout trains too fast; pass a larger --steps"
    elif [[ $late -eq 0 && -z "$unnamed" ]]; then
      result "c cut link: every rank fails" OK "$(since "$t0")" "every launcher stopped its ranks within $bound s of the cut, the cut host named"
    else
      result "c cut link: every rank fails" FAIL "$(since "$t0")" "later than $bound s (or never): $late, hosts not naming host $cut_host:${unnamed:- none}"
    fi
    # The cut host's launcher rejoins once its link is back; the job resumes from the last checkpoint.
    t0=$(now)
    if wait_job && grep -q "resuming from" "$work/cut.host0.log" && detail=$(same_losses "$out" "$work/zero2" 0); then
      from=$(grep -o 'resuming from .*' "$work/cut.host0.log" | head -1)
      result "c restored link: the job resumes" OK "$(since "$t0")" "$from; $detail (bit for bit with the uninterrupted run)"
    else
      result "c restored link: the job resumes" FAIL "$(since "$t0")" "${detail:-launcher exit statuses ${job_rcs[*]}, or no resume}; $work/cut.host0.log"
    fi
  fi
fi

# ---- soak: a random rank killed every soak_every seconds; final state bitwise equal to an uninterrupted run
if [[ $soak -gt 0 ]]; then
  t0=$(now)
  sinterval=10
  soak_job=(train "${model[@]}" --parallel zero2 --batch-size 1 --eval-interval 1000000 --checkpoint-interval $sinterval)
  # Calibrate: the wall time per step of this layout on this machine (the step records' `elapsed`, which
  # counts what a step's own time_ms.step leaves out: at 8 x 4 on 2 cores about half of the wall time,
  # checkpoints included), so the run lasts about MINUTES uninterrupted.
  run_job soak_cal "${soak_job[@]}" --max-iters 30 --lr-decay-iters 30 --out_dir "$work/soak_cal" ||
    die "the soak's calibration run failed: $work/soak_cal.host0.log"
  step_s=$(jq -r 'select(.type == "step") | "\(.step) \(.elapsed)"' "$work/soak_cal/metrics.jsonl" |
           awk '$1 == 9 {t0 = $2} $1 == 29 {t1 = $2} END {print (t1 - t0) / 20}')
  ssteps=$(awk -v m="$soak" -v s="$step_s" 'BEGIN {n = int(m * 60 / s); n -= n % 10; print (n < 20 ? 20 : n)}')
  echo "  soak: $ssteps steps (${step_s} s each), a rank killed every ${soak_every} s for $soak min, at most 30 restarts"
  JOB_LIMIT=$((soak * 60 * 3 + 600)) run_job soak_ref "${soak_job[@]}" --max-iters "$ssteps" --lr-decay-iters "$ssteps" \
    --out_dir "$work/soak_ref" || die "the soak's uninterrupted run failed: $work/soak_ref.host0.log"
  echo "  uninterrupted run: $(since "$t0") s"
  t1=$(now) kills=0 done=0 sout="$work/soak"
  LAUNCH_FLAGS="--max-restarts 30 --join-timeout 300" JOB_LIMIT=$((soak * 60 * 3 + 600)) start_job soak \
    "${soak_job[@]}" --max-iters "$ssteps" --lr-decay-iters "$ssteps" --out_dir "$sout"
  next_kill=$(( $(date +%s) + soak_every ))
  while :; do
    alive=0; for p in "${job_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive -eq 1 ]] || break
    if [[ $(date +%s) -ge $next_kill && $(echo "$(now) - $t1 < $soak * 60" | bc) -eq 1 ]]; then
      # A random rank: a trident train process whose parent is a launcher, in a random host's namespace.
      h=$((RANDOM % hosts)) victims=()
      for p in $(ip netns pids "$prefix-h$h" 2>/dev/null); do
        if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q " train " && grep -qz '^RANK=' "/proc/$p/environ" 2>/dev/null; then victims+=("$p"); fi
      done
      if [[ ${#victims[@]} -gt 0 ]]; then
        v=${victims[$((RANDOM % ${#victims[@]}))]}
        r=$(tr '\0' '\n' <"/proc/$v/environ" 2>/dev/null | sed -n 's/^RANK=//p')
        kill -KILL "$v" 2>/dev/null && { kills=$((kills + 1)); echo "  $(since "$t1") s: killed rank $r (host $h, pid $v) at step $(last_step "$sout")"; }
      fi
      next_kill=$(( $(date +%s) + soak_every ))
    fi
    sleep 0.5
  done
  wait_job && done=1
  restarts=$(grep -c "(restart [0-9]* of 30)" "$work/soak.host0.log" || true)
  if [[ $done -eq 1 ]] && detail=$(same_losses "$sout" "$work/soak_ref" 0) &&
      ck=$(printf 'ckpt-%08d' "$ssteps") && cmp -s "$sout/$ck/model.safetensors" "$work/soak_ref/$ck/model.safetensors" &&
      cmp -s "$sout/$ck/optimizer.safetensors" "$work/soak_ref/$ck/optimizer.safetensors"; then
    result "soak $soak min" OK "$(since "$t0")" "$kills ranks killed, $restarts restarts; final weights and optimizer state bitwise equal; $detail"
  else
    result "soak $soak min" FAIL "$(since "$t0")" "finished: $done, $kills kills, $restarts restarts; ${detail:-}; $work/soak*.host*.log"
  fi
fi

exit $failed
