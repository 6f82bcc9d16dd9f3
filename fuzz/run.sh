#!/usr/bin/env bash
# Run each fuzz harness until it has executed FUZZ_RUNS inputs (default 100,000), for at most
# SECONDS (default 60), from a scratch copy of its seed corpus, in FUZZ_JOBS processes at once
# (default: one per CPU) that share the corpus.
#
#   bash fuzz/run.sh [SECONDS]
#   FUZZ_RUNS=0 bash fuzz/run.sh 3600     # no target: each harness fuzzes for the whole hour
#
# Environment: PYTHON (default .venv/bin/python), FUZZ_ARGS (extra libFuzzer flags),
# FUZZ_HARNESSES (default "control session wire http listen realtime"), FUZZ_JOBS (default nproc), FUZZ_RUNS
# (default 100000; a harness that reaches SECONDS first has fallen short).
# Work dirs: fuzz/work/<harness>/ (grown corpus, log.N); crashes: fuzz/crashes/<harness>-*.
# Exits non-zero if any harness crashed, timed out, ran out of memory, could not start, or
# fell short of FUZZ_RUNS.
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
read -r -a HARNESSES <<< "${FUZZ_HARNESSES:-control session wire http listen realtime}"
JOBS="${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}"
RUNS="${FUZZ_RUNS:-100000}"
if ! [[ "$JOBS" =~ ^[1-9][0-9]*$ && "$RUNS" =~ ^[0-9]+$ ]]; then
    echo "fuzz/run.sh: FUZZ_JOBS must be a positive integer, FUZZ_RUNS an integer" >&2
    exit 2
fi
# Each process stops after its share of the runs (libFuzzer -runs; -1: no limit).
PER_JOB=-1
if [[ "$RUNS" -gt 0 ]]; then
    PER_JOB=$(((RUNS + JOBS - 1) / JOBS))
fi

if ! "$PYTHON" -c "import atheris" 2>/dev/null; then
    echo "fuzz/run.sh: atheris is not importable by $PYTHON" >&2
    exit 2
fi

mkdir -p fuzz/work fuzz/crashes
failed=()
summary=()
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
    echo "== fuzz_${name}: ${RUNS} runs within ${SECONDS_PER_HARNESS}s, ${JOBS} processes, corpus $work/corpus"
    pids=()
    started=$(date +%s)
    for ((job = 1; job <= JOBS; job++)); do
        # Each process mutates with its own seed and picks up the others' finds from the
        # shared corpus folder (libFuzzer's -reload).
        "$PYTHON" "$harness" \
            -max_total_time="$SECONDS_PER_HARNESS" \
            -runs="$PER_JOB" \
            -rss_limit_mb=2048 \
            -timeout=30 \
            -max_len=12288 \
            -print_final_stats=1 \
            -artifact_prefix="fuzz/crashes/${name}-" \
            "${dict[@]}" \
            "${EXTRA_ARGS[@]}" \
            "$work/corpus" >"$work/log.$job" 2>&1 &
        pids+=("$!")
    done
    status=0
    for ((job = 1; job <= JOBS; job++)); do
        code=0
        wait "${pids[$((job - 1))]}" || code=$?
        if [[ "$code" -ne 0 ]]; then
            tail -n 60 "$work/log.$job" >&2
            echo "== fuzz_${name}: process $job FAILED (exit $code); log $work/log.$job" >&2
            status=1
        fi
    done
    runs=0
    rate=0
    for ((job = 1; job <= JOBS; job++)); do
        n="$(awk '/^stat::number_of_executed_units:/ {print $2; exit}' "$work/log.$job")"
        r="$(awk '/^stat::average_exec_per_sec:/ {print $2; exit}' "$work/log.$job")"
        runs=$((runs + ${n:-0}))
        rate=$((rate + ${r:-0}))
    done
    took=$(($(date +%s) - started))
    size="$(find "$work/corpus" -type f | wc -l | tr -d ' ')"
    line="fuzz_${name}: ${runs} runs in ${took}s, ${rate} exec/s (${JOBS} processes), corpus ${size} files"
    summary+=("$line")
    if [[ "$status" -ne 0 ]]; then
        echo "== ${line}; artifacts fuzz/crashes/${name}-*" >&2
        failed+=("$name (crashed)")
    elif [[ "$runs" -lt "$RUNS" ]]; then
        echo "== ${line}: FELL SHORT of ${RUNS} runs in ${SECONDS_PER_HARNESS}s" >&2
        failed+=("$name (${runs} < ${RUNS} runs)")
    else
        echo "== ${line}: ok"
    fi
done

echo "== summary"
printf '   %s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz/run.sh: failed: ${failed[*]}" >&2
    exit 1
fi
