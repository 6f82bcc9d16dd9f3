"""The HTTP harness without atheris: its seeds replay clean, random bytes never reach an
undocumented outcome, the oracle refuses the findings it exists for, and fuzz/run.sh runs it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import fuzz_http
from fuzz._http import (
    HttpReport,
    _check_responses,
    _requests,
    _Sent,
    check_http_input,
    encode_http_input,
    parse_responses,
)
from fuzz.make_seeds import HTTP_SEEDS
from talkies import audio
from talkies.protocol.audit import InvariantViolation

ROOT = Path(__file__).resolve().parents[2]
SEEDS = sorted((ROOT / "fuzz" / "corpus" / "http").iterdir())
SPEECH = b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer fuzz-token\r\n"


def test_the_corpus_has_seeds() -> None:
    assert len(SEEDS) >= 50
    assert {p.name for p in SEEDS} == set(HTTP_SEEDS)


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_seed_replays_to_its_statuses(seed: Path) -> None:
    report = fuzz_http.check_one(seed.read_bytes())
    assert [r.status for r in report.responses] == HTTP_SEEDS[seed.name][2]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_random_bytes_reach_a_documented_outcome(data: bytes) -> None:
    check_http_input(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(HTTP_SEEDS)),
    st.lists(st.tuples(st.integers(0, 4000), st.binary(min_size=1, max_size=8)), max_size=4),
    st.integers(0, 7),
)
def test_seeds_with_bytes_overwritten_reach_a_documented_outcome(
    name: str, edits: list[tuple[int, bytes]], chunking: int
) -> None:
    """The seeds, each hit in a few places (what a mutator does first)."""
    data = bytearray(HTTP_SEEDS[name][0])
    for offset, patch in edits:
        at = offset % max(len(data), 1)
        data[at : at + len(patch)] = patch
    check_http_input(bytes([chunking]) + bytes(data))


def test_the_issue_cases_are_answered_as_4xx_in_openai_shape() -> None:
    """Issue 21 point 7's bodies, through the harness's standalone server: no traceback (the
    oracle fails on one), a 400 each."""
    bodies = {
        "nested": b"[" * 3000,
        "speed": b'{"model":"speech-fuzz","input":"hi","voice":"alloy","speed":'
        + b"9" * 3500
        + b"}",
    }
    for name, body in bodies.items():
        request = SPEECH + b"Content-Length: %d\r\n\r\n" % len(body) + body
        report = check_http_input(encode_http_input(request))
        assert [r.status for r in report.responses] == [400], name
    for chunks in (b"zz\r\n{}\r\n0\r\n\r\n", b"5\r\n{}\r\n0\r\n\r\n"):
        request = SPEECH + b"Transfer-Encoding: chunked\r\n\r\n" + chunks
        report = check_http_input(encode_http_input(request))
        assert [r.status for r in report.responses] == [400]
        assert b"malformed request body" in report.responses[0].body


def test_the_harness_leaves_the_process_as_it_was() -> None:
    encode = audio.encode
    quiet = logging.getLogger("talkies.transport")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # as fuzz/_wire.py leaves it
    try:
        check_http_input(encode_http_input(SPEECH + b"Content-Length: 1\r\n\r\n{"))
        assert audio.encode is encode and quiet.level == logging.CRITICAL
    finally:
        quiet.setLevel(level)


# -- the oracle is strict ------------------------------------------------------------------------


def _report(requests: list[_Sent], output: bytes) -> HttpReport:
    return HttpReport(
        requests=requests, responses=parse_responses(output, [r.method for r in requests])
    )


def _response(status: int, body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 %d X\r\n" % status + b"".join(h + b"\r\n" for h in headers)
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


_OPENAI = b'{"error":{"message":"m","type":"invalid_request_error","param":null,"code":null}}'
_GET = _Sent(b"GET", b"/v1/models", complete=True)


@pytest.mark.parametrize(
    ("requests", "output", "finding"),
    [
        ([_GET], _response(500, _OPENAI), "500"),
        ([_GET], _response(501, _OPENAI), "501"),
        ([_GET], _response(400, b"Bad Request"), "not OpenAI's error object"),
        ([_GET], _response(400, b'{"error":"x"}'), "not OpenAI's error object"),
        ([_GET, _GET], _response(200, b"{}"), "got no response"),
        ([_GET], _response(200, b"{}") * 2, "2 responses to 1 requests"),
        ([_GET], b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{}", "does not parse"),
        ([_GET], b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "does not parse"),
        (
            [_Sent(b"", b"", complete=True, malformed=True)],
            _response(400, _OPENAI),
            "malformed head answered",
        ),
        (
            [_Sent(b"POST", b"/v1/audio/speech", complete=True, framed_twice=True)],
            _response(400, _OPENAI),
            "a request framed twice answered 400, closes=False",
        ),
    ],
)
def test_undocumented_answers_are_findings(
    requests: list[_Sent], output: bytes, finding: str
) -> None:
    with pytest.raises(InvariantViolation, match=re.escape(finding)):
        _check_responses(_report(requests, output))


def test_documented_answers_pass() -> None:
    close = b"connection: close"
    # A close after an answer excuses the requests behind it; so does a client that left
    # mid-request; a readiness 503 is the readiness check's; /mcp's SDK answers in its shape.
    _check_responses(_report([_GET, _GET], _response(400, _OPENAI, close)))
    _check_responses(_report([_GET, _Sent(b"GET", b"/", complete=False)], _response(200, b"")))
    _check_responses(_report([_Sent(b"GET", b"/readyz", True)], _response(503, b"{}")))
    mcp = _Sent(b"POST", b"/mcp", complete=True)
    _check_responses(_report([mcp], _response(406, b"Not Acceptable")))
    head = _Sent(b"HEAD", b"/nope", complete=True)
    _check_responses(_report([head], b"HTTP/1.1 404 X\r\ncontent-length: 80\r\n\r\n"))


def test_the_offline_parse_reads_as_the_server_does() -> None:
    data = (
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /b HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab"
    )
    sent = _requests(data)
    assert [(s.method, s.target, s.complete) for s in sent] == [
        (b"GET", b"/a", True),
        (b"HEAD", b"/b", True),
        (b"POST", b"/c", False),
    ]
    assert _requests(b"\x00 nonsense\r\n\r\n")[0].malformed
    both = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert _requests(both)[0].framed_twice and not sent[2].framed_twice
    assert not _requests(b"GET /a HTTP/1.1\r\nHo")[0].complete  # cut short: no answer due


def test_run_sh_runs_every_harness_by_default() -> None:
    script = (ROOT / "fuzz" / "run.sh").read_text()
    assert '"${FUZZ_HARNESSES:-control session wire http listen realtime}"' in script
    harnesses = {p.stem.removeprefix("fuzz_") for p in (ROOT / "fuzz").glob("fuzz_*.py")}
    assert harnesses == {"control", "session", "wire", "http", "listen", "realtime"}
    assert (ROOT / "fuzz" / "dict" / "http.dict").is_file()
