#!/usr/bin/env bash
# Runs every command line of README.md's "Using it" block as written, with small sizes: `trident` is replaced by
# a wrapper that rewrites the size options of each subcommand (a value given on the line is replaced, a missing
# one appended), so the lines themselves, their flags and the files they read and write are exercised.
# Runs in a fresh folder holding data/tinyshakespeare/input.txt (the shared corpus where it exists, else
# generated text) and a link to configs/; fails naming the line that failed. Writes nothing in the source tree.
# Usage: tests/readme/readme_examples.sh SOURCE_DIR TRIDENT_BIN
set -euo pipefail
src=$(cd "$1" && pwd)
bin=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
work=$(mktemp -d "${TMPDIR:-/tmp}/trident-readme.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

mkdir -p data/tinyshakespeare
if [ -f "$src/../shared/data/tinyshakespeare/input.txt" ]; then
  head -c 200000 "$src/../shared/data/tinyshakespeare/input.txt" > data/tinyshakespeare/input.txt
else
  for i in $(seq 1 3000); do echo "ROMEO: line $i of a made-up play, said the fool to the king."; done \
    > data/tinyshakespeare/input.txt
fi
ln -s "$src/configs" configs

# The wrapper: overrides per subcommand, as `--key value` pairs (keys compared with dashes as underscores).
cat > trident-small <<WRAP
#!/usr/bin/env bash
bin="$bin"
WRAP
cat >> trident-small <<'WRAP'
sub="$1"; [ "$sub" = bench ] && sub="bench $2"
case "$sub" in
  train) over=(--max_iters 3 --eval_interval 2 --eval_iters 1 --n_layer 2 --n_head 2 --n_embd 16 --block_size 16
               --batch_size 4 --sample_tokens 8 --threads 1 --log_interval 1) ;;
  eval) over=(--windows 4) ;;
  sample) over=(--tokens 16) ;;
  "bench comm") over=(-e 64K --iters 2 --warmup 1) ;;
  launch) over=(--master-port 0) ;;  # a port of its own, not 29500, beside other tests
  *) over=() ;;
esac
norm() { local k="${1%%=*}"; echo "${k//-/_}"; }
declare -A want=() used=()
for ((i = 0; i < ${#over[@]}; i += 2)); do want[$(norm "${over[i]}")]="${over[i+1]}"; done
# The subcommand's own words first; a missing override goes right after them (before any `--`).
lead=("$1"); shift
[ "${lead[0]}" = bench ] && { lead+=("$1"); shift; }
args=()
while (($#)); do
  a="$1"; shift
  k=$(norm "$a")
  if [[ "$a" == -* && -n "${want[$k]+x}" ]]; then
    used[$k]=1
    if [[ "$a" == *=* ]]; then args+=("${a%%=*}=${want[$k]}"); else args+=("$a" "${want[$k]}"); shift; fi
  else
    args+=("$a")
  fi
done
extra=()
for ((i = 0; i < ${#over[@]}; i += 2)); do
  k=$(norm "${over[i]}"); [ -n "${used[$k]+x}" ] || extra+=("${over[i]}" "${over[i+1]}")
done
exec "$bin" "${lead[@]}" "${extra[@]}" "${args[@]}"
WRAP
chmod +x trident-small

# The block: from "## Using it" to the end of its first ```sh fence; backslash continuations joined.
block=$(awk '/^## Using it/{f=1} f&&/^```sh/{inb=1; next} inb&&/^```/{exit} inb{print}' "$src/README.md")
[ -n "$block" ] || { echo "readme_examples: no \`\`\`sh block under '## Using it' in README.md" >&2; exit 1; }
lines=()
cur=""
while IFS= read -r l; do
  if [[ "$l" == *\\ ]]; then cur+="${l%\\} "; continue; fi
  cur+="$l"; lines+=("$cur"); cur=""
done <<< "$block"

n=0
for line in "${lines[@]}"; do
  [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
  if [[ "$line" =~ ^B= ]]; then B="$work/trident-small"; continue; fi
  [[ "$line" == '$B '* ]] || { echo "readme_examples: a line that is not a \$B command: $line" >&2; exit 1; }
  n=$((n + 1))
  echo "== $line"
  if ! (eval "$line") > "run$n.log" 2>&1; then
    echo "readme_examples: FAILED: $line" >&2
    tail -30 "run$n.log" >&2
    exit 1
  fi
  tail -3 "run$n.log"
done
[ "$n" -ge 8 ] || { echo "readme_examples: only $n command lines found in README.md" >&2; exit 1; }
# What the lines said they write is there.
for f in out/shakespeare-char/latest out/3d/trace.json out/simulate.json out/busbw.html out/plan.html; do
  [ -s "$f" ] || { echo "readme_examples: $f was not written" >&2; exit 1; }
done
echo "readme_examples: $n README command lines ran"
