#!/usr/bin/env bash
# Builds the CUDA targets in Release, runs the CUDA unit tests and bench_cuda; logs go to ${OUT:-.}.
# Usage (repo root, on a machine with a GPU): microbench/cuda/run_device.sh [build-dir]
set -u
OUT=${OUT:-$PWD/cuda-run}
B=${1:-build-cuda-release}
mkdir -p "$OUT"
{ nvidia-smi; nvcc --version; } > "$OUT/device.txt" 2>&1
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DTRIDENT_BUILD_BENCH=ON > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build "$B" -j16 --target test_unit_cuda bench_cuda > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; tail -20 "$OUT/build.log"; exit 1; }
echo "build ok"
timeout 300 "$B/tests/test_unit_cuda" > "$OUT/test.log" 2>&1; echo "test_unit_cuda rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |worst|timeout raised|device 0" "$OUT/test.log"
grep -B2 -A6 "Failure" "$OUT/test.log" | head -60
timeout 240 "$B/bench_cuda" ${BENCH_ARGS:-} > "$OUT/bench.md" 2>&1; echo "bench_cuda rc=$?"
cat "$OUT/bench.md"
