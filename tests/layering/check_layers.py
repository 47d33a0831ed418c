#!/usr/bin/env python3
"""Checks every `#include "trident/..."` in src/ and tools/ against the allowed-dependency table of
docs/ARCHITECTURE.md (its ```layers block: the one machine-readable copy of the table).

A file belongs to the layer whose path pattern matches it (the longest pattern wins); an included header
belongs to a layer the same way. A layer may include itself and, transitively, every layer its `may include`
column names (as CMake's PUBLIC links do). Prints one line per violation naming the file, its line, the
include and both layers, and exits 1; exits 2 when the table itself is malformed or leaves a file unowned.

Usage: tests/layering/check_layers.py [SOURCE_DIR]
"""
import fnmatch
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"(trident/[^"]+)"')


def read_table(doc):
    text = open(doc, encoding="utf-8").read()
    m = re.search(r"^```layers\n(.*?)^```", text, re.S | re.M)
    if not m:
        sys.exit(f"check_layers: no ```layers block in {doc}")
    layers, order = {}, []
    for n, line in enumerate(m.group(1).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        cols = [c.strip() for c in line.split("|")]
        if len(cols) != 3 or not cols[0]:
            print(f"check_layers: {doc} layers block line {n}: want `layer | paths | may include`: {line}")
            sys.exit(2)
        name, paths, deps = cols
        deps = [] if deps in ("", "-") else deps.split()
        layers[name] = {"paths": paths.split(), "deps": deps}
        order.append(name)
    for name, l in layers.items():
        for d in l["deps"]:
            if d not in layers:
                print(f"check_layers: layer '{name}' may include '{d}', which the table does not define")
                sys.exit(2)
    return layers, order


def closure(layers):
    allowed = {}
    for name in layers:
        seen, todo = {name}, list(layers[name]["deps"])
        while todo:
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo.extend(layers[d]["deps"])
        allowed[name] = seen
    return allowed


def owner(path, layers):
    best, best_len = None, -1
    for name, l in layers.items():
        for p in l["paths"]:
            hit = path.startswith(p) if p.endswith("/") else fnmatch.fnmatch(path, p)
            if hit and len(p) > best_len:
                best, best_len = name, len(p)
    return best


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    layers, _ = read_table(os.path.join(root, "docs", "ARCHITECTURE.md"))
    allowed = closure(layers)
    bad, unowned, files = [], [], 0
    for top in ("src", "tools"):
        for d, _, names in os.walk(os.path.join(root, top)):
            for f in sorted(names):
                if not f.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                rel = os.path.relpath(os.path.join(d, f), root)
                mine = owner(rel, layers)
                if mine is None:
                    unowned.append(rel)
                    continue
                files += 1
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = "src/" + m.group(1)
                        theirs = owner(target, layers)
                        if theirs is None:
                            bad.append(f"{rel}:{n}: #include \"{m.group(1)}\" is in no layer of the table")
                        elif theirs not in allowed[mine]:
                            bad.append(f"{rel}:{n}: #include \"{m.group(1)}\": layer '{mine}' may not include "
                                       f"layer '{theirs}' (docs/ARCHITECTURE.md, allowed dependencies)")
    if unowned:
        for u in unowned:
            print(f"check_layers: {u} belongs to no layer: add its folder to docs/ARCHITECTURE.md's table")
        sys.exit(2)
    for b in bad:
        print(b)
    if bad:
        print(f"check_layers: {len(bad)} include(s) against the layering, in {files} files")
        sys.exit(1)
    print(f"check_layers: {files} files, every trident include allowed by the table")


if __name__ == "__main__":
    main()
