"""The fuzz harnesses without atheris: seed corpora replay clean, and the corpus is current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz import fuzz_control, fuzz_session
from fuzz._oracle import ProgramWriter, check_session_program
from talkies.protocol import Open, Partial, Ready, Send, StartOptions, Word
from talkies.protocol.audit import InvariantViolation, SessionAudit

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
CONTROL_SEEDS = sorted((CORPUS / "control").iterdir())
SESSION_SEEDS = sorted((CORPUS / "session").iterdir())


def test_both_corpora_have_seeds() -> None:
    assert len(CONTROL_SEEDS) >= 20
    assert len(SESSION_SEEDS) >= 20


@pytest.mark.parametrize("seed", CONTROL_SEEDS, ids=lambda p: p.name)
def test_control_seed_replays_clean(seed: Path) -> None:
    fuzz_control.check_one(seed.read_bytes())


@pytest.mark.parametrize("seed", SESSION_SEEDS, ids=lambda p: p.name)
def test_session_seed_replays_clean(seed: Path) -> None:
    report = fuzz_session.check_one(seed.read_bytes())
    assert report.outcome is not None  # every program ends closed (PeerGone at the latest)


def test_replay_counts_every_file() -> None:
    assert fuzz_control.replay(CORPUS / "control") == len(CONTROL_SEEDS)
    assert fuzz_session.replay(CORPUS / "session") == len(SESSION_SEEDS)


def test_seed_corpus_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, "fuzz/make_seeds.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_harnesses_import_without_atheris() -> None:
    code = (
        "import sys; sys.modules['atheris'] = None; "
        "import fuzz.fuzz_control as c, fuzz.fuzz_session as s; "
        "assert c.atheris is None and s.atheris is None; "
        "c.check_one(b'{}'); s.check_one(b'')"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_oracle_is_strict_about_lone_surrogates_in_words() -> None:
    # Once tolerated by a "known issues" switch; now session.py cleans words and nothing
    # is tolerated. Engine word text with a lone surrogate must still audit clean.
    program = (
        ProgramWriter()
        .start(word_timestamps=True)
        .opened()
        .binary(64)
        .partial("a\udcff", [("\udcff", 0.0, 0.1)])
        .control("end")
        .final("b\udcfe", [("\udcfe", 0.0, 0.1)])
    )
    assert check_session_program(program.to_bytes()).outcome == "end"


def test_the_audit_rejects_an_event_that_cannot_be_sent_as_utf8() -> None:
    # What the removed "known issues" switch used to tolerate is always a violation now.
    audit = SessionAudit()
    audit.observe([Open(options=StartOptions(model="m", word_timestamps=True))])
    audit.observe([Send(event=Ready(model="m"))])
    word = Word(word="\udcff", start=0.0, end=0.1)
    bad = Partial(revision=1, text="a", words=(word,), audio_seconds=0.0)
    with pytest.raises(InvariantViolation, match="UTF-8"):
        audit.observe([Send(event=bad)])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_through_the_session_harness_never_raise(data: bytes) -> None:
    fuzz_session.check_one(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512) | st.text(max_size=256).map(lambda t: t.encode("utf-8")))
def test_random_bytes_through_the_control_harness_never_raise(data: bytes) -> None:
    fuzz_control.check_one(data)
