#!/usr/bin/env bash
# trident under a real Slurm: a one-host cluster (Debian's slurmctld, slurmd and munge, configured here in a
# temporary folder, ports of their own, nothing of the machine's Slurm touched) runs
#   1. `srun -n 4 trident train --parallel zero2`: the ranks rendezvous from Slurm's environment alone, and the
#      loss sequence equals `trident train --nproc 4` (the launcher) on the same flags;
#   2. `sbatch --wait examples/slurm/train.sbatch` (the job file a user copies): exit status 0 and a checkpoint;
#      the same job with a flag trident refuses: the job's exit status is the training's (2, bad usage);
#   3. `scancel` of a running srun job: every rank is gone within seconds.
# Exit status: 0 passed, 1 failed (naming the check), 77 skipped (not root: the daemons run as root here).
# Usage: tests/slurm/slurm_test.sh SOURCE_DIR TRIDENT_BIN
set -euo pipefail
src=$(cd "$1" && pwd)
bin=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: needs root (slurmd, slurmctld and munged run as root in this one-host cluster)"
  exit 77
fi
for t in slurmctld slurmd munged srun sbatch scancel squeue; do
  command -v "$t" >/dev/null || { echo "FAIL: $t is missing: install slurmd slurmctld slurm-client munge (scripts/deps.sh build)"; exit 1; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/trident-slurm.XXXXXX")
chmod 755 "$work"
fail() { echo "FAIL: $*"; for f in "$work"/log/*; do echo "== $f"; tail -20 "$f"; done; exit 1; }
cleanup() {
  [ -n "${SLURM_CONF:-}" ] && scancel --quiet --full "--user=$(id -u)" 2>/dev/null || true
  for p in slurmd slurmctld munged; do
    [ -f "$work/$p.pid" ] && kill "$(cat "$work/$p.pid")" 2>/dev/null || true
  done
  sleep 0.5
  for p in slurmd slurmctld munged; do
    [ -f "$work/$p.pid" ] && kill -9 "$(cat "$work/$p.pid")" 2>/dev/null || true
  done
  pkill -9 -f "$work/" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work"/{state,spool,log,munge}
chmod 700 "$work/munge"
cd "$work"

# munge, the cluster's authentication, with a key of its own.
head -c 1024 /dev/urandom > munge.key
chmod 600 munge.key
munged --force --socket="$work/munge/sock" --key-file=munge.key --log-file="$work/log/munged.log" \
  --pid-file="$work/munged.pid" --seed-file="$work/munge/seed" || fail "munged did not start"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
cat > slurm.conf <<EOF
ClusterName=trident-test
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$work/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
KillWait=2
SlurmdParameters=config_overrides
NodeName=$host CPUs=8 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
export SLURM_CONF=$work/slurm.conf
# Only this cluster's variables reach the jobs: none of an enclosing Slurm job's (SLURM_*), nor a launcher's.
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
for v in $(env | grep -o '^SLURM_[A-Z_]*' | grep -v '^SLURM_CONF$' || true); do unset "$v"; done
slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
for _ in $(seq 1 100); do
  sinfo -h -o %t 2>/dev/null | grep -q idle && break
  sleep 0.1
done
sinfo -h -o %t | grep -q idle || fail "the node never became idle: $(sinfo 2>&1)"

for i in $(seq 1 400); do echo "line $i: the quick brown fox jumps over the lazy dog, said the slurm job."; done > corpus.txt
small=(--data "$work/corpus.txt" --max_iters 6 --eval_interval 3 --eval_iters 1 --batch_size 2 --block_size 16
       --n_layer 1 --n_embd 32 --n_head 2 --sample_tokens 0 --json)
losses() { python3 -c '
import json, sys
print(" ".join("%.7g" % r["loss"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"))' "$1/metrics.jsonl"; }

echo "== 1. srun -n 4: ranks from Slurm's environment"
srun -n 4 --kill-on-bad-exit=1 "$bin" train "${small[@]}" --parallel zero2 --out_dir "$work/srun" > srun.log 2>&1 ||
  { rc=$?; cat srun.log; fail "srun -n 4 trident train exited with $rc"; }
world=$(python3 -c '
import json, sys
print(next(r["world"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "prediction"))' "$work/srun/metrics.jsonl")
[ "$world" = 4 ] || fail "the srun run trained at world $world, not 4"
"$bin" train "${small[@]}" --parallel zero2 --nproc 4 --out_dir "$work/launch" > launch.log 2>&1 ||
  { rc=$?; cat launch.log; fail "trident train --nproc 4 exited with $rc"; }
a=$(losses "$work/srun") b=$(losses "$work/launch")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "losses under srun ($a) differ from the launcher's ($b)"
echo "srun: world 4, losses equal to trident train --nproc 4: $a"

echo "== 2. sbatch --wait examples/slurm/train.sbatch"
TRIDENT=$bin DATA=$work/corpus.txt OUT_DIR=$work/batch \
  sbatch --wait --ntasks-per-node=3 -o "$work/log/batch-%j.out" "$src/examples/slurm/train.sbatch" \
  "${small[@]:2}" --parallel ddp > sbatch.log 2>&1 || { rc=$?; cat sbatch.log; fail "sbatch --wait of the job file exited with $rc"; }
ls "$work"/batch/ckpt-* > /dev/null 2>&1 || fail "the batch job left no checkpoint in $work/batch"
set +e
TRIDENT=$bin DATA=$work/corpus.txt OUT_DIR=$work/bad \
  sbatch --wait -o "$work/log/bad-%j.out" "$src/examples/slurm/train.sbatch" --no_such_flag 1 > sbatch-bad.log 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "a job whose training refused its flags ended with $rc, not the training's 2"
grep -q "no_such_flag" "$work"/log/bad-*.out || fail "the refused flag is not named in the job's output"
echo "sbatch: job file ran (checkpoint written); a refused flag ends the job with the training's status 2"

echo "== 3. scancel"
srun -n 3 -J trident-cancel "$bin" train "${small[@]}" --max_iters 1000000 --eval_interval 1000000 \
  --out_dir "$work/cancel" > cancel.log 2>&1 &
srun_pid=$!
for _ in $(seq 1 300); do
  [ -s "$work/cancel/metrics.jsonl" ] && grep -q '"type":"step"' "$work/cancel/metrics.jsonl" && break
  sleep 0.1
done
grep -q '"type":"step"' "$work/cancel/metrics.jsonl" 2>/dev/null || { cat cancel.log; fail "the job to cancel never trained"; }
job=$(squeue -h -n trident-cancel -o %i)
[ -n "$job" ] || fail "squeue does not list the running job"
t0=$SECONDS
scancel "$job"
gone=0
for _ in $(seq 1 100); do
  if ! pgrep -f -- "--out_dir $work/cancel" > /dev/null; then gone=1; break; fi
  sleep 0.1
done
[ "$gone" = 1 ] || fail "ranks still running 10 s after scancel: $(pgrep -af -- "--out_dir $work/cancel")"
wait "$srun_pid" 2>/dev/null || true
echo "scancel: every rank gone within $((SECONDS - t0)) s"
echo PASS
