#!/usr/bin/env bash
# Line and branch coverage per layer (docs/ARCHITECTURE.md's table): builds with --coverage into its own
# directory, runs the ctest suite there, and prints the figures (scripts/coverage_by_layer.py). Not part of
# CI (a -O0 instrumented build and a slower suite: about as long as CI itself).
# Usage: scripts/coverage.sh [BUILD_DIR] [CTEST_ARGS...]   (default build-coverage; e.g. `-L unit` for a subset)
# JOBS=N caps the build and ctest (default: nproc). COVERAGE_FILES=1 also lists, per layer, the files with
# the most uncovered lines.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-coverage}
shift || true
if ! command -v gcovr >/dev/null; then  # Debian's gcovr, installed here: the build and CI do not need it
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends gcovr >/dev/null
fi
jobs=${JOBS:-$(nproc)}  # JOBS=2 on a shared machine
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# ccache's CCACHE_BASEDIR rewrites source paths relative to each object's folder, and gcov then cannot find
# the sources ("Cannot open source file ../../src/..."): coverage objects keep absolute paths.
unset CCACHE_BASEDIR
# The libraries compile in unity batches, as in CI (scripts/test.sh): a fraction of the CPU of a
# file-by-file build; gcov still counts each line in its own source file (the batch only includes them).
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -g --coverage -DTRIDENT_COVERAGE" \
  -DCMAKE_EXE_LINKER_FLAGS=--coverage -DCMAKE_SHARED_LINKER_FLAGS=--coverage "${launcher[@]}" \
  -DTRIDENT_BUILD_BENCH=OFF -DCMAKE_CUDA_COMPILER=NOTFOUND -DCMAKE_UNITY_BUILD=ON >/dev/null
# COVERAGE_TARGETS="test_unit_comm ...": build only those (ctest then lists the rest as *_NOT_BUILT: pass
# `-E NOT_BUILT`); the figures of the layers their tests do not reach mean nothing then.
# shellcheck disable=SC2086
cmake --build "$dir" -j"$jobs" ${COVERAGE_TARGETS:+--target $COVERAGE_TARGETS}
find "$dir" -name '*.gcda' -delete  # counts from this run only
# A failing test still leaves its counts; the figures are printed either way and the exit status says.
rc=0
(cd "$dir" && ctest -j"$jobs" --timeout 900 "$@" >ctest.log 2>&1) || rc=$?
tail -n 3 "$dir/ctest.log"
# Exception-only and unreachable branches (every call that may throw has one) are left out of the branch
# figure: they say nothing about which decisions the tests took.
# gcov's counters are not atomic: threads of one rank (the engine's progress thread beside the caller,
# the kernels' pool) that bump the same counters at once can leave them inconsistent, and gcov then
# derives a negative branch count ("branch 7 taken -19") that gcovr refuses to parse. Those few branch
# lines (4 files in the last run) are skipped (--gcov-ignore-parse-errors) and the rest counted.
gcovr --root . --object-directory "$dir" --filter 'src/' --exclude-throw-branches --exclude-unreachable-branches \
  --gcov-ignore-parse-errors -j "$jobs" --json-summary "$dir/coverage-summary.json" >/dev/null
scripts/coverage_by_layer.py "$dir/coverage-summary.json" .
exit "$rc"
