#!/usr/bin/env bash
# The installed tree works for an out-of-tree user: install to a temporary prefix, build examples/ with
# find_package(trident) and with pkg-config, run both programs at 2 ranks with the installed `trident launch`,
# and compile every installed public header on its own.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
test -x "$prefix/bin/trident"

echo "== find_package(trident CONFIG)"
cmake -S "$src/examples" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/ex" -j2 >/dev/null
"$prefix/bin/trident" launch -n 2 --master-port 0 -- "$tmp/ex/allreduce"
"$prefix/bin/trident" launch -n 2 --master-port 0 -- "$tmp/ex/data_parallel"

echo "== pkg-config trident"
pcdir=$(dirname "$(find "$prefix" -name trident.pc)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs trident)
c++ "$src/examples/allreduce.cc" -o "$tmp/allreduce_pc" $flags
"$prefix/bin/trident" launch -n 2 --master-port 0 -- "$tmp/allreduce_pc"

echo "== every public header compiles on its own"
cflags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags trident)
n=0
while read -r h; do
  [ -n "$h" ] || continue
  test -f "$prefix/include/trident/$h" || { echo "not installed: trident/$h"; exit 1; }
  printf '#include <trident/%s>\n' "$h" > "$tmp/one.cc"
  c++ $cflags -fsyntax-only -Wall -Werror "$tmp/one.cc" || { echo "does not compile alone: trident/$h"; exit 1; }
  n=$((n + 1))
done < "$build/trident_public_headers.txt"
echo "$n headers ok"
echo PASS
