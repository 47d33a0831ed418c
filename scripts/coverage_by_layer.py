#!/usr/bin/env python3
"""Line and branch coverage per layer of docs/ARCHITECTURE.md, from gcovr's per-file JSON summary.

Usage: scripts/coverage_by_layer.py SUMMARY_JSON [SOURCE_DIR]
SUMMARY_JSON is `gcovr --json-summary`'s output (paths relative to SOURCE_DIR). Every file is counted in the
layer that owns it (tests/layering/check_layers.py's rule: the longest matching path); files of no layer
(tests, examples) are left out. Also prints "comm (all)": every layer under src/trident/comm/ together.
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "layering"))
from check_layers import owner, read_table  # noqa: E402


def pct(covered, total):
    return f"{100.0 * covered / total:5.1f}%" if total else "    -"


def main():
    summary = json.load(open(sys.argv[1], encoding="utf-8"))
    src = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..")
    layers, order = read_table(os.path.join(src, "docs", "ARCHITECTURE.md"))
    rows = {name: [0, 0, 0, 0] for name in order}
    comm_all = [0, 0, 0, 0]
    files = {name: [] for name in order}
    for f in summary["files"]:
        path = f["filename"]
        layer = owner(path, layers)
        if layer is None:
            continue
        v = [f["line_covered"], f["line_total"], f["branch_covered"], f["branch_total"]]
        rows[layer] = [a + b for a, b in zip(rows[layer], v)]
        files[layer].append((v[1] - v[0], path, v))
        if path.startswith("src/trident/comm/"):
            comm_all = [a + b for a, b in zip(comm_all, v)]
    print(f"{'layer':<12} {'lines':>7} {'(covered/total)':>17} {'branches':>9} {'(covered/total)':>17}")
    for name in order + ["comm (all)"]:
        lc, lt, bc, bt = comm_all if name == "comm (all)" else rows[name]
        if lt == 0:
            continue
        print(f"{name:<12} {pct(lc, lt):>7} {f'{lc}/{lt}':>17} {pct(bc, bt):>9} {f'{bc}/{bt}':>17}")
    if os.environ.get("COVERAGE_FILES"):  # the files with the most uncovered lines, per layer
        for name in order:
            for missed, path, (lc, lt, bc, bt) in sorted(files[name], reverse=True)[:5]:
                if missed:
                    print(f"  {name:<10} {missed:5d} lines uncovered  {pct(lc, lt)}  {path}")


if __name__ == "__main__":
    main()
