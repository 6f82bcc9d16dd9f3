"""Deepgram's live transcription, ``GET /v1/listen``, translated to and from the native session.

Deepgram's clients (its SDKs, the LiveKit and pipecat plugins) open a WebSocket with their
options in the query string, send raw audio at once (there is no start message and no ready:
the host holds their audio until the native ``ready``, docs/dialects.md), and control the
stream with three text messages. This module is the whole translation, pure and sans-IO:

- :func:`parse_listen_query` turns the query into :class:`ListenOptions` or a
  :class:`ListenError` with the native error code the client gets (an ``Error`` message, then
  the native close code);
- :class:`ListenTranslator` gives the native ``start`` the options imply, turns each client
  message into native inputs (:meth:`~ListenTranslator.client`) and each native event into
  Deepgram messages (:meth:`~ListenTranslator.session`), pulled with
  :meth:`~ListenTranslator.pull_messages`.

``Finalize`` (flush what was said so far, keep streaming) is a native cut
(:class:`~talkies.protocol.CutRequested`): the engine decodes exactly the audio sent before
it and goes on in the same stream, and its answer (an ``endpoint`` marked ``cut``) is the
``Results`` with ``is_final`` and ``from_finalize``. docs/dialects.md has the table of every
message both ways; ``tests/test_dialect_deepgram_table.py`` runs it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from ..protocol import (
    MAX_CONTROL_BYTES,
    MODEL_SLUG,
    SAMPLE_RATE,
    AudioBatch,
    BinaryReceived,
    CutRequested,
    ErrorCode,
    TextReceived,
)
from .common import DUMPS, ClientInput, native_start, quote

__all__ = [
    "ENCODINGS",
    "END",
    "LISTEN_PATH",
    "MAX_SAMPLE_RATE",
    "MIN_SAMPLE_RATE",
    "ClientInput",
    "ListenError",
    "ListenOptions",
    "ListenTranslator",
    "parse_listen_query",
]

LISTEN_PATH = "/v1/listen"
ENCODINGS = ("linear16", "mulaw", "alaw")  # raw audio only: no containers
# The client's audio rates served (Deepgram's own range); the app layer decodes and resamples
# what is not 16 kHz PCM before the translator sees it.
MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 48000
# The native end that CloseStream becomes (one object: the app flushes its resampler before it).
END = TextReceived(data='{"type":"end"}')


_MAX_QUERY_FIELDS = 64

# Query parameters that change nothing here whatever their value (analytics, versions,
# latency hints; filler_words, which LiveKit sends true: the engine writes the fillers it
# hears or not, nothing is added or removed), and those accepted only when they ask for
# nothing ("false").
_IGNORED = frozenset({"tag", "mip_opt_out", "no_delay", "extra", "version", "filler_words"})
_OFF_ONLY = frozenset(
    {
        "diarize",
        "multichannel",
        "profanity_filter",
        "numerals",
        "dictation",
        "detect_entities",
        "measurements",
        "paragraphs",
        "utterances",
    }
)
_REPEATABLE = frozenset({"tag", "extra"})
_SUPPORTED = frozenset(
    {
        "model",
        "language",
        "encoding",
        "sample_rate",
        "channels",
        "interim_results",
        "endpointing",
        "utterance_end_ms",
        "vad_events",
        "punctuate",
        "smart_format",
    }
)
_WORD_STRIP = re.compile(r"^[^\w']+|[^\w']+$")


class ListenError(Exception):
    """A query Talkies will not serve: the native code (its close code) and the detail."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(f"{code.value}: {detail}")
        self.code = code
        self.detail = detail


@dataclass(frozen=True, kw_only=True, slots=True)
class ListenOptions:
    """A ``/v1/listen`` query, validated (docs/dialects.md says what each one does here)."""

    model: str
    language: str | None = None
    # The client's audio: 16-bit PCM or G.711 (mulaw, alaw) at ``sample_rate``; the app
    # decodes and resamples it to 16 kHz PCM.
    encoding: str = "linear16"
    sample_rate: int = 16000
    interim_results: bool = False
    endpointing: bool = True  # False: no speech_final at the engine's endpoints
    utterance_end_ms: int | None = None
    vad_events: bool = False
    punctuate: bool = False
    smart_format: bool = False

    def start_message(self) -> str:
        """The native ``start`` these options open: always with interim results and words
        (Finalize and SpeechStarted need the hypothesis; the translator drops what the client
        did not ask for)."""
        return native_start(self.model, self.language)


def _flag(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ListenError(ErrorCode.INVALID_FIELD, f"{name} must be true or false, not {quote(value)}")


def _integer(name: str, value: str, low: int, high: int) -> int:
    text = value.strip()
    if not text.isdigit() or len(text) > 9:
        raise ListenError(ErrorCode.INVALID_FIELD, f"{name} must be an integer, not {quote(value)}")
    number = int(text)
    if not low <= number <= high:
        raise ListenError(ErrorCode.INVALID_FIELD, f"{name} must be between {low} and {high}")
    return number


def parse_listen_query(query: bytes | str, *, default_model: str) -> ListenOptions:
    """Validate a ``/v1/listen`` query string; raise :class:`ListenError` (first fault wins,
    in the order of the query)."""
    if isinstance(query, bytes):
        query = query.decode("utf-8", "replace")
    try:
        pairs = parse_qsl(
            query, keep_blank_values=True, max_num_fields=_MAX_QUERY_FIELDS, errors="replace"
        )
    except ValueError:
        raise ListenError(
            ErrorCode.INVALID_FIELD, f"more than {_MAX_QUERY_FIELDS} query parameters"
        ) from None
    seen: set[str] = set()
    values: dict[str, str] = {}
    for name, value in pairs:
        if name in seen and name not in _REPEATABLE:
            raise ListenError(ErrorCode.DUPLICATE_FIELD, f"{quote(name)} is given twice")
        seen.add(name)
        if name in _IGNORED:
            continue
        if name in _OFF_ONLY:
            if _flag(name, value):
                raise ListenError(
                    ErrorCode.UNKNOWN_FIELD, f"{name}=true is not supported by this server"
                )
            continue
        if name not in _SUPPORTED:
            raise ListenError(
                ErrorCode.UNKNOWN_FIELD, f"the query parameter {quote(name)} is not supported"
            )
        values[name] = value

    model = values.get("model", default_model)
    if not MODEL_SLUG.fullmatch(model):
        raise ListenError(ErrorCode.INVALID_MODEL, f"model {quote(model)} is not a model id")
    encoding = values.get("encoding")
    if encoding is None:
        raise ListenError(
            ErrorCode.UNSUPPORTED_ENCODING,
            "containerized audio is not supported: send raw PCM with encoding=linear16",
        )
    encoding = encoding.strip().lower()
    if encoding not in ENCODINGS:
        raise ListenError(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"encoding {quote(encoding)} is not supported: linear16, mulaw or alaw",
        )
    # Telephone audio is 8 kHz unless the client says otherwise (Deepgram asks for it).
    sample_rate = 16000 if encoding == "linear16" else 8000
    if "sample_rate" in values:
        sample_rate = _integer("sample_rate", values["sample_rate"], 1, 10**6)
        if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
            raise ListenError(
                ErrorCode.UNSUPPORTED_SAMPLE_RATE,
                f"sample_rate must be between {MIN_SAMPLE_RATE} and {MAX_SAMPLE_RATE} Hz",
            )
    if "channels" in values and _integer("channels", values["channels"], 1, 64) != 1:
        raise ListenError(ErrorCode.UNSUPPORTED_CHANNELS, "channels must be 1 (mono)")
    language = values.get("language")
    if language is not None:
        language = "auto" if language.strip().lower() == "multi" else language.strip()
    endpointing = True
    if "endpointing" in values:
        raw = values["endpointing"].strip().lower()
        if raw in ("true", "false"):
            endpointing = raw == "true"
        else:
            _integer("endpointing", raw, 0, 60_000)  # the engine's own pause rule applies
    utterance_end_ms = None
    if "utterance_end_ms" in values:
        utterance_end_ms = _integer("utterance_end_ms", values["utterance_end_ms"], 1000, 60_000)
    return ListenOptions(
        model=model,
        language=language,
        encoding=encoding,
        sample_rate=sample_rate,
        interim_results=_flag("interim_results", values.get("interim_results", "false")),
        endpointing=endpointing,
        utterance_end_ms=utterance_end_ms,
        vad_events=_flag("vad_events", values.get("vad_events", "false")),
        punctuate=_flag("punctuate", values.get("punctuate", "false")),
        smart_format=_flag("smart_format", values.get("smart_format", "false")),
    )


@dataclass(frozen=True, slots=True)
class _Word:
    word: str
    start: float
    end: float
    confidence: float | None


def _words(raw: object) -> tuple[_Word, ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw:
        confidence = item.get("confidence")
        out.append(
            _Word(
                str(item["word"]).strip(),  # whisper's words may carry their space
                float(item["start"]),
                float(item["end"]),
                None if confidence is None else float(confidence),
            )
        )
    return tuple(out)


def _plain(word: str) -> str:
    """Deepgram's ``word``: lowercase, no surrounding punctuation (``punctuated_word`` keeps
    the engine's spelling)."""
    return _WORD_STRIP.sub("", word).lower() or word.lower()


def _seconds(value: float) -> float:
    return round(value, 3)


# Native message types the client may not send here: renamed before the session sees them, so
# a Deepgram client cannot start, end or cancel a native stream by name.
_NATIVE_TYPES = frozenset({"start", "end", "cancel"})


class ListenTranslator:
    """One ``/v1/listen`` connection's translation, both ways (see the module docstring).

    ``request_id``, ``model_uuid`` and ``created`` (an ISO 8601 time) are the app layer's:
    this class reads no clock and draws no random numbers.
    """

    def __init__(
        self, options: ListenOptions, *, request_id: str, model_uuid: str, created: str
    ) -> None:
        self.options = options
        self.streaming = False  # the native ready was seen: client messages may flow
        self.closed = False  # the native session's last event (error or stats) was seen
        self._request_id = request_id
        self._model_uuid = model_uuid
        self._created = created
        self._model_info = {"name": options.model, "version": "talkies", "arch": "talkies"}
        self._out: list[str] = []
        self._text: bytearray | None = None  # fragments of a text message
        self._audio_hash = hashlib.sha256()  # of that audio: Metadata's sha256
        self._segment_start = 0.0  # where the current (not yet final) results begin
        self._speaking = False  # SpeechStarted was sent for the open utterance
        self._last_word_end: float | None = None  # of words sent final since UtteranceEnd
        self._why: str | None = None  # the detail of the failure the session is about to send
        self._ending = False  # CloseStream was passed on as the native end
        self._binary_open = False  # a binary message's fragments are arriving
        self._audio_bytes = 0  # of 16 kHz PCM16 passed to the session
        self._cuts: deque[float] = deque()  # where each Finalize not answered yet is (s)

    # -- client -> session -------------------------------------------------------------------

    def start(self) -> TextReceived:
        """The session's first input: the native start the query implies."""
        return TextReceived(data=self.options.start_message())

    def client(self, batch: list[ClientInput]) -> list[ClientInput]:
        """The session's inputs for one read of client messages (Deepgram messages that are
        answered here leave an empty :class:`AudioBatch`: client activity, no audio)."""
        out: list[ClientInput] = []
        for item in batch:
            if self._ending and isinstance(item, AudioBatch | BinaryReceived):
                # Audio after CloseStream (a client's frames still queued as it closed) is
                # past the end: dropped, so that the flush still answers for what came before.
                continue
            if isinstance(item, AudioBatch):
                if b"" in item.frames:  # an empty message: Deepgram's older CloseStream
                    # The audio before it, counted as any; audio after it is past the end.
                    before = item.frames[: item.frames.index(b"")]
                    out.extend(self.client([AudioBatch(frames=before)]) if before else [])
                    out.extend(self._close_stream())
                    continue
                for frame in item.frames:
                    self._audio_hash.update(frame)
                    self._audio_bytes += len(frame)
                out.append(item)
            elif isinstance(item, BinaryReceived):
                whole = not self._binary_open  # a message's first fragment, or all of it
                self._binary_open = not item.final
                if whole and item.final and not item.data:  # an empty message (ASGI's form)
                    out.extend(self._close_stream())
                    continue
                if self._text is not None:
                    # Not possible on a real WebSocket; the session answers invalid_message.
                    out.append(TextReceived(data=bytes(self._text), final=False))
                    self._text = None
                self._audio_hash.update(item.data)
                self._audio_bytes += len(item.data)
                out.append(item)
            elif isinstance(item, TextReceived):
                out.extend(self._text_part(item))
            else:
                out.append(item)
        return out

    def _close_stream(self) -> list[ClientInput]:
        """``CloseStream`` (or an empty binary message, Deepgram's older form of it): the
        native end, once; a repeat is nothing, the flush being under way."""
        if self._ending:
            return []
        self._ending = True
        return [END]

    def _text_part(self, item: TextReceived) -> list[ClientInput]:
        data = (
            item.data.encode("utf-8", "surrogatepass") if isinstance(item.data, str) else item.data
        )
        buffered = self._text if self._text is not None else bytearray()
        if len(buffered) + len(data) > MAX_CONTROL_BYTES:
            # The session refuses it with message_too_large, as a native control message.
            self._text = None
            return [TextReceived(data=bytes(buffered) + data[: MAX_CONTROL_BYTES + 1])]
        if not item.final:
            buffered += data
            self._text = buffered
            return []
        self._text = None
        return self._control(bytes(buffered) + data if buffered else data)

    def _control(self, data: bytes) -> list[ClientInput]:
        try:
            message = json.loads(data)
        except (ValueError, RecursionError):
            return [TextReceived(data=data)]  # the session says why: invalid_json
        kind = message.get("type") if isinstance(message, dict) else None
        if not isinstance(kind, str):
            return [TextReceived(data=data)]  # invalid_message / missing_field, natively
        if kind == "CloseStream":
            return self._close_stream()
        # KeepAlive and Finalize after CloseStream: the flush answers for both (LiveKit sends
        # them while it closes); before ready, the session has no idle timer to restart.
        live = self.streaming and not self._ending
        if kind == "KeepAlive":
            return [AudioBatch(frames=())] if live else []
        if kind == "Finalize":
            if self._ending:
                return []
            if live:
                # Where the cut is: its answer's audio_seconds is all the session had taken
                # by then, audio sent after the Finalize included.
                self._cuts.append(self._audio_bytes / (2 * SAMPLE_RATE))
                return [CutRequested()]  # answered by the cut's endpoint
            self._finalize_nothing()
            return []
        self._why = f"the message type {quote(kind)} is not supported on /v1/listen"
        renamed = kind if kind not in _NATIVE_TYPES else f"{kind}?"
        return [TextReceived(data=DUMPS({"type": renamed}))]

    def _finalize_nothing(self) -> None:
        """A Finalize before the native ready: nothing was decoded yet, so nothing is final."""
        if self.closed:
            return  # after the session's last message: nothing more is said
        self._results("", (), is_final=True, speech_final=False, from_finalize=True, end=0.0)

    # -- session -> client -------------------------------------------------------------------

    def session(self, text: str) -> None:
        """One native event (as the session wrote it); its Deepgram messages are pulled with
        :meth:`pull_messages`."""
        event = json.loads(text)
        kind = event["type"]
        if kind == "ready":
            self.streaming = True
        elif kind in ("partial", "endpoint", "final"):
            self._transcript(kind, event)
        elif kind == "stats":
            self.closed = True
            if not event["canceled"]:
                self._metadata(float(event["audio_seconds"]))
        elif kind == "error":
            self.closed = True
            detail = str(event["detail"])
            if event["code"] == ErrorCode.INVALID_EVENT.value and self._why is not None:
                detail = self._why
            self._emit(
                {
                    "type": "Error",
                    "variant": event["code"],
                    "code": event["code"],
                    "description": detail,
                    "message": detail,
                }
            )

    def closing(self) -> None:
        """The connection is being closed (with or without a last message): from now on the
        translator says nothing of its own."""
        self.closed = True

    @property
    def has_messages(self) -> bool:
        """Whether :meth:`pull_messages` has Deepgram messages to give."""
        return bool(self._out)

    def pull_messages(self) -> list[str]:
        """The Deepgram messages produced since the last call, in order."""
        out, self._out = self._out, []
        return out

    def _transcript(self, kind: str, event: dict[str, Any]) -> None:
        text, words = str(event["text"]), _words(event.get("words"))
        end = float(event["audio_seconds"])
        options = self.options
        if kind == "partial":
            if options.vad_events and not self._speaking and (text or words):
                self._speaking = True
                start = words[0].start if words else self._segment_start
                self._emit(
                    {"type": "SpeechStarted", "channel": [0, 1], "timestamp": _seconds(start)}
                )
            if options.interim_results:
                self._results(text, words, is_final=False, speech_final=False, end=end)
            return
        finalize = event.get("cut") is True  # the answer to a Finalize
        speech_final = not finalize and (kind == "final" or options.endpointing)
        if finalize and self._cuts:
            end = self._cuts.popleft()  # the window ends where the Finalize was
        elif kind != "final" and words:
            # The engine decides an utterance has ended a pause after its last word, and by
            # then the next one may have begun (a short pause): its window ends with its
            # speech, so that the next result's window holds all of its own words.
            end = words[-1].end
        self._results(
            text, words, is_final=True, speech_final=speech_final, end=end, from_finalize=finalize
        )
        # A new utterance: the engine's next hypothesis starts afresh.
        self._speaking = False
        if kind == "endpoint" and not finalize and options.utterance_end_ms is not None:
            if self._last_word_end is not None:
                self._emit(
                    {
                        "type": "UtteranceEnd",
                        "channel": [0, 1],
                        "last_word_end": _seconds(self._last_word_end),
                    }
                )
            self._last_word_end = None

    def _results(
        self,
        text: str,
        words: tuple[_Word, ...],
        *,
        is_final: bool,
        speech_final: bool,
        end: float,
        from_finalize: bool = False,
    ) -> None:
        start = self._segment_start
        end = max(end, words[-1].end if words else 0.0, start)
        known = [w.confidence for w in words if w.confidence is not None]
        # Where the engine measures no confidence, 1.0 (docs/dialects.md): the field is required.
        confidence = sum(known) / len(known) if known and len(known) == len(words) else 1.0
        self._emit(
            {
                "type": "Results",
                "channel_index": [0, 1],
                "duration": _seconds(end - start),
                "start": _seconds(start),
                "is_final": is_final,
                "speech_final": speech_final,
                "from_finalize": from_finalize,
                "channel": {
                    "alternatives": [
                        {
                            "transcript": text,
                            "confidence": _unit(confidence),
                            "words": [_word_dict(w) for w in words],
                        }
                    ]
                },
                "metadata": {
                    "request_id": self._request_id,
                    "model_info": self._model_info,
                    "model_uuid": self._model_uuid,
                },
            }
        )
        if is_final:
            self._segment_start = end
            if words:
                self._last_word_end = words[-1].end

    def _metadata(self, audio_seconds: float) -> None:
        self._emit(
            {
                "type": "Metadata",
                "transaction_key": "deprecated",
                "request_id": self._request_id,
                "sha256": self._audio_hash.hexdigest(),
                "created": self._created,
                "duration": _seconds(audio_seconds),
                "channels": 1,
                "models": [self._model_uuid],
                "model_info": {self._model_uuid: self._model_info},
            }
        )

    def _emit(self, message: dict[str, Any]) -> None:
        self._out.append(DUMPS(message))


def _unit(value: float) -> float:
    return min(1.0, max(0.0, value)) if math.isfinite(value) else 1.0


def _word_dict(word: _Word) -> dict[str, Any]:
    return {
        "word": _plain(word.word),
        "start": _seconds(word.start),
        "end": _seconds(word.end),
        "confidence": _unit(word.confidence if word.confidence is not None else 1.0),
        "punctuated_word": word.word,
    }
