"""OpenAI's transcription responses from a :class:`~talkies.engines.base.Transcript`.

The ``response_format`` values of POST /v1/audio/transcriptions, in OpenAI's shapes
(openai-python ``Transcription``, ``TranscriptionVerbose``, ``TranscriptionSegment``,
``TranscriptionWord``):

- ``json``: ``{"text": ...}``;
- ``text``: the text and a newline, as ``text/plain``;
- ``verbose_json``: ``task``, ``language`` (the English name in lower case, "english", as
  OpenAI gives it), ``duration``, ``text``, then ``segments`` when segment timestamps were
  asked for (OpenAI's default) and ``words`` when word timestamps were;
- ``srt`` and ``vtt``: one numbered (SRT) or plain (WebVTT) cue per segment.

Segment fields an engine does not report get these values: ``tokens`` ``[]`` (Vosk and
sherpa have no Whisper token ids), ``avg_logprob`` ``0.0`` and ``no_speech_prob`` ``0.0``
(nothing failed and nothing was found silent: OpenAI's documented thresholds treat only a
low log probability or a high no-speech probability as suspect), ``temperature`` the one
decoded at (0 for Vosk and sherpa). ``compression_ratio`` is computed as Whisper does, the
text's UTF-8 length over its zlib-compressed length. ``seek`` is the segment's start in
Whisper's 10 ms mel frames: OpenAI reports the start of the 30 s window the segment was
decoded in, which whisper.cpp does not expose.

Pure functions: no I/O, no engine imports at run time.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engines.base import Transcript, TranscriptSegment

__all__ = [
    "CONTENT_TYPES",
    "LANGUAGE_NAMES",
    "RESPONSE_FORMATS",
    "compression_ratio",
    "language_name",
    "render",
    "srt",
    "srt_timestamp",
    "text",
    "to_json",
    "verbose_json",
    "vtt",
    "vtt_timestamp",
]

_TEXT = "text/plain; charset=utf-8"
# response_format -> Content-Type. OpenAI answers json and verbose_json as JSON and the three
# text formats as text/plain.
CONTENT_TYPES: dict[str, str] = {
    "json": "application/json",
    "text": _TEXT,
    "srt": _TEXT,
    "verbose_json": "application/json",
    "vtt": _TEXT,
}
RESPONSE_FORMATS = tuple(CONTENT_TYPES)

# Whisper's language codes and the English names OpenAI returns for them (openai-whisper,
# ``whisper/tokenizer.py``).
LANGUAGE_NAMES: dict[str, str] = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "ru": "russian",
    "ko": "korean",
    "fr": "french",
    "ja": "japanese",
    "pt": "portuguese",
    "tr": "turkish",
    "pl": "polish",
    "ca": "catalan",
    "nl": "dutch",
    "ar": "arabic",
    "sv": "swedish",
    "it": "italian",
    "id": "indonesian",
    "hi": "hindi",
    "fi": "finnish",
    "vi": "vietnamese",
    "he": "hebrew",
    "uk": "ukrainian",
    "el": "greek",
    "ms": "malay",
    "cs": "czech",
    "ro": "romanian",
    "da": "danish",
    "hu": "hungarian",
    "ta": "tamil",
    "no": "norwegian",
    "th": "thai",
    "ur": "urdu",
    "hr": "croatian",
    "bg": "bulgarian",
    "lt": "lithuanian",
    "la": "latin",
    "mi": "maori",
    "ml": "malayalam",
    "cy": "welsh",
    "sk": "slovak",
    "te": "telugu",
    "fa": "persian",
    "lv": "latvian",
    "bn": "bengali",
    "sr": "serbian",
    "az": "azerbaijani",
    "sl": "slovenian",
    "kn": "kannada",
    "et": "estonian",
    "mk": "macedonian",
    "br": "breton",
    "eu": "basque",
    "is": "icelandic",
    "hy": "armenian",
    "ne": "nepali",
    "mn": "mongolian",
    "bs": "bosnian",
    "kk": "kazakh",
    "sq": "albanian",
    "sw": "swahili",
    "gl": "galician",
    "mr": "marathi",
    "pa": "punjabi",
    "si": "sinhala",
    "km": "khmer",
    "sn": "shona",
    "yo": "yoruba",
    "so": "somali",
    "af": "afrikaans",
    "oc": "occitan",
    "ka": "georgian",
    "be": "belarusian",
    "tg": "tajik",
    "sd": "sindhi",
    "gu": "gujarati",
    "am": "amharic",
    "yi": "yiddish",
    "lo": "lao",
    "uz": "uzbek",
    "fo": "faroese",
    "ht": "haitian creole",
    "ps": "pashto",
    "tk": "turkmen",
    "nn": "nynorsk",
    "mt": "maltese",
    "sa": "sanskrit",
    "lb": "luxembourgish",
    "my": "myanmar",
    "bo": "tibetan",
    "tl": "tagalog",
    "mg": "malagasy",
    "as": "assamese",
    "tt": "tatar",
    "haw": "hawaiian",
    "ln": "lingala",
    "ha": "hausa",
    "ba": "bashkir",
    "jw": "javanese",
    "su": "sundanese",
    "yue": "cantonese",
}
_UNKNOWN_LANGUAGE = "unknown"


def language_name(code: str | None) -> str:
    """OpenAI's ``language`` for a code: "en" and "en-US" give "english". A code Whisper
    does not list is returned in lower case; no language at all gives "unknown"."""
    if not code:
        return _UNKNOWN_LANGUAGE
    lowered = code.strip().lower()
    if lowered in LANGUAGE_NAMES.values():
        return lowered  # already a name
    primary = lowered.replace("_", "-").split("-")[0]
    return LANGUAGE_NAMES.get(primary, lowered)


def compression_ratio(value: str) -> float:
    """Whisper's gzip compression ratio: UTF-8 length over zlib-compressed length."""
    data = value.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _seconds(value: float) -> float:
    return round(float(value), 3)


# -- the JSON formats --------------------------------------------------------------------------


def to_json(transcript: Transcript) -> dict[str, Any]:
    """``response_format=json``."""
    return {"text": transcript.text}


def _segment(segment: TranscriptSegment) -> dict[str, Any]:
    return {
        "id": segment.id,
        "seek": round(segment.start * 100),
        "start": _seconds(segment.start),
        "end": _seconds(segment.end),
        "text": segment.text,
        "tokens": list(segment.tokens),
        "temperature": float(segment.temperature),
        "avg_logprob": float(segment.avg_logprob) if segment.avg_logprob is not None else 0.0,
        "compression_ratio": compression_ratio(segment.text),
        "no_speech_prob": (
            float(segment.no_speech_prob) if segment.no_speech_prob is not None else 0.0
        ),
    }


def verbose_json(
    transcript: Transcript, *, segments: bool = True, words: bool = False
) -> dict[str, Any]:
    """``response_format=verbose_json``: ``segments`` and ``words`` say which of OpenAI's
    ``timestamp_granularities`` were asked for (OpenAI's default is segments only)."""
    out: dict[str, Any] = {
        "task": "transcribe",
        "language": language_name(transcript.language),
        "duration": _seconds(transcript.duration),
        "text": transcript.text,
    }
    if segments:
        out["segments"] = [_segment(s) for s in transcript.segments]
    if words:
        out["words"] = [
            {"word": w.word, "start": _seconds(w.start), "end": _seconds(w.end)}
            for w in transcript.words
        ]
    return out


# -- the text formats --------------------------------------------------------------------------


def text(transcript: Transcript) -> str:
    """``response_format=text``: the text and a newline."""
    return transcript.text + "\n"


def _timestamp(seconds: float, marker: str) -> str:
    # Rounded to the millisecond first, so 59.9996 s is 00:01:00.000, never 00:00:59.1000.
    total = max(0, round(seconds * 1000))
    hours, rest = divmod(total, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{marker}{millis:03d}"


def srt_timestamp(seconds: float) -> str:
    """``HH:MM:SS,mmm`` (hours grow past two digits if they must)."""
    return _timestamp(seconds, ",")


def vtt_timestamp(seconds: float) -> str:
    """``HH:MM:SS.mmm``."""
    return _timestamp(seconds, ".")


def _cue_text(value: str) -> str:
    # A cue ends at a blank line and "-->" marks timings: keep a segment's text on one line
    # and arrow-free (openai-whisper writes "->" for "-->" too).
    return " ".join(value.split()).replace("-->", "->")


def srt(transcript: Transcript) -> str:
    """``response_format=srt``: cues numbered from 1, each followed by a blank line."""
    cues = [
        f"{number}\n{srt_timestamp(s.start)} --> {srt_timestamp(s.end)}\n{_cue_text(s.text)}\n\n"
        for number, s in enumerate(transcript.segments, start=1)
    ]
    return "".join(cues)


def vtt(transcript: Transcript) -> str:
    """``response_format=vtt``: the ``WEBVTT`` header, then one cue per segment."""
    cues = [
        f"{vtt_timestamp(s.start)} --> {vtt_timestamp(s.end)}\n{_cue_text(s.text)}\n\n"
        for s in transcript.segments
    ]
    return "WEBVTT\n\n" + "".join(cues)


# -- one entry point ---------------------------------------------------------------------------


def render(
    transcript: Transcript,
    response_format: str,
    *,
    timestamp_granularities: Collection[str] = (),
) -> tuple[bytes, str]:
    """The response body and Content-Type for ``response_format``.

    ``timestamp_granularities`` is OpenAI's field ("segment", "word"); it shapes
    ``verbose_json`` only, and none given means segments, as at OpenAI. An unknown format
    raises ValueError (the HTTP layer checks the field before transcribing).
    """
    if response_format not in CONTENT_TYPES:
        raise ValueError(
            f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, got {response_format!r}"
        )
    content_type = CONTENT_TYPES[response_format]
    body: str
    if response_format == "json":
        body = _dumps(to_json(transcript))
    elif response_format == "verbose_json":
        granularities = set(timestamp_granularities) or {"segment"}
        body = _dumps(
            verbose_json(
                transcript, segments="segment" in granularities, words="word" in granularities
            )
        )
    elif response_format == "text":
        body = text(transcript)
    elif response_format == "srt":
        body = srt(transcript)
    else:
        body = vtt(transcript)
    return body.encode("utf-8"), content_type


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)
