#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang-16, ASan + UBSan) in build-fuzz and runs each from its
# seed corpus for a bounded time. Fails on any crash, leak, sanitizer report, timeout (hang) or
# out-of-memory. Usage: scripts/fuzz.sh [seconds per target, default 15] [target ...]
# What a run finds is written to build-fuzz/findings/<target>/ (crash-*, leak-*, timeout-* inputs);
# reproduce one with: build-fuzz/tests/fuzz/<target> <that file>. FUZZ_BUILD_ONLY=1 builds and runs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-15}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(fuzz_store_request fuzz_frame_header fuzz_safetensors fuzz_checkpoint_json fuzz_train_config)
# -O1 with line tables (a report's file:line), as the sanitizer builds of scripts/test.sh; Ninja where
# installed (it builds the targets together, where make builds them one after another); files in unity
# batches, as scripts/test.sh's builds, redone file by file should a batch fail.
gen=()
[[ -f build-fuzz/CMakeCache.txt ]] || ! command -v ninja >/dev/null || gen=(-GNinja)
cmake -S . -B build-fuzz "${gen[@]}" -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" -DTRIDENT_FUZZ=ON \
      -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 -DCMAKE_UNITY_BUILD=ON >/dev/null
if ! cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]}"; then
  echo "== build-fuzz: the batched (unity) build failed; building file by file. If it then passes, two files of" \
       "one target define the same file-local name: list one in the root CMakeLists.txt's unity block."
  cmake -S . -B build-fuzz -DCMAKE_UNITY_BUILD=OFF >/dev/null
  cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]}"
fi
[[ "${FUZZ_BUILD_ONLY:-0}" == 1 ]] && exit 0
for t in "${targets[@]}"; do
  echo "== $t (${secs}s, ASan+UBSan)"
  work=build-fuzz/corpus/$t findings=build-fuzz/findings/$t
  mkdir -p "$work" "$findings"
  # New inputs go to build-fuzz/corpus (never the committed seeds); -timeout: a hang is an input that takes
  # over 10 s; -rss_limit_mb: a parser that allocates what the bytes claim is a finding.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    build-fuzz/tests/fuzz/$t "$work" "tests/fuzz/corpus/$t" -max_total_time="$secs" -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$findings/" -print_final_stats=1 2>&1 | tail -n 12
done
