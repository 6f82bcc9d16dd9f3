"""The server's log (talkies/logs.py): JSON lines, and the libraries' per-request chatter at the
debug level only (issue 21, point 12), their other lines, real warnings among them, kept."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from talkies.logs import CHATTER, Demote, configure


@pytest.fixture
def log_lines(capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """``configure`` for a test, then the JSON lines it wrote; logging as it was, after."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    saved_filters = {name: logging.getLogger(name).filters[:] for name in CHATTER}

    def lines() -> list[dict[str, Any]]:
        return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]

    yield lines
    root.handlers[:], root.level = saved[0], saved[1]
    for name, filters in saved_filters.items():
        logging.getLogger(name).filters[:] = filters


def _espeak_phonemize(text: str) -> str:
    phonemizer = pytest.importorskip("phonemizer")
    espeakng_loader = pytest.importorskip("espeakng_loader")
    from phonemizer.backend.espeak.wrapper import EspeakWrapper

    EspeakWrapper.set_library(espeakng_loader.get_library_path())
    EspeakWrapper.set_data_path(espeakng_loader.get_data_path())
    # As kokoro-onnx calls it (kokoro_onnx/tokenizer.py).
    return str(phonemizer.phonemize(text, "en-us", preserve_punctuation=True, with_stress=True))


def test_mcp_session_end_is_debug_only(log_lines: Any) -> None:
    mcp = logging.getLogger("mcp.server.streamable_http")
    configure("info")
    mcp.info("Terminating session: None")  # as the SDK writes it after each stateless call
    mcp.info("Session termination requested")
    mcp.warning("Something the SDK warns about")
    assert [(r["level"], r["msg"]) for r in log_lines()] == [
        ("info", "Session termination requested"),
        ("warning", "Something the SDK warns about"),
    ]
    configure("debug")
    mcp.info("Terminating session: None")
    assert [(r["level"], r["msg"]) for r in log_lines()] == [("debug", "Terminating session: None")]


def test_phonemizer_word_count_mismatch_is_debug_only(log_lines: Any) -> None:
    configure("info")
    # "$5" and "Mr." are read as other words than the text has: phonemizer warns, per call.
    assert "$" not in _espeak_phonemize("It costs $5, Mr. Smith.")  # spoken as "dollars"
    logging.getLogger("phonemizer").warning("espeak-mbrola backend cannot preserve punctuation")
    assert [(r["level"], r["logger"], r["msg"]) for r in log_lines()] == [
        ("warning", "phonemizer", "espeak-mbrola backend cannot preserve punctuation"),
    ]
    configure("debug")
    _espeak_phonemize("It costs $5, Mr. Smith.")
    shown = [(r["level"], r["msg"]) for r in log_lines() if r["logger"] == "phonemizer"]
    assert shown == [("debug", "words count mismatch on 100.0% of the lines (1/1)")]


def test_configure_twice_leaves_one_filter(log_lines: Any) -> None:
    configure("info")
    configure("warning")
    for name in CHATTER:
        assert sum(isinstance(f, Demote) for f in logging.getLogger(name).filters) == 1
