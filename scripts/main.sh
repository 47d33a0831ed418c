#!/usr/bin/env bash
# The main job: installs what is missing (Debian packages, the `fortunes` corpus), builds trident, and trains
# the default GPT (nanoGPT's CPU configuration, character level) on the fortunes text with data parallelism
# over 2 local processes (DDP). Extra arguments go to `trident train` (e.g. --max_iters 200, --nproc 4,
# --parallel zero1, --data my.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh main
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTRIDENT_BUILD_TESTS=OFF -DTRIDENT_BUILD_BENCH=OFF >/dev/null
cmake --build build -j"$(nproc)" --target trident
exec ./build/trident train --config configs/fortunes_char.json --nproc 2 --parallel ddp --threads 1 "$@"
