#!/usr/bin/env bash
# Mutation check: applies each deliberate bug of tests/mutants/mutants.tsv, one at a time, rebuilds
# incrementally, runs the tests named for it and prints which test caught it (a mutant no test catches is
# a hole in the suite: the script then exits 1). The source is restored after each mutant, whatever happens.
# Not part of CI (each mutant is a rebuild plus a test run). Usage: scripts/mutants.sh [BUILD_DIR] [NAME...]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
only=("$@")
table=tests/mutants/mutants.tsv
[ -f "$build/CMakeCache.txt" ] || { echo "mutants: configure $build first (see README)" >&2; exit 2; }
export TRIDENT_TIMEOUT=${TRIDENT_TIMEOUT:-20}  # a mutant that deadlocks fails in seconds, not minutes
backup=$(mktemp -d)
restore() { [ -n "${current:-}" ] && cp "$backup/file" "$current" && touch "$current"; current=""; }
trap 'restore; rm -rf "$backup"' EXIT
trap 'exit 130' INT TERM
built=()
results=()
missed=0
start_all=$(date +%s)
while IFS=$'\t' read -r name file script targets tests; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  if ((${#only[@]})) && [[ ! " ${only[*]} " == *" $name "* ]]; then continue; fi
  t0=$(date +%s)
  cp "$file" "$backup/file"
  current=$file
  sed -i -e "$script" "$file"
  if cmp -s "$file" "$backup/file"; then
    results+=("$name|NOT APPLIED (the sed matched nothing: update $table)|0")
    restore
    missed=1
    continue
  fi
  caught=""
  built+=(${targets//,/ })
  if ! cmake --build "$build" -j"$(nproc)" --target ${targets//,/ } >"$backup/build.log" 2>&1; then
    caught="(does not compile)"
    grep -E "error|Error" "$backup/build.log" | head -5 | sed "s/^/  $name: /" >&2
  else
    IFS=, read -ra runs <<<"$tests"
    for run in "${runs[@]}"; do
      bin=${run%%:*}
      filter=${run#*:}
      out=$(timeout 600 "$build/tests/$bin" --gtest_filter="$filter" --gtest_brief=1 2>&1)
      rc=$?
      failed=$(grep -o '^\[  FAILED  \] [A-Za-z0-9_./]*' <<<"$out" | awk '{print $4}' | sort -u | head -3 | paste -sd' ')
      if ((rc == 124)); then caught="$bin (timed out after 600 s)"; break; fi
      if ((rc != 0)); then caught="${failed:-$bin (exit $rc)}"; break; fi
    done
  fi
  restore
  secs=$(($(date +%s) - t0))
  if [ -z "$caught" ]; then
    caught="NOT CAUGHT"
    missed=1
  fi
  results+=("$name|$caught|$secs")
  echo "mutant $name: $caught (${secs}s)" >&2
done <"$table"
# Rebuild the targets of the mutants from the restored source, so the build folder matches it again.
((${#built[@]})) && cmake --build "$build" -j"$(nproc)" --target $(printf '%s\n' "${built[@]}" | sort -u) >/dev/null 2>&1
echo
echo "| mutant | caught by | seconds |"
echo "|---|---|---|"
for r in "${results[@]}"; do
  IFS='|' read -r n c s <<<"$r"
  echo "| $n | $c | $s |"
done
echo "total: $(($(date +%s) - start_all)) s"
exit $missed
