#!/usr/bin/env bash
# What a transformers release moves under attnzoo, found in minutes: the transformers-facing tests run in a
# throwaway virtual environment with every other package at its pinned version (constraints.txt) and
# transformers at VERSION (default: the newest on the package index). Not part of the gating run; it need not
# pass: its report says what to fix next (docs/testing.md, "When transformers moves").
#
#   bash scripts/transformers_drift.sh            # the newest transformers
#   bash scripts/transformers_drift.sh 5.24.0     # a given release (e.g. the lowest the package declares)
#
# Writes drift-<version>.txt (the report: failures grouped by their first error line, and the coverage table's
# verdict) in the repository root, and removes its environment afterwards.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
want=${1:-}
env_dir=$(mktemp -d "${TMPDIR:-/tmp}/attnzoo-drift.XXXXXX")
trap 'rm -rf "$env_dir"' EXIT

python3 -m venv "$env_dir/venv" || exit 2
. "$env_dir/venv/bin/activate"
python -m pip install -q --upgrade pip >/dev/null
if [ -z "$want" ]; then
    want=$(python -m pip index versions transformers 2>/dev/null | sed -n 's/^transformers (\(.*\))$/\1/p')
    [ -n "$want" ] || { echo "could not read the newest transformers from the package index; pass a version" >&2; exit 2; }
fi
echo "transformers $want in a throwaway environment ($env_dir); everything else as constraints.txt pins it"
grep -v '^transformers==' constraints.txt > "$env_dir/constraints.txt"
python -m pip install -q torch==2.13.0 -c "$env_dir/constraints.txt" || exit 2
python -m pip install -q -c "$env_dir/constraints.txt" -e ".[test]" "transformers==$want" || exit 2
got=$(python -c "import transformers; print(transformers.__version__)")
report="$repo/drift-$got.txt"

tests=(tests/peers tests/export/test_lm_export.py tests/zoo/test_modifiers.py tests/bench/test_generate.py
    tests/test_train_lm.py)
python -m pytest -n auto -q -m "not slow" -p no:cacheprovider -rfEs "${tests[@]}" > "$env_dir/pytest.log" 2>&1
status=$?
{
    echo "transformers $got (pinned: $(sed -n 's/^transformers==//p' constraints.txt)); pytest exit $status"
    tail -n 1 "$env_dir/pytest.log"
    echo
    echo "## failures and errors, grouped by their message"
    grep -E '^(FAILED|ERROR) ' "$env_dir/pytest.log" | sed -E 's/^(FAILED|ERROR) [^ ]+ - //' | cut -c1-200 \
        | sort | uniq -c | sort -rn
    echo
    echo "## the coverage table (peers/coverage.json) against this release"
    grep -E 'SKIPPED .*coverage\.json|test_coverage.*(FAILED|coverage\.json)' "$env_dir/pytest.log" | cut -c1-600
    echo
    echo "## every failing test"
    grep -E '^(FAILED|ERROR) ' "$env_dir/pytest.log" | cut -d' ' -f2 | sort
} > "$report"
cat "$report"
echo "wrote $report"
exit 0
