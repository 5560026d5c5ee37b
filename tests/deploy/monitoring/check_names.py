#!/usr/bin/env python3
"""Every metric name deploy/monitoring uses must be a family docs/metrics.md lists.

usage: check_names.py DOCS_METRICS_MD FILE...

DOCS_METRICS_MD's tables give each family (first column, in backquotes) and its type (second column); a
histogram family also stands for its _bucket, _sum and _count series. Each FILE is searched for names
starting with pfcps_ or process_: a .json file (the Grafana dashboard) in the strings of its "expr" keys, any
other file (alert rules, scrape configs) in its whole text. Prints each name not found, with the file, and
exits 1 if any; else prints how many names were checked and exits 0. A name in a .json "expr" must also be
used at least once overall (no dashboard without queries): a file with no name at all fails.
"""
import json
import re
import sys

NAME = re.compile(r"\b(?:pfcps|process)_[a-zA-Z0-9_]*[a-zA-Z0-9]")


def families(path):
    """{family: type} from the markdown tables of docs/metrics.md."""
    fam = {}
    row = re.compile(r"^\|\s*`([a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(counter|gauge|histogram)\s*\|")
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = row.match(line)
            if m:
                fam[m.group(1)] = m.group(2)
    return fam


def exprs(path):
    """The texts to search in path: the "expr" strings of a JSON file, else the whole file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not path.endswith(".json"):
        return [text]
    out = []

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "expr" and isinstance(x, str):
                    out.append(x)
                else:
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(json.loads(text))
    return out


def known(name, fam):
    if name in fam:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and fam.get(name[: -len(suffix)]) == "histogram":
            return True
    return False


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    fam = families(argv[1])
    if not fam:
        print(f"{argv[1]}: no metric families found", file=sys.stderr)
        return 1
    bad = 0
    checked = set()
    for path in argv[2:]:
        names = {n for t in exprs(path) for n in NAME.findall(t)}
        if not names:
            print(f"{path}: no metric name found")
            bad += 1
        for n in sorted(names):
            checked.add(n)
            if not known(n, fam):
                print(f"{path}: {n} is not a family of {argv[1]}")
                bad += 1
    print(f"{len(checked)} metric names checked against {len(fam)} families, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
