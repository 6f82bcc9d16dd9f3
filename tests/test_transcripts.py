"""``talkies.transcripts``: OpenAI's transcription response formats, byte for byte.

Shapes are checked against openai-python's own response types when the ``openai`` package is
installed (``TranscriptionVerbose``, ``TranscriptionSegment``, ``TranscriptionWord``).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from talkies import transcripts
from talkies.engines.base import Transcript, TranscriptSegment
from talkies.protocol import Word

SEGMENT_KEYS = [
    "id",
    "seek",
    "start",
    "end",
    "text",
    "tokens",
    "temperature",
    "avg_logprob",
    "compression_ratio",
    "no_speech_prob",
]


def sample(language: str | None = "en") -> Transcript:
    """Two segments, the second past an hour; Whisper-style fields on the first only."""
    first = TranscriptSegment(
        id=0,
        start=0.0,
        end=2.5,
        text="Go forward ten meters.",
        words=(
            Word(word="Go", start=0.0, end=0.19, confidence=0.7),
            Word(word="forward", start=0.5, end=0.85),
            Word(word="ten", start=0.85, end=1.42),
            Word(word="meters.", start=1.42, end=2.0),
        ),
        tokens=(50364, 1037, 2128, 2064, 8146, 13, 50464),
        avg_logprob=-0.25,
        no_speech_prob=0.01,
        temperature=0.2,
    )
    second = TranscriptSegment(
        id=1,
        start=3725.5,
        end=3727.0004,
        text="Then stop.",
        words=(
            Word(word="Then", start=3725.5, end=3726.0),
            Word(word="stop.", start=3726.0, end=3727.0),
        ),
    )
    return Transcript(
        text="Go forward ten meters. Then stop.",
        language=language,
        duration=3727.5,
        segments=(first, second),
    )


EMPTY = Transcript(text="", language="en", duration=1.25, segments=())


def body(transcript: Transcript, fmt: str, **kwargs: Any) -> tuple[str, str]:
    data, content_type = transcripts.render(transcript, fmt, **kwargs)
    return data.decode("utf-8"), content_type


# -- json and text -------------------------------------------------------------------------------


def test_json_is_just_the_text() -> None:
    text, content_type = body(sample(), "json")
    assert json.loads(text) == {"text": "Go forward ten meters. Then stop."}
    assert content_type == "application/json"
    assert json.loads(body(EMPTY, "json")[0]) == {"text": ""}


def test_text_is_the_text_and_a_newline() -> None:
    assert body(sample(), "text") == (
        "Go forward ten meters. Then stop.\n",
        "text/plain; charset=utf-8",
    )
    assert body(EMPTY, "text")[0] == "\n"


def test_non_ascii_text_is_utf8_not_escaped() -> None:
    korean = Transcript(text="안녕하세요", language="ko", duration=1.0)
    data, _ = transcripts.render(korean, "json")
    assert data == '{"text": "안녕하세요"}'.encode()


# -- verbose_json ----------------------------------------------------------------------------------


def test_verbose_json_defaults_to_segments_without_words() -> None:
    out = json.loads(body(sample(), "verbose_json")[0])
    assert list(out) == ["task", "language", "duration", "text", "segments"]
    assert out["task"] == "transcribe"
    assert out["language"] == "english"
    assert out["duration"] == 3727.5
    assert out["text"] == "Go forward ten meters. Then stop."
    first, second = out["segments"]
    assert list(first) == SEGMENT_KEYS
    assert first == {
        "id": 0,
        "seek": 0,
        "start": 0.0,
        "end": 2.5,
        "text": "Go forward ten meters.",
        "tokens": [50364, 1037, 2128, 2064, 8146, 13, 50464],
        "temperature": 0.2,
        "avg_logprob": -0.25,
        "compression_ratio": pytest.approx(transcripts.compression_ratio(first["text"])),
        "no_speech_prob": 0.01,
    }
    # What the engine did not report: neutral values (see the module docstring).
    assert second["tokens"] == []
    assert second["avg_logprob"] == 0.0
    assert second["no_speech_prob"] == 0.0
    assert second["temperature"] == 0.0
    assert second["seek"] == 372550  # the start in 10 ms frames
    assert second["end"] == 3727.0  # seconds rounded to the millisecond
    assert all(isinstance(s[k], float) for s in out["segments"] for k in ("start", "end"))


@pytest.mark.parametrize(
    ("granularities", "keys"),
    [
        ((), ["task", "language", "duration", "text", "segments"]),
        (("segment",), ["task", "language", "duration", "text", "segments"]),
        (("word",), ["task", "language", "duration", "text", "words"]),
        (("word", "segment"), ["task", "language", "duration", "text", "segments", "words"]),
    ],
)
def test_verbose_json_follows_timestamp_granularities(
    granularities: tuple[str, ...], keys: list[str]
) -> None:
    out = json.loads(body(sample(), "verbose_json", timestamp_granularities=granularities)[0])
    assert list(out) == keys
    if "words" in out:
        assert out["words"] == [
            {"word": "Go", "start": 0.0, "end": 0.19},
            {"word": "forward", "start": 0.5, "end": 0.85},
            {"word": "ten", "start": 0.85, "end": 1.42},
            {"word": "meters.", "start": 1.42, "end": 2.0},
            {"word": "Then", "start": 3725.5, "end": 3726.0},
            {"word": "stop.", "start": 3726.0, "end": 3727.0},
        ]


def test_verbose_json_of_an_empty_transcript() -> None:
    out = transcripts.verbose_json(EMPTY, words=True)
    assert out == {
        "task": "transcribe",
        "language": "english",
        "duration": 1.25,
        "text": "",
        "segments": [],
        "words": [],
    }


def test_verbose_json_parses_as_openais_own_types() -> None:
    audio = pytest.importorskip("openai.types.audio")
    text, _ = body(sample(), "verbose_json", timestamp_granularities=["word", "segment"])
    raw = json.loads(text)
    parsed = audio.TranscriptionVerbose.model_validate(raw)
    assert parsed.language == "english"
    assert parsed.segments is not None and parsed.words is not None
    assert len(parsed.segments) == 2 and len(parsed.words) == 6
    # Exactly OpenAI's fields: none missing, none invented (the API adds "task").
    assert set(SEGMENT_KEYS) == set(audio.TranscriptionSegment.model_fields)
    assert set(raw["words"][0]) == set(audio.TranscriptionWord.model_fields)
    assert set(raw) - {"task"} <= set(audio.TranscriptionVerbose.model_fields)
    assert audio.Transcription.model_validate(json.loads(body(sample(), "json")[0])).text


@pytest.mark.parametrize(
    ("code", "name"),
    [
        ("en", "english"),
        ("en-US", "english"),
        ("pt_BR", "portuguese"),
        ("ZH", "chinese"),
        ("yue", "cantonese"),
        ("haw", "hawaiian"),
        ("English", "english"),
        ("xx", "xx"),
        (None, "unknown"),
        ("", "unknown"),
    ],
)
def test_language_is_openais_english_name(code: str | None, name: str) -> None:
    assert transcripts.language_name(code) == name
    assert json.loads(body(sample(code), "verbose_json")[0])["language"] == name


def test_language_names_cover_whispers_languages() -> None:
    pw = pytest.importorskip("_pywhispercpp")
    codes = [pw.whisper_lang_str(i) for i in range(pw.whisper_lang_max_id() + 1)]
    assert codes == list(transcripts.LANGUAGE_NAMES)


def test_compression_ratio_is_whispers() -> None:
    text = "la la la la la la la la la la la la la la la la"
    data = text.encode()
    assert transcripts.compression_ratio(text) == len(data) / len(zlib.compress(data))
    assert transcripts.compression_ratio(text) > 2.4  # a repetition loop, by OpenAI's rule
    assert transcripts.compression_ratio("") == 0.0


# -- srt and vtt -----------------------------------------------------------------------------------


def test_srt_exact() -> None:
    text, content_type = body(sample(), "srt")
    assert content_type == "text/plain; charset=utf-8"
    assert text == (
        "1\n"
        "00:00:00,000 --> 00:00:02,500\n"
        "Go forward ten meters.\n"
        "\n"
        "2\n"
        "01:02:05,500 --> 01:02:07,000\n"
        "Then stop.\n"
        "\n"
    )


def test_vtt_exact() -> None:
    text, content_type = body(sample(), "vtt")
    assert content_type == "text/plain; charset=utf-8"
    assert text == (
        "WEBVTT\n"
        "\n"
        "00:00:00.000 --> 00:00:02.500\n"
        "Go forward ten meters.\n"
        "\n"
        "01:02:05.500 --> 01:02:07.000\n"
        "Then stop.\n"
        "\n"
    )


def test_empty_transcript_subtitles() -> None:
    assert body(EMPTY, "srt")[0] == ""
    assert body(EMPTY, "vtt")[0] == "WEBVTT\n\n"


@pytest.mark.parametrize(
    ("seconds", "srt", "vtt"),
    [
        (0.0, "00:00:00,000", "00:00:00.000"),
        (0.0004, "00:00:00,000", "00:00:00.000"),
        (0.0006, "00:00:00,001", "00:00:00.001"),
        (1.999, "00:00:01,999", "00:00:01.999"),
        (59.9996, "00:01:00,000", "00:01:00.000"),  # rounds up across the minute
        (3599.9999, "01:00:00,000", "01:00:00.000"),  # and across the hour
        (3661.061, "01:01:01,061", "01:01:01.061"),
        (36000.0, "10:00:00,000", "10:00:00.000"),
        (360000.25, "100:00:00,250", "100:00:00.250"),  # hours grow past two digits
        (-0.5, "00:00:00,000", "00:00:00.000"),  # never negative
    ],
)
def test_timestamps(seconds: float, srt: str, vtt: str) -> None:
    assert transcripts.srt_timestamp(seconds) == srt
    assert transcripts.vtt_timestamp(seconds) == vtt


def test_cue_text_cannot_break_a_cue() -> None:
    tricky = Transcript(
        text="a --> b\n\nc",
        language="en",
        duration=2.0,
        segments=(TranscriptSegment(id=0, start=0.0, end=1.0, text="a --> b\n\nc"),),
    )
    assert body(tricky, "srt")[0] == "1\n00:00:00,000 --> 00:00:01,000\na -> b c\n\n"
    assert body(tricky, "vtt")[0] == "WEBVTT\n\n00:00:00.000 --> 00:00:01.000\na -> b c\n\n"


def test_many_cues_are_numbered_in_order() -> None:
    segments = tuple(
        TranscriptSegment(id=i, start=i * 1.5, end=i * 1.5 + 1.0, text=f"line {i}")
        for i in range(12)
    )
    transcript = Transcript(text="", language="en", duration=20.0, segments=segments)
    cues = body(transcript, "srt")[0].split("\n\n")
    assert cues[-1] == ""
    assert [c.split("\n")[0] for c in cues[:-1]] == [str(i) for i in range(1, 13)]
    assert cues[11].split("\n")[1] == "00:00:16,500 --> 00:00:17,500"


# -- the entry point -------------------------------------------------------------------------------


def test_formats_and_content_types() -> None:
    assert transcripts.RESPONSE_FORMATS == ("json", "text", "srt", "verbose_json", "vtt")
    for fmt in transcripts.RESPONSE_FORMATS:
        data, content_type = transcripts.render(sample(), fmt)
        assert isinstance(data, bytes) and data
        assert content_type == transcripts.CONTENT_TYPES[fmt]
    with pytest.raises(ValueError, match="response_format must be one of"):
        transcripts.render(sample(), "xml")


def test_transcript_words_follow_the_segments() -> None:
    transcript = sample()
    assert [w.word for w in transcript.words] == [
        "Go",
        "forward",
        "ten",
        "meters.",
        "Then",
        "stop.",
    ]
    assert EMPTY.words == ()
