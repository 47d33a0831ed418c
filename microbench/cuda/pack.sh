#!/usr/bin/env bash
# Packs what microbench/cuda/run_device.sh needs on a GPU machine that cannot build trident (no Debian
# packages, no network): the binaries of a build folder, the shared libraries they load that are not
# glibc's or CUDA's own (OpenBLAS, fmt, OpenMPI, SentencePiece, ...; the GPU machine brings its CUDA runtime,
# cuBLAS and NCCL), and the corpus and GPT-2 BPE files the runs read. One compressed file, small enough to
# travel with the working tree.
# Usage (repo root): microbench/cuda/pack.sh [build-dir] [out-file]
#   DATA: folder with tinyshakespeare/input.txt and gpt2-bpe/ (default ../shared/data)
# On the GPU machine: tar xzf FILE -C /tmp && LD_LIBRARY_PATH=/tmp/trident-gpu/lib:... \
#   SKIP_BUILD=1 DATA=/tmp/trident-gpu/data microbench/cuda/run_device.sh /tmp/trident-gpu
set -euo pipefail
B=${1:-build}
F=${2:-.device/trident-gpu.tgz}
DATA=${DATA:-$PWD/../shared/data}
for f in trident bench_cuda tests/test_unit_cuda; do
  [ -x "$B/$f" ] || { echo "pack.sh: $B/$f is missing: build it (ninja -C $B trident bench_cuda test_unit_cuda; bench_cuda needs -DTRIDENT_BUILD_BENCH=ON)" >&2; exit 1; }
done
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
R=$W/trident-gpu
mkdir -p "$R/tests" "$R/lib" "$R/data"
cp "$B/trident" "$B/bench_cuda" "$R/"
cp "$B/tests/test_unit_cuda" "$R/tests/"
strip "$R/trident" "$R/bench_cuda" "$R/tests/test_unit_cuda"
# Everything the binaries load except the C library's own parts, the driver, cuBLAS and NCCL (the GPU
# machine's; they are too large to travel). The CUDA runtime travels: 13.x runs on that machine's driver.
ldd "$B/trident" "$B/bench_cuda" "$B/tests/test_unit_cuda" | awk '$3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++.so*|libgcc_s.so*|libz.so*) ;;
      libcuda.so*|libcublas*|libnccl*|libnvidia*) ;;
      *) cp -L "$path" "$R/lib/$name" ;;
    esac
  done
cp -r "$DATA/tinyshakespeare" "$DATA/gpt2-bpe" "$R/data/"
mkdir -p "$(dirname "$F")"
tar czf "$F" -C "$W" trident-gpu
echo "$F: $(du -h "$F" | cut -f1) ($(ls "$R/lib" | wc -l) libraries: $(ls "$R/lib" | tr '\n' ' '))"
