"""Every row of the Faults table in docs/reliability.md, executed as written there.

Rows on ``process`` share one ``talkies serve`` process over the fault doubles
(tests/reliability/fault_server.py), but ``sigterm``, which signals a process of its own; rows
on ``in-process`` run the server inside the test. A row without a runner, a runner without a
row, and a case of the issue's list without a row all fail.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import runners_faults, runners_leftovers  # noqa: F401 (registers its runners)
from .runners_faults import FAULT_RUNNER_HOSTS, FAULT_RUNNERS, FaultHost, FaultTarget, fault_host
from .table import Row, check, parse_outcome, rows

ROWS = rows(heading="## Faults")
# Rows that start (and kill) processes of their own, over no Qwen3-TTS.
OWN_PROCESSES = {"sigkill-leftovers", "second-server", "sigterm-transcribing"}
SHARED = [r for r in ROWS if r.host == "process" and r.case not in {"sigterm", *OWN_PROCESSES}]
ALONE = [r for r in ROWS if r not in SHARED and r.case not in OWN_PROCESSES]
STARTING = [r for r in ROWS if r.case in OWN_PROCESSES]

# The issue's list ("Faults"): each must have a row.
REQUIRED = {
    "engine-raises": "an engine that raises mid-stream: 4500, slot freed, server healthy",
    "engine-hangs": "an engine that hangs: the stream ends at a documented deadline",
    "native-exit-on-load": "a native model that kills its process never takes the server down",
    "native-abort-on-load": "a native model that kills its process never takes the server down",
    "engine-crashes": "a native model that kills its process never takes the server down",
    "speech-engine-crashes": "a native model that kills its process never takes the server down",
    "leave-during-upgrade": "client disconnects: before the upgrade completes",
    "leave-after-upgrade": "client disconnects: after the upgrade, before start",
    "leave-before-ready": "client disconnects: after start, before ready",
    "leave-mid-audio": "client disconnects: mid-audio",
    "leave-mid-frame": "client disconnects: mid-frame",
    "leave-after-end": "client disconnects: after end, before final",
    "leave-mid-upload": "client disconnects: during an HTTP upload",
    "leave-mid-speech": "client disconnects: during a TTS stream",
    "sigterm": "SIGTERM with streams, uploads and TTS in flight: 1001, exit 0 within the grace",
    "sigkill-leftovers": "issue 21, point 8: what a SIGKILL leaves is removed at the next start",
    "second-server": "issue 21, point 8: nothing a running server uses is removed",
    "sigterm-transcribing": "issue 21, point 1: shutdown completes within the grace plus a bound",
}


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Qwen3-TTS (tests/modelgen/qwen3.py), made once."""
    if importlib.util.find_spec("qwen_tts") is None:
        pytest.skip("qwen-tts is not installed")
    from ..modelgen.qwen3 import tiny_qwen3_tts

    folder = tiny_qwen3_tts(tmp_path_factory.mktemp("faults-qwen3") / "qwen3-tiny")
    runners_faults.QWEN3_MODEL[:] = [folder]
    return folder


@pytest.fixture(scope="module")
def shared_host(qwen3_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultHost]:
    tmp = tmp_path_factory.mktemp("faults-host")
    with fault_host(runners_faults.qwen3_data(tmp), tmp / "host.log") as host:
        yield host


def test_every_case_of_the_issue_has_a_row() -> None:
    missing = {case: why for case, why in REQUIRED.items() if case not in {r.case for r in ROWS}}
    assert not missing, f"no row for {missing}"


def test_every_row_has_a_runner_and_a_readable_outcome() -> None:
    for row in ROWS:
        assert row.case in FAULT_RUNNERS, f"{row.id}: no runner"
        assert FAULT_RUNNER_HOSTS[row.case] == row.host, f"{row.id}: the runner runs elsewhere"
        assert parse_outcome(row.outcome), row.id
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)), "a case appears twice on one host"


def test_every_runner_has_a_row() -> None:
    for case, host in FAULT_RUNNER_HOSTS.items():
        assert any(r.case == case and r.host == host for r in ROWS), f"no row {case}[{host}]"


@pytest.mark.parametrize("row", SHARED, ids=[r.case for r in SHARED])
def test_row_on_the_shared_process(shared_host: FaultHost, row: Row, tmp_path: Path) -> None:
    check(row, FAULT_RUNNERS[row.case](FaultTarget(row, tmp_path, shared_host)))


@pytest.mark.parametrize("row", ALONE, ids=[r.case for r in ALONE])
def test_row(qwen3_model: Path, row: Row, tmp_path: Path) -> None:
    check(row, FAULT_RUNNERS[row.case](FaultTarget(row, tmp_path)))


@pytest.mark.parametrize("row", STARTING, ids=[r.case for r in STARTING])
def test_row_with_processes_of_its_own(row: Row, tmp_path: Path) -> None:
    check(row, FAULT_RUNNERS[row.case](FaultTarget(row, tmp_path)))
