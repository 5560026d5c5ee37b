#!/usr/bin/env python3
"""Sums meson testlog.json files into the one closing line 'N passed, N failed, N skipped'.

usage: summary.py NAME=testlog.json ... -- [build failure text ...]
Exit status 1 when anything failed (a test, or a build named after --)."""
import json
import sys

args = sys.argv[1:]
sep = args.index("--") if "--" in args else len(args)
logs, build_failures = args[:sep], args[sep + 1:]
passed = failed = skipped = 0
failed_names = []
for item in logs:
    name, _, path = item.partition("=")
    try:
        lines = open(path).read().splitlines()
    except OSError:
        build_failures.append(f"{name}: no test log ({path})")
        continue
    for line in lines:
        if not line.strip():
            continue
        t = json.loads(line)
        r = t.get("result", "")
        if r in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
            failed_names.append(f"{name}: {t.get('name')} ({r})")
failed += len(build_failures)
for f in failed_names + build_failures:
    print("FAILED:", f)
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
