#!/usr/bin/env python3
"""Lists every skipped test of a ctest run with its reason, from ctest's log (Testing/Temporary/LastTest.log).

Usage: scripts/skipped_tests.py BUILD_DIR
A skip is a gtest "[  SKIPPED ]" test; its reason is the message gtest printed under "Skipped". Prints one
line per skipped test ("SKIPPED  Suite.Name: reason") and a count; nothing to list prints "no test skipped".
"""
import re
import sys
from pathlib import Path


def skipped(log_text):
    # Each test's record: "N/M Test: NAME" ... "Output:" ... "<end of output>".
    for m in re.finditer(r"^\d+/\d+ Test: (.+?)\n(.*?)<end of output>", log_text, re.S | re.M):
        name, body = m.group(1).strip(), m.group(2)
        if "[  SKIPPED ]" not in body:
            continue
        reason = ""
        r = re.search(r": Skipped\n(.*?)\n\[  SKIPPED \]", body, re.S)
        if r:
            reason = " ".join(line.strip() for line in r.group(1).splitlines() if line.strip())
        yield name, reason or "(no reason given)"


def main():
    build = Path(sys.argv[1] if len(sys.argv) > 1 else "build")
    log = build / "Testing" / "Temporary" / "LastTest.log"
    if not log.exists():
        print(f"skipped_tests: no ctest log at {log}", file=sys.stderr)
        return 1
    rows = list(skipped(log.read_text(errors="replace")))
    for name, reason in rows:
        print(f"SKIPPED  {name}: {reason}")
    print(f"{len(rows)} test(s) skipped" if rows else "no test skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
