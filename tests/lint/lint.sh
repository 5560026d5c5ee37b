#!/usr/bin/env bash
# Tree-wide rules of the source, checked on every run (suite 'unit'):
#   1. every header's include guard is PFCPS_ followed by its path (upper case, '/' and '.' as '_');
#   2. code, tests and build files speak of the code as it is: no issue or session numbers;
#   3. no product function (common, server, worker, kernels, tools, proto) is longer than 120 lines; measured
#      by lizard (PyPI, in tests/pyenv.sh's venv);
#   5. no text file holds a merge's conflict markers (a conflict committed unresolved);
#   4. a tracked symbolic link is relative and stays inside the tree (an absolute one, e.g. a dataset folder
#      linked into itself by a script, means something else on every other machine).
# Usage: lint.sh [SOURCE_ROOT]; PFCPS_PYTHON names the venv's python (for lizard). Without lizard the length
# rule is not checked (said so), and that is a failure under PFCPS_REQUIRE_REFERENCES (tests/reference/skip.sh).
set -uo pipefail
. "$(dirname "$0")/../expect.sh"
root=${1:-${PFCPS_SOURCE:-$(dirname "$0")/../..}}
cd "$root" || die "no source root $root"

# Files as git tracks them when this is a checkout; every file below the root otherwise.
files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -- "$@"
  else
    local pats=() p
    for p in "$@"; do pats+=(-o -name "${p##*/}"); done
    find . -type f \( -false "${pats[@]}" \) -not -path './build*' -not -path './.venv*' | sed 's|^\./||'
  fi
}

# 1. Include guards.
n=0
while IFS= read -r h; do
  [ -f "$h" ] || continue
  want=PFCPS_$(printf '%s' "$h" | tr 'a-z/.-' 'A-Z___')
  got=$(grep -m1 -E '^#ifndef ' "$h" | awk '{print $2}')
  [ "$got" = "$want" ] || fail "$h: include guard '${got:-none}', expected '$want'"
  grep -q -E "^#define $want\$" "$h" || fail "$h: no '#define $want'"
  n=$((n + 1))
done < <(files '*.h' '*.cuh')
echo "include guards: $n headers checked"

# 2. No project history in code.
hist=$(files '*.c' '*.h' '*.cu' '*.cuh' '*.cpp' '*.py' '*.sh' 'meson.build' '*.ini' '*.yaml' '*.service' \
         '*.sbatch' 'Dockerfile' | grep -v '^tests/lint/' | xargs -r grep -nE '[Ii]ssue [0-9]+|[Ss]ession [0-9]+' 2>/dev/null)
[ -z "$hist" ] || fail "issue or session numbers in code (comments explain the code as it is):"$'\n'"$hist"
echo "history references: checked"

# 5. No unresolved merge conflicts (markers at a line's start, as git writes them).
conf=$(files '*' | grep -v '^tests/lint/' | while IFS= read -r f; do
         [ -f "$f" ] && [ ! -L "$f" ] && grep -Iq . "$f" 2>/dev/null && grep -nHE '^(<{7} |>{7} |={7}$)' "$f"
       done)
[ -z "$conf" ] || fail "merge conflict markers (resolve the conflict, then commit):"$'\n'"$conf"
echo "merge conflicts: checked"

# 4. Symbolic links (a checkout only).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  nl=0
  while IFS= read -r l; do
    t=$(git cat-file -p "$(git ls-files -s -- "$l" | awk '{print $2}')")
    case "$t" in
      /*) fail "$l: a symbolic link to the absolute path $t" ;;
      *) r=$(cd "$(dirname "$l")" && realpath -m "$t")
         case "$r/" in "$(pwd -P)"/*) ;; *) fail "$l: a symbolic link out of the tree ($t)" ;; esac ;;
    esac
    nl=$((nl + 1))
  done < <(git ls-files -s | awk '$1 == "120000" {print $4}')
  echo "symbolic links: $nl checked"
fi

# 3. Function length.
py=${PFCPS_PYTHON:-python3}
if "$py" -c 'import lizard' 2>/dev/null; then
  mapfile -t src < <(files 'common/*.c' 'server/*.c' 'worker/*.c' 'kernels/*.c' 'kernels/*.cu' 'tools/*.c' 'proto/*.c')
  long=$("$py" -m lizard -C 100000 -L 120 -w "${src[@]}" 2>/dev/null)
  [ -z "$long" ] || fail "product functions over 120 lines:"$'\n'"$long"
  echo "function length: ${#src[@]} files checked"
else
  echo "function length: not checked (lizard missing from $py; tests/pyenv.sh installs it)"
  if ref_required; then fail "lizard missing (PFCPS_REQUIRE_REFERENCES=$PFCPS_REQUIRE_REFERENCES)"; fi
fi
expect_summary
