"""The wire harness without atheris: its seeds replay clean, random bytes never escape the
oracle as anything but a documented outcome, and the oracle refuses undocumented ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import fuzz_wire
from fuzz._wire import (
    WireReport,
    _check_close,
    _check_pongs,
    _ClientView,
    check_wire_input,
    client_frame,
    encode_wire_input,
)
from talkies.protocol.audit import InvariantViolation

ROOT = Path(__file__).resolve().parents[2]
SEEDS = sorted((ROOT / "fuzz" / "corpus" / "wire").iterdir())


def test_the_corpus_has_seeds() -> None:
    assert len(SEEDS) >= 40
    assert fuzz_wire.replay(ROOT / "fuzz" / "corpus" / "wire") == len(SEEDS)


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_seed_replays_clean(seed: Path) -> None:
    report = fuzz_wire.check_one(seed.read_bytes())
    assert report.outcome is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_random_bytes_reach_a_documented_outcome(data: bytes) -> None:
    check_wire_input(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 1, 2, 8, 9, 10, 3, 11]),
            st.binary(max_size=140),
            st.booleans(),
            st.sampled_from([b"\0\0\0\0", b"\x01\x02\x03\x04", None]),
        ),
        max_size=12,
    ),
    st.integers(0, 255),
)
def test_random_frames_reach_a_documented_outcome(
    frames: list[tuple[int, bytes, bool, bytes | None]], flags: int
) -> None:
    """Well-formed frame headers around random payloads, sent every way byte 0 allows."""
    client = b"".join(client_frame(op, data, fin=fin, mask=mask) for op, data, fin, mask in frames)
    check_wire_input(bytes([flags]) + client)


def test_a_client_that_sends_with_the_upgrade_head_is_served() -> None:
    start = b'{"type":"start","model":"tiny-test","encoding":"pcm_s16le","sample_rate":16000,'
    start += b'"channels":1}'
    frames = client_frame(9, b"hi") + client_frame(1, start)
    data = encode_wire_input(frames, trailing=True, patient=True)
    report = check_wire_input(data)
    assert report.pongs == 1 and [t["type"] for t in report.texts] == ["_pong", "ready"]


# -- the oracle is strict ------------------------------------------------------------------------


def _report(*texts: dict[str, object], close: int | None, reason: str = "") -> WireReport:
    return WireReport(texts=list(texts), close_code=close, close_reason=reason)


@pytest.mark.parametrize(
    ("report", "client"),
    [
        # 1007 from the server: invalid UTF-8 must be invalid_json.
        (_report(close=1007), _ClientView(failed=1007)),
        # An error whose close code is not its own.
        (
            _report({"type": "error", "code": "invalid_json"}, close=4404, reason="invalid_json"),
            _ClientView(),
        ),
        # An error that is not last.
        (
            _report(
                {"type": "error", "code": "invalid_json"},
                {"type": "ready"},
                close=4400,
                reason="invalid_json",
            ),
            _ClientView(),
        ),
        # An undocumented error code.
        (_report({"type": "error", "code": "oops"}, close=4400, reason="oops"), _ClientView()),
        # 1002 without a protocol error in the client's bytes.
        (_report(close=1002), _ClientView()),
        # 1000 without stats, and no close from the client.
        (_report({"type": "ready"}, close=1000), _ClientView()),
        # A close code the client did not send.
        (_report(close=4000), _ClientView(close_code=4001)),
    ],
)
def test_undocumented_closes_are_findings(report: WireReport, client: _ClientView) -> None:
    with pytest.raises(InvariantViolation):
        _check_close(report, client)


def test_unanswered_or_reordered_pings_are_findings() -> None:
    pong = {"type": "_pong", "payload": b"b"}
    with pytest.raises(InvariantViolation):
        _check_pongs(_report(pong, close=None), _ClientView(pings=[b"a", b"b"]))
    with pytest.raises(InvariantViolation):  # open, and one ping unanswered
        _check_pongs(_report(close=None), _ClientView(pings=[b"a"]))
    _check_pongs(_report(close=1002), _ClientView(pings=[b"a"], failed=1002))


def test_the_harness_imports_without_atheris() -> None:
    code = (
        "import sys; sys.modules['atheris'] = None; import fuzz.fuzz_wire as w; "
        "assert w.atheris is None"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_run_sh_refuses_bad_arguments() -> None:
    for args, env in ((["x"], {}), (["5"], {"FUZZ_JOBS": "0"}), (["5"], {"FUZZ_RUNS": "many"})):
        result = subprocess.run(
            ["bash", "fuzz/run.sh", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", **env},
        )
        assert result.returncode == 2, (args, env, result.stdout, result.stderr)
