"""Every row of the hostile-input table in docs/reliability.md, executed as written there.

Rows on ``in-process``, ``asgi``, ``module`` and ``reference`` run here without a host
process; rows on ``standalone``, ``uvicorn`` and ``both`` run against the host processes of
tests/http_hosts.py (``both``: once on each). A row without a runner, a runner without a row,
and a case of the issue's list without a row all fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..http_hosts import HttpHost
from .runners import RUNNER_HOSTS, RUNNERS, Target
from .table import Row, check, parse_outcome, rows

ROWS = rows()
_PROCESS = {
    "standalone": ("standalone",),
    "uvicorn": ("uvicorn",),
    "both": ("standalone", "uvicorn"),
}
LOCAL = [r for r in ROWS if r.host not in _PROCESS]
ON_STANDALONE = [r for r in ROWS if "standalone" in _PROCESS.get(r.host, ())]
ON_UVICORN = [r for r in ROWS if "uvicorn" in _PROCESS.get(r.host, ())]

# The issue's list ("Proof under load and abuse", Hostile input): each must have a row.
REQUIRED = {
    "slowloris-head": "slowloris request heads",
    "huge-header": "1 MB headers",
    "many-headers": "10,000 headers",
    "ws-invalid-utf8": "invalid UTF-8 in text frames",
    "ws-fragmented-control-over-4096": "fragmented control messages over 4096 bytes",
    "ws-continuation-first": "continuation frames out of order",
    "ws-text-inside-text": "continuation frames out of order",
    "ws-unmasked": "unmasked client frames",
    "ping-flood": "ping floods",
    "terabyte-frame": "a frame header declaring a terabyte",
    "connection-flood": "10,000 connection attempts at once",
    "multipart-nested": "multipart bombs: nested",
    "multipart-part-count": "multipart bombs: huge part counts",
    "multipart-part-header": "multipart bombs: a part with a 1 MB header",
    "body-endless": "multipart bombs: a body that never ends",
    "files-dotdot": "staged files: ../",
    "files-absolute": "staged files: absolute",
    "files-symlink-out": "staged files: symlinks out",
    "files-nul": "staged files: NUL",
    "files-overlong": "staged files: over-long",
    "voice-dotdot": "custom voices: ../",
    "voice-absolute": "custom voices: absolute",
    "voice-symlink-out": "custom voices: symlinks out",
    "voice-nul": "custom voices: NUL",
    "voice-overlong": "custom voices: over-long",
    "zip-escape": "zip members escaping the model folder",
    "token-in-query": "tokens never accepted from the query string",
    "token-in-path": "tokens never accepted from the path",
    "token-in-logs": "tokens never in logs",
    "token-in-metrics": "tokens never in metrics",
    "token-compare": "tokens compared in constant time",
    "ws-no-start": "issue 21, point 2: upgrades that never send start hold no stream slot",
    "ws-start-trickle": "issue 21, point 2: a start deadline no message moves",
    "http-length-and-chunked": "issue 21, point 6: Content-Length and Transfer-Encoding both",
    "speech-nested-json": "issue 21, point 7: a body of 60,000 [ on /v1/audio/speech",
    "speech-speed-digits": "issue 21, point 7: speed as a 4,000-digit integer",
    "chunk-size-not-hex": "issue 21, point 7: a chunk size zz",
    "chunk-shorter-than-declared": "issue 21, point 7: a chunk shorter than declared",
    "speech-checked-before-load": "issue 21, point 7: validated before its model is loaded",
    "upload-long": "issue 21, point 3: 4 uploads of 4 h of audio, decoded in bounded chunks",
    "mcp-base64-large": "issue 21, point 4: MCP base64 audio, decoded incrementally and bounded",
    "body-trickled": "issue 21, point 4: a body trickled 1 byte at a time has a deadline",
}


def test_every_case_of_the_issue_has_a_row() -> None:
    missing = {case: why for case, why in REQUIRED.items() if case not in {r.case for r in ROWS}}
    assert not missing, f"no row for {missing}"


def test_every_row_has_a_runner_and_a_readable_outcome() -> None:
    for row in ROWS:
        assert row.case in RUNNERS, f"{row.id}: no runner"
        assert row.host in RUNNER_HOSTS[row.case], f"{row.id}: the runner does not run there"
        assert parse_outcome(row.outcome), row.id
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)), "a case appears twice on one host"


def test_every_runner_has_a_row() -> None:
    for case, hosts in RUNNER_HOSTS.items():
        for host in hosts:
            assert any(r.case == case and r.host == host for r in ROWS), f"no row {case}[{host}]"


@pytest.mark.parametrize("row", LOCAL, ids=[r.id for r in LOCAL])
def test_row(row: Row, tmp_path: Path) -> None:
    check(row, RUNNERS[row.case](Target(row, tmp_path)))


# One test function per host, the host a single-valued parameter: each host process then
# starts once for all its rows (parametrizing host and row together restarted it per row).
@pytest.mark.parametrize("host", ["standalone"], indirect=True)
@pytest.mark.parametrize("row", ON_STANDALONE, ids=[r.case for r in ON_STANDALONE])
def test_row_on_standalone(host: HttpHost, row: Row, tmp_path: Path) -> None:
    check(row, RUNNERS[row.case](Target(row, tmp_path, host)))


@pytest.mark.parametrize("host", ["uvicorn"], indirect=True)
@pytest.mark.parametrize("row", ON_UVICORN, ids=[r.case for r in ON_UVICORN])
def test_row_on_uvicorn(host: HttpHost, row: Row, tmp_path: Path) -> None:
    check(row, RUNNERS[row.case](Target(row, tmp_path, host)))
