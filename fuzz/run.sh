#!/usr/bin/env bash
# Run each fuzz harness for SECONDS (default 60) from a scratch copy of its seed corpus.
#
#   bash fuzz/run.sh [SECONDS]
#
# Environment: PYTHON (default .venv/bin/python), FUZZ_ARGS (extra libFuzzer flags, e.g.
# "-workers=8 -jobs=8"), FUZZ_HARNESSES (default "control session").
# Work dirs: fuzz/work/<harness>/ (grown corpus, log); crashes: fuzz/crashes/<harness>-*.
# Exits non-zero if any harness crashed, timed out, ran out of memory or could not start.
set -euo pipefail

SECONDS_PER_HARNESS="${1:-60}"
if ! [[ "$SECONDS_PER_HARNESS" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: bash fuzz/run.sh [SECONDS]  (a positive integer, got '$SECONDS_PER_HARNESS')" >&2
    exit 2
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-.venv/bin/python}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
read -r -a EXTRA_ARGS <<< "${FUZZ_ARGS:-}"
read -r -a HARNESSES <<< "${FUZZ_HARNESSES:-control session}"

if ! "$PYTHON" -c "import atheris" 2>/dev/null; then
    echo "fuzz/run.sh: atheris is not importable by $PYTHON" >&2
    exit 2
fi

mkdir -p fuzz/work fuzz/crashes
failed=()
for name in "${HARNESSES[@]}"; do
    harness="fuzz/fuzz_${name}.py"
    seeds="fuzz/corpus/${name}"
    work="fuzz/work/${name}"
    if [[ ! -f "$harness" || ! -d "$seeds" ]]; then
        echo "fuzz/run.sh: no harness $harness or seeds $seeds" >&2
        exit 2
    fi
    mkdir -p "$work/corpus"
    cp -f "$seeds"/* "$work/corpus/"
    dict=()
    if [[ -f "fuzz/dict/${name}.dict" ]]; then
        dict=("-dict=fuzz/dict/${name}.dict")
    fi
    echo "== fuzz_${name}: ${SECONDS_PER_HARNESS}s, corpus $work/corpus"
    status=0
    "$PYTHON" "$harness" \
        -max_total_time="$SECONDS_PER_HARNESS" \
        -rss_limit_mb=2048 \
        -timeout=30 \
        -max_len=12288 \
        -print_final_stats=1 \
        -artifact_prefix="fuzz/crashes/${name}-" \
        "${dict[@]}" \
        "${EXTRA_ARGS[@]}" \
        "$work/corpus" >"$work/log" 2>&1 || status=$?
    if [[ "$status" -ne 0 ]]; then
        tail -n 60 "$work/log" >&2
        echo "== fuzz_${name}: FAILED (exit $status); log $work/log; artifacts fuzz/crashes/${name}-*" >&2
        failed+=("$name")
    else
        runs="$(awk '/^stat::number_of_executed_units:/ {print $2; exit}' "$work/log")"
        rate="$(awk '/^stat::average_exec_per_sec:/ {print $2; exit}' "$work/log")"
        size="$(find "$work/corpus" -type f | wc -l | tr -d ' ')"
        echo "== fuzz_${name}: ok, ${runs} runs, ${rate} exec/s, corpus ${size} files"
    fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz/run.sh: crashes in: ${failed[*]}" >&2
    exit 1
fi
