#!/usr/bin/env bash
# Builds trident and runs every test: the release build's whole suite, then the communication layer and the
# store again under AddressSanitizer + UndefinedBehaviorSanitizer, and the threaded code (comm engine, store,
# launcher, data and pipeline parallelism) under ThreadSanitizer. This is what CI runs (.ci/run). Ends by listing every skipped test with
# its reason and the time each stage took.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every reference a test needs is installed here, so a skip for a missing package or tool is a failure
# (tests/harness/skip.h); only what the machine cannot change (no GPU, no privilege) may skip.
export CI="${CI:-true}"
jobs=$(nproc)
logs=build/ci-logs

stage_names=() stage_secs=() mark=$SECONDS
lap() { stage_names+=("$1"); stage_secs+=($((SECONDS - mark))); mark=$SECONDS; }
report_times() {
  echo "== stage times (s)"
  for i in "${!stage_names[@]}"; do printf '%6d  %s\n' "${stage_secs[$i]}" "${stage_names[$i]}"; done
  printf '%6d  total\n' "$SECONDS"
}
trap report_times EXIT

scripts/deps.sh build
lap "deps"

# Ninja where installed: it schedules the files of every target asked for together, where make builds the
# targets of one command one after another. A build folder keeps the generator it was first configured with.
gen() { [[ -f "$1/CMakeCache.txt" ]] || ! command -v ninja >/dev/null || echo "-GNinja"; }
# Every build here compiles each library's files in batches of 8, one translation unit per batch
# (-DCMAKE_UNITY_BUILD=ON): the headers are parsed once per batch, not once per file (the algorithm layer:
# 5.9x less CPU in the release build, 2.5x under ASan). Tests, the CLI and the CPU kernels stay file by
# file, and so do library files whose file-local names collide with another file's (the root
# CMakeLists.txt's unity block); should a new collision break a batch, the build is redone file by file
# and the log says so: CI gets slower, not red. Developers' builds compile file by file, so a .cc that
# misses an include of its own still fails there.
unity_build() {  # DIR BUILD_ARGS...   (DIR configured with -DCMAKE_UNITY_BUILD=ON)
  local dir=$1
  shift
  cmake --build "$dir" -j"$jobs" "$@" && return 0
  echo "== $dir: the batched (unity) build failed; building file by file. If it then passes, two files of one" \
       "library define the same file-local name: list one in the root CMakeLists.txt's unity block."
  cmake -S . -B "$dir" -DCMAKE_UNITY_BUILD=OFF >/dev/null
  cmake --build "$dir" -j"$jobs" "$@"
}

# Microbenchmarks (TRIDENT_BUILD_BENCH) are left out: no test runs them. The sanitizer builds skip CUDA.
# Warnings are errors in the release build (TRIDENT_WERROR: trident's own C and C++ files, not third-party
# headers, the torch extension or nvcc's CUDA files), so a warning fails CI instead of greeting the next
# person who builds.
cmake -S . -B build $(gen build) -DCMAKE_BUILD_TYPE=Release -DTRIDENT_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON \
  -DTRIDENT_WERROR=ON >/dev/null
unity_build build
lap "release build"

# The sanitizer builds (-O1: several times faster to run than -O0, and what the sanitizers' authors advise)
# compile at the lowest priority while ctest runs, taking the CPU the tests leave idle while they wait on
# each other and on deadlines; they hardly slow the tests down. The lowest priority is set on the session:
# setsid starts a new one, and where the kernel schedules sessions as groups (autogroup, on by default in
# most distributions) a nice value counts only inside its own session: two busy loops at nice 19 in a
# session of their own took half of the 2 cores from two at nice 0.
# They keep line tables only (-g1: the file:line of every frame of a report, about 20% less CPU than -g).
asan_tests=(test_unit_store test_unit_algorithms test_unit_comm test_multiprocess_comm)
# tsan_launch and tsan_parallel (tests/CMakeLists.txt) hold only the launcher, data- and pipeline-parallel test
# files this stage runs, and link only their layers: the instrumented build skips the trainer and planner.
tsan_tests=(test_unit_comm test_unit_store tsan_launch test_multiprocess_comm tsan_parallel)
# Every parser of bytes from the network or disk (docs/TESTING.md); each target links only its parser's files
# and the small layers they call.
fuzz_targets=(fuzz_store_request fuzz_frame_header fuzz_safetensors fuzz_checkpoint_json fuzz_train_config)
mkdir -p "$logs"
san_build() {  # DIR FLAG TARGETS...
  local dir=$1 flag=$2
  shift 2
  cmake -S . -B "$dir" $(gen "$dir") -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" -D"$flag"=ON \
    -DTRIDENT_BUILD_BENCH=OFF -DCMAKE_CUDA_COMPILER=NOTFOUND -DCMAKE_UNITY_BUILD=ON >/dev/null
  unity_build "$dir" --target "$@"
}
export -f gen unity_build
export jobs
export -f san_build
# Its own process group (setsid), so a failed ctest stops the whole build at once. The ASan build's exit
# status is written as soon as it ends, so its tests start while the TSan and fuzz builds go on.
asan_rc_file=$logs/asan-build.rc
rm -f "$asan_rc_file"
setsid bash -c "{ echo 19 >/proc/self/autogroup; } 2>/dev/null; renice -n 19 -p \$\$ >/dev/null || exit 1
  san_build build-asan TRIDENT_SANITIZE ${asan_tests[*]}; rc=\$?; echo \$rc >$asan_rc_file; ((rc == 0)) || exit \$rc
  san_build build-tsan TRIDENT_TSAN ${tsan_tests[*]} && FUZZ_BUILD_ONLY=1 scripts/fuzz.sh 15 ${fuzz_targets[*]}" \
  >"$logs/sanitizer-build.log" 2>&1 &
san_pid=$!
san_failed() {  # EXIT_STATUS
  tail -n 60 "$logs/sanitizer-build.log"
  echo "sanitizer builds failed (exit $1); the whole log is $logs/sanitizer-build.log"
  exit "$1"
}

# The skipped tests and why are listed at the end, whether the run passed or failed.
ctest_rc=0
(cd build && ctest --output-on-failure --timeout 900 -j"$jobs") || ctest_rc=$?
skips=$(scripts/skipped_tests.py build || true)
lap "ctest (sanitizer builds beside it)"
if ((ctest_rc != 0)); then
  kill -- "-$san_pid" 2>/dev/null || true
  echo "$skips"
  exit "$ctest_rc"
fi
while [[ ! -s "$asan_rc_file" ]] && kill -0 "$san_pid" 2>/dev/null; do sleep 1; done
asan_rc=$(cat "$asan_rc_file" 2>/dev/null || echo 1)
lap "rest of the ASan build"
if ((asan_rc != 0)); then
  san_failed "$asan_rc"
fi

# Each binary is run directly (ctest would also list the targets these builds skip), a few at a time, each
# with its log printed when it ends.
run_pair() {  # NAME1 CMD1 NAME2 CMD2 ... (each CMD a string run by bash), all at once
  local pids=() names=() rc=0
  while (($#)); do
    names+=("$1")
    bash -c "$2" >"$logs/$1.log" 2>&1 &
    pids+=($!)
    shift 2
  done
  for i in "${!pids[@]}"; do
    local r=0
    wait "${pids[$i]}" || r=$?
    echo "== ${names[$i]} (exit $r)"
    if ((r != 0)); then cat "$logs/${names[$i]}.log"; rc=$r; else grep -E '^\[(==========|  PASSED|  FAILED)' "$logs/${names[$i]}.log" || true; fi
  done
  return $rc
}

# AddressSanitizer + UndefinedBehaviorSanitizer over the layers where memory bugs hide: store, transports,
# engine, algorithms. Left to the release build: 5- and 8-rank sweeps (the same code paths as 2-4 ranks, 3
# the odd one, only more of them; named w5_*/w8_* or ending /w5, /w8 by their suites), the tuning benchmark
# and the reduction-order runs (the sweep runs the same code under ASan; these only time the arrivals).
# TRIDENT_TIMEOUT: ctest gives its tests 20 s; instrumented code is slower, so a deadlock fails in a minute.
asan_env="TRIDENT_TIMEOUT=60 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
asan_filter="--gtest_filter=-*w8_*:*w5_*:*/w8:*/w5:Tuning.BenchTune*:*ReductionOrder* --gtest_brief=1"
# All four at once: test_multiprocess_comm takes the longest (about 145 s), the rest fit beside it.
run_pair \
  asan_test_multiprocess_comm "env $asan_env build-asan/tests/test_multiprocess_comm $asan_filter" \
  asan_test_unit_algorithms "env $asan_env build-asan/tests/test_unit_algorithms $asan_filter" \
  asan_test_unit_store "env $asan_env build-asan/tests/test_unit_store $asan_filter" \
  asan_test_unit_comm "env $asan_env build-asan/tests/test_unit_comm $asan_filter"
lap "ASan+UBSan tests (TSan and fuzz builds beside them)"
san_rc=0
wait "$san_pid" || san_rc=$?
lap "rest of the TSan and fuzz builds"
if ((san_rc != 0)); then
  san_failed "$san_rc"
fi

# ThreadSanitizer over the threaded code: the comm engine's progress threads, deadlines and aborts, with
# ranks as threads of one process over shm and TCP (test_unit_comm), the TCP store's server and clients
# (test_unit_store) and the launcher's supervisor (tsan_launch: not the tests that drive the `trident` CLI,
# which this build does not compile); then, with TSan in every rank process, the 2- and
# 3-rank cases of the multi-process comm tests (a killed or silent peer, deadlines, flow control, p2p in
# both directions) and of the parallel layer (DDP and ZeRO buckets reduced by the engine while backward
# still runs, pipeline p2p under each schedule, a failing stage). Any report fails the run (exitcode=66);
# suppressions (tests/tsan.supp) are for third-party code only.
# Smoke and p2p parameters /0-/3 (or /2-/5) are their 2- and 3-rank worlds over shm and TCP.
tsan_comm_filter="Transports/Faults.*:Transports/ExitAfterSend.*:FlowControl.*:P2POrder.*:\
Worlds/Smoke.*/2:Worlds/Smoke.*/3:Worlds/Smoke.*/4:Worlds/Smoke.*/5:\
Worlds/P2PDirections.*/0:Worlds/P2PDirections.*/1:Worlds/P2PDirections.*/2:Worlds/P2PDirections.*/3:\
ShmCma.KilledPeerDuringTransfersIsNamed:ShmFastPath.KilledPeerIsNamed:ShmFastPath.DeadlineNamesTheSilentRank"
tsan_parallel_filter="Layouts/DataParallelParity.*/ddp_w3_acc2_overlap_gpt:\
Layouts/DataParallelParity.*/zero2_w2_acc2_overlap_gpt:Layouts/DataParallelParity.*/zero3_w2_acc1_overlap_gpt:\
DataParallel/Overlap.*/ddp_overlap_slow_accum2_3ranks:DataParallel/Overlap.*/zero2_overlap_slow_2ranks"
tsan_pipeline_filter="P/PipelineMatchesReference.*/P2:P/PipelineMatchesReference.*/P3:Pipeline.FailingRankFailsEveryRank"
# The parallel tests compute their one-process reference in the parent, on the kernels' thread pool, and
# then fork the ranks: TSan cannot follow a fork of a multi-threaded process (the child dies when it starts
# a thread, or on a thread id its parent used). On one CPU the pool has no workers, so the parent forks
# with one thread; the ranks' engine threads (progress, deadlines, bucket overlap) run as ever.
one_cpu="taskset -c $(taskset -pc $$ | sed 's/.*: //; s/[-,].*//')"
tsan_env="TRIDENT_TIMEOUT=60 TSAN_OPTIONS=halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
# Bad bytes from the network and disk: each parser under libFuzzer (ASan + UBSan) for 15 s, one after
# another, on the core the TSan tests leave.
scripts/fuzz.sh 15 "${fuzz_targets[@]}" >"$logs/fuzz.log" 2>&1 &
fuzz_pid=$!
run_pair \
  tsan_test_unit_comm "env $tsan_env build-tsan/tests/test_unit_comm --gtest_filter=-Tuning.BenchTune* --gtest_brief=1" \
  tsan_test_unit_store "env $tsan_env build-tsan/tests/test_unit_store --gtest_brief=1" \
  tsan_launch "env $tsan_env build-tsan/tests/tsan_launch --gtest_brief=1 \
    --gtest_filter='Supervisor.*:BindSupervisor.*:BindMapping.*:Launcher.*:JobRounds.*'" \
  tsan_test_multiprocess_comm "env $tsan_env build-tsan/tests/test_multiprocess_comm --gtest_brief=1 \
    --gtest_filter='$tsan_comm_filter'" \
  tsan_parallel "env $tsan_env $one_cpu build-tsan/tests/tsan_parallel --gtest_brief=1 \
    --gtest_filter='$tsan_parallel_filter'" \
  tsan_pipeline "env $tsan_env build-tsan/tests/tsan_parallel --gtest_brief=1 --gtest_filter='$tsan_pipeline_filter'"
fuzz_rc=0
wait "$fuzz_pid" || fuzz_rc=$?
cat "$logs/fuzz.log"
lap "TSan tests and fuzz"
if ((fuzz_rc != 0)); then
  echo "fuzz failed (exit $fuzz_rc)"
  exit "$fuzz_rc"
fi

# What was skipped, and why (the release build's ctest run).
echo "== skipped tests"
echo "$skips"
# The CPU kernels' ISA levels this machine could not run (each a skipped Levels/IsaLevel.RunsOnThisCpu
# sub-test): their kernels went untested in this run.
echo "== ISA levels not run on this CPU"
grep -o 'IsaLevel\.RunsOnThisCpu/[a-z0-9]*' <<<"$skips" | sed 's|.*/||' | paste -sd ' ' - | grep . ||
  echo "none: every level ran"
