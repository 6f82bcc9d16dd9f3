"""bench/report.py renders a table and plots from a record (no benchmark is run here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402


def _record() -> dict[str, Any]:
    quantiles = [i / 200 * 0.05 for i in range(201)]
    paced_rows = [
        {"server": kind, "streams": n, "p99": 0.01 * n / 100, "quantiles": quantiles}
        for n in (50, 100)
        for kind in ("talkies", "bare")
    ]
    tts = {"first_over_total": [0.2], "first_over_audio": [0.05], "rtf": [0.3]}
    return {
        "date": "2026-01-01",
        "quick": True,
        "command": "bench/report.py --quick",
        "total_seconds": 12.0,
        "machine": report.machine(),
        "loadavg_before": [0.1, 0.1, 0.1],
        "loadavg_after": [0.2, 0.1, 0.1],
        "sections": {
            "ingest": {
                "best": {"talkies": 2.0, "bare": 2.1},
                "ratios": {"talkies/bare": 0.95},
                "other_load_cores": 0.0,
            },
            "paced": {"rows": paced_rows, "period": 0.02, "ratios": {"p99 talkies/bare N=50": 1}},
            "batching": {"ratios": {"batched / per-stream, as fast as possible": 3.5}},
            "vosk": {"error": "section vosk failed (1)", "other_load_cores": 0.1},
            "http": {"ratios": {"route / direct transcribe, x": 1.1}, "tts": {"tiny": tts}},
            "load": {
                "result": {
                    "engines": {
                        "vosk-ko": {"max_streams": 6, "first_failed": 8, "rss_per_stream_mb": 9.5}
                    }
                }
            },
        },
    }


def test_every_section_has_quick_and_full_parameters() -> None:
    for quick in (True, False):
        assert set(report.parameters(quick, None)) == set(report.ORDER)


def test_markdown_lists_every_ratio_and_failure() -> None:
    text = report.markdown(_record(), "2026-01-01-quick")
    assert "| ingest | talkies/bare | 0.95x | 0.0 |" in text
    assert "| vosk | failed: section vosk failed (1) |" in text
    assert "[2026-01-01-quick.json](2026-01-01-quick.json)" in text
    assert "| vosk-ko | 6 | 8 | 9.5 |" in text


def test_paced_ratios_are_the_median_of_the_runs_ratios_each_within_its_run() -> None:
    from bench import report_parts

    # talkies' p99 over the bare loop's: 2.0 in run 0, 4.0 in run 1, 1.5 in run 2 at N=100;
    # run 2 has no talkies row at N=50, so N=50 has two runs.
    p99s = {
        (0, 100): (0.004, 0.002),
        (1, 100): (0.008, 0.002),
        (2, 100): (0.003, 0.002),
        (0, 50): (0.002, 0.001),
        (1, 50): (0.003, 0.001),
    }
    rows = [
        {"server": kind, "streams": n, "run": run, "p99": p99}
        for (run, n), pair in p99s.items()
        for kind, p99 in zip(("talkies", "bare"), pair, strict=True)
    ]
    rows.append({"server": "bare", "streams": 50, "run": 2, "p99": 0.0001})
    ratios, spread = report_parts.paced_ratios(rows)
    assert ratios == pytest.approx({"p99 talkies/bare N=100": 2.0, "p99 talkies/bare N=50": 2.5})
    assert spread["p99 talkies/bare N=100"] == pytest.approx([1.5, 4.0, 3])
    assert spread["p99 talkies/bare N=50"] == pytest.approx([2.0, 3.0, 2])

    # CPU per paced frame, where the rows have it: 0.6 cores for 5,000 frames against 0.5.
    for row in rows:
        if row["streams"] == 100:
            row |= {"server_cores": 0.6 if row["server"] == "talkies" else 0.5, "frames_sent": 5000}
    cpu = report_parts.paced_ratios(rows)[0]
    assert cpu["CPU per frame talkies/bare N=100"] == pytest.approx(1.2)
    assert "CPU per frame talkies/bare N=50" not in cpu

    record = _record()
    record["sections"]["paced"] |= {"ratios": ratios, "spread": spread, "repeat": 3}
    text = report.markdown(record, "x")
    assert "| paced | p99 talkies/bare N=100 | 2.00x (runs: 1.50x-4.00x, 3) |" in text
    assert "3 runs of each N (the Ns interleaved), each ratio the median" in text

    # The plots draw one run per server and N: the one with the median p99 (of two, the
    # lower; of equal p99s, the earlier run).
    shown = report.median_runs(rows)
    assert sorted((r["server"], r["streams"], r["run"]) for r in shown) == [
        ("bare", 50, 0),  # 0.0001 (run 2), 0.001 (run 0), 0.001 (run 1)
        ("bare", 100, 1),  # 0.002 in all three
        ("talkies", 50, 0),  # 0.002 (run 0), 0.003 (run 1)
        ("talkies", 100, 0),  # 0.003 (run 2), 0.004 (run 0), 0.008 (run 1)
    ]


def test_the_paced_note_says_how_the_servers_took_turns() -> None:
    record = _record()
    paced = record["sections"]["paced"]
    paced["cores"] = {"server": [0], "client": [1]}
    paced["turn"] = 0.5
    text = report.markdown(record, "2026-01-01-quick")
    assert "paced: every server on cores [0], the client on core 1; for each N every " in text
    assert "alternating turns of 0.5 s (ABBA)" in text
    paced["turn"] = 0.0
    assert "a fresh server process for each N, one after the other" in report.markdown(
        record, "2026-01-01-quick"
    )


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    made = report.plots(_record(), tmp_path, "stem")
    assert "stem-latency-cdf.png" in made and "stem-streams-p99.png" in made
    assert "stem-tts-first-audio.png" in made
    for name in made:
        assert (tmp_path / name).stat().st_size > 1000


def test_the_paced_section_paces_every_server_in_turns() -> None:
    """report_parts.paced for real, tiny: two servers at once, the CDF client, a row each."""
    from bench import report_parts

    # 20 streams: enough CPU in each server's turns (tens of ms) for /proc's 10 ms ticks to
    # count some; 3 streams' few ms could read as none.
    params = {
        "streams": [20],
        "duration": 0.4,
        "servers": ["talkies", "bare"],
        "turn": 0.2,
        "repeat": 2,
    }
    result = report_parts.paced(params)
    assert result["turn"] == 0.2 and result["repeat"] == 2
    runs = sorted((row["run"], row["server"]) for row in result["rows"])
    assert runs == [(0, "bare"), (0, "talkies"), (1, "bare"), (1, "talkies")]
    for row in result["rows"]:
        assert row["connected"] == row["stats_received"] == 20
        assert row["frames_answered"] == row["frames_sent"] == 20 * 20
        assert len(row["quantiles"]) == 201 and row["server_cores"] > 0
    assert set(result["ratios"]) == {"p99 talkies/bare N=20", "CPU per frame talkies/bare N=20"}
    assert result["spread"]["p99 talkies/bare N=20"][2] == 2


def test_a_live_peers_record_renders_its_ratios_and_table() -> None:
    from bench import report_parts

    live = json.loads((ROOT / "bench" / "results" / "2026-12-02-live-peers.json").read_text())
    run = report_parts.last_side_by_side(live["runs"])
    record = _record()
    record["sections"] = {"live_peers": {"result": run, "source": "test"}}
    record["sections"]["live_peers"]["ratios"] = report_parts.live_peer_ratios(run["summary"])
    text = report.markdown(record, "x")
    summary = run["summary"]
    ratio = summary["talkies"]["word_delay_p90_s"] / summary["whisperlive"]["word_delay_p90_s"]
    assert f"| live_peers | talkies / whisperlive, word delay p90 | {ratio:.2f}x |" in text
    assert run["table"].splitlines()[1] in text  # Talkies' row of the whole table
