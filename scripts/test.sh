#!/usr/bin/env bash
# Builds trident and runs every test: the release build's whole suite, then the communication layer and
# the store again under AddressSanitizer + UndefinedBehaviorSanitizer. This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh build
# Every reference a test needs is installed above, so a skip for a missing package or tool is a failure
# here (tests/harness/skip.h); only what the machine cannot change (no GPU, no privilege) may skip.
export CI="${CI:-true}"
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTRIDENT_BUILD_BENCH=ON >/dev/null
cmake --build build -j"$jobs"
# The skipped tests and why are listed at the end, whether the run passed or failed.
ctest_rc=0
(cd build && ctest --output-on-failure --timeout 900 -j"$jobs") || ctest_rc=$?
skips=$(scripts/skipped_tests.py build || true)
((ctest_rc == 0)) || { echo "$skips"; exit "$ctest_rc"; }
# Sanitizers over the layers where memory and concurrency bugs hide: store, transports, engine, algorithms.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTRIDENT_SANITIZE=ON -DTRIDENT_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$jobs" --target test_unit_store test_unit_algorithms test_unit_comm test_multiprocess_comm
# Run the binaries themselves (ctest would also list the targets this build skips). Left to the release
# build: 8-rank sweeps (under ASan on 2 cores they only add minutes) and tests that drive the `trident`
# CLI, which this build does not compile.
for t in test_unit_store test_unit_algorithms test_unit_comm test_multiprocess_comm; do
  echo "== $t (ASan+UBSan)"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    build-asan/tests/$t --gtest_filter='-*w8_*:Tuning.BenchTune*' --gtest_brief=1
done
# Bad bytes from the network and disk: every libFuzzer target (tests/fuzz) for 15 s under ASan + UBSan.
scripts/fuzz.sh 15
# What was skipped, and why (the release build's ctest run).
echo "== skipped tests"
echo "$skips"
