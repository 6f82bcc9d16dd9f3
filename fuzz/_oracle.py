"""The fuzz harnesses' oracles, and the byte format of their session programs.

The contract's invariants live in :mod:`talkies.protocol.audit` (:class:`SessionAudit`,
:func:`check_event_json`); every session here is driven through ``SessionAudit.step``, so a
broken invariant raises its :class:`InvariantViolation`. What is left here is specific to the
harnesses, and needs no atheris (tests replay the seed corpora with the standard library):

* :func:`check_control_message` -- the parser functions on arbitrary bytes, and a session's
  answer to the same bytes as its first and as a mid-stream message, compared.
* :func:`check_session_program` -- a decoded program (:func:`decode_program`) run on a session
  that gets every message whole and a replica that gets them in fragments, compared.

The program format is our own front-to-back byte format (:class:`ByteReader`) rather than
``atheris.FuzzedDataProvider``: the provider takes integers from the end of the buffer and
its string encodings are an implementation detail, so seeds written from readable
descriptions (``fuzz/make_seeds.py``, via :class:`ProgramWriter`) would be tied to one atheris
version, and the tests would need atheris to decode them. Running out of bytes inside a step
reads zeros, so every byte string decodes to some program.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from itertools import pairwise
from typing import Any

from talkies.protocol import (
    MAX_CONTROL_BYTES,
    SAMPLE_RATE,
    Action,
    AudioBatch,
    AuthRejected,
    BinaryReceived,
    Close,
    CloseCode,
    EngineEndpoint,
    EngineFailed,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    Error,
    ErrorCode,
    Feed,
    Flush,
    Input,
    Open,
    PeerGone,
    ProtocolError,
    Refused,
    Release,
    Send,
    SessionLimits,
    ShuttingDown,
    StartOptions,
    State,
    Stats,
    StreamSession,
    TextReceived,
    Tick,
    Word,
)
from talkies.protocol.audit import InvariantViolation, SessionAudit, check_event_json
from talkies.protocol.messages import MessageType, check_control, parse_envelope, parse_start

__all__ = [
    "FUZZ_LIMITS",
    "ByteReader",
    "InvariantViolation",
    "Op",
    "ProgramWriter",
    "SessionReport",
    "Step",
    "check_control_message",
    "check_session_program",
    "decode_program",
    "deliver",
    "start_message_bytes",
]

# Small limits so that every limit is reachable by a short input; the start timeout shorter
# than the idle one, so that each of the two deadlines can be the one that fires first.
FUZZ_LIMITS = SessionLimits(
    max_frame_bytes=4096,
    max_duration_seconds=1.0,
    idle_timeout_seconds=5.0,
    start_timeout_seconds=3.0,
)

_ERROR_CODES: tuple[ErrorCode, ...] = tuple(ErrorCode)


def deliver(
    session: StreamSession, audit: SessionAudit, inputs: Sequence[Input], now: float, label: str
) -> list[Action]:
    """``audit.step`` each input in order; a violation is noted with ``label`` and the input."""
    out: list[Action] = []
    for event in inputs:
        try:
            out += audit.step(session, event, now)
        except InvariantViolation as exc:
            exc.add_note(f"{label}: {event!r:.300} at t={now:g}")
            raise
    return out


# -- the control-message oracle ------------------------------------------------------------


def start_message_bytes(options: StartOptions) -> bytes:
    """A start message that asks for exactly ``options`` (all fields spelled out)."""
    body: dict[str, Any] = {
        "type": "start",
        "model": options.model,
        "encoding": options.encoding,
        "sample_rate": options.sample_rate,
        "channels": options.channels,
        "interim_results": options.interim_results,
        "word_timestamps": options.word_timestamps,
    }
    if options.language is not None:
        body["language"] = options.language
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True, slots=True)
class _Parsed:
    """What the parser functions made of one message, called as the session would."""

    kind: MessageType | None  # None: the envelope was rejected
    options: StartOptions | None  # a valid start
    error: ProtocolError | None  # the envelope's error, else the body's (start/end/cancel)


def _parse_control(data: bytes) -> _Parsed:
    try:
        envelope = parse_envelope(data)
    except ProtocolError as exc:
        return _Parsed(None, None, exc)
    try:
        if envelope.type is MessageType.START:
            return _Parsed(envelope.type, parse_start(envelope.body), None)
        if envelope.type in (MessageType.END, MessageType.CANCEL):
            check_control(envelope)
    except ProtocolError as exc:
        return _Parsed(envelope.type, None, exc)
    return _Parsed(envelope.type, None, None)


def _check_parser_error(error: ProtocolError) -> None:
    if not isinstance(error.code, ErrorCode) or error.code.close_code is not CloseCode.INVALID:
        raise InvariantViolation(f"the parser raised {error.code!r}, which does not close 4400")
    if not isinstance(error.detail, str):
        raise InvariantViolation(f"ProtocolError.detail is not a str: {error.detail!r}")
    check_event_json(Error(code=error.code, detail=error.detail))
    if len(error.detail.encode("utf-8")) > 1024:
        raise InvariantViolation(f"error detail of {len(error.detail)} chars echoes too much")


def _error_actions(code: ErrorCode) -> list[object]:
    return [("error", code), Close(code=code.close_code, reason=code.value)]


def _shape(actions: Sequence[Action]) -> list[object]:
    """Actions with error details dropped, for comparisons where only the code is fixed."""
    return [
        ("error", a.event.code) if isinstance(a, Send) and isinstance(a.event, Error) else a
        for a in actions
    ]


_VALID_START = start_message_bytes(StartOptions(model="m"))


def _reply(data: str | bytes, *, streaming: bool) -> list[Action]:
    """A fresh (or, if ``streaming``, a ready) session's audited answer to one message."""
    session, audit = StreamSession(FUZZ_LIMITS, now=0.0), SessionAudit()
    if streaming:
        deliver(session, audit, [TextReceived(data=_VALID_START), EngineOpened()], 0.0, "setup")
        if session.state is not State.STREAMING:
            raise InvariantViolation(f"a valid start and EngineOpened left {session.state}")
    return deliver(session, audit, [TextReceived(data=data)], 0.0, "control message")


def check_control_message(data: bytes) -> None:
    """The control-message oracle for one arbitrary byte string.

    * ``parse_envelope`` then ``parse_start``/``check_control`` return or raise
      ``ProtocolError`` with an ``ErrorCode`` that closes with 4400; anything else escapes.
    * More than 4096 bytes is always ``message_too_large``.
    * A valid start re-serialised (:func:`start_message_bytes`) parses to the same options.
    * The session answers the same bytes (as bytes, and as str where they are UTF-8) as the
      parser predicts: as the first message (Open, or the parser's error, or
      ``invalid_event``) and mid-stream (Flush, cancel's stats, or an error after Release).
    """
    parsed = _parse_control(data)
    if parsed.error is not None:
        _check_parser_error(parsed.error)
    if len(data) > MAX_CONTROL_BYTES and (
        parsed.error is None or parsed.error.code is not ErrorCode.MESSAGE_TOO_LARGE
    ):
        raise InvariantViolation(
            f"{len(data)}-byte control message was not message_too_large: {parsed}"
        )

    if parsed.options is not None:
        again = parse_start(parse_envelope(start_message_bytes(parsed.options)).body)
        if again != parsed.options:
            raise InvariantViolation(
                f"start options do not round-trip: {parsed.options} -> {again}"
            )

    # As the first message of a session.
    first = _reply(data, streaming=False)
    if parsed.kind is None or (parsed.kind is MessageType.START and parsed.error is not None):
        assert parsed.error is not None
        expected_first: list[object] = _error_actions(parsed.error.code)
        if parsed.error.code is not ErrorCode.MESSAGE_TOO_LARGE and (
            first[:1] != [Send(event=Error(code=parsed.error.code, detail=parsed.error.detail))]
        ):
            raise InvariantViolation(f"session and parser disagree on the detail: {first}")
    elif parsed.kind is MessageType.START:
        assert parsed.options is not None
        expected_first = [Open(options=parsed.options)]
    else:  # end, cancel, another type: not allowed before start, whatever the fields
        expected_first = _error_actions(ErrorCode.INVALID_EVENT)
    if _shape(first) != expected_first:
        raise InvariantViolation(
            f"first-message reply {first} does not match the parser: expected {expected_first}"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        as_str = _reply(text, streaming=False)
        if as_str != first:
            raise InvariantViolation(
                f"the same message as str and as bytes gives {as_str} and {first}"
            )

    # Mid-stream, after ready.
    middle = _reply(data, streaming=True)
    expected_middle: list[object]
    if parsed.kind is None:
        assert parsed.error is not None
        expected_middle = [Release(), *_error_actions(parsed.error.code)]
    elif parsed.kind in (MessageType.START, MessageType.OTHER):
        expected_middle = [Release(), *_error_actions(ErrorCode.INVALID_EVENT)]
    elif parsed.error is not None:
        expected_middle = [Release(), *_error_actions(parsed.error.code)]
    elif parsed.kind is MessageType.END:
        expected_middle = [Flush()]
    else:
        expected_middle = [
            Release(),
            Send(event=Stats(audio_seconds=0.0, frames=0, canceled=True)),
            Close(code=CloseCode.NORMAL, reason=""),
        ]
    if _shape(middle) != expected_middle:
        raise InvariantViolation(
            f"mid-stream reply {middle} does not match the parser: expected {expected_middle}"
        )


# -- the program format --------------------------------------------------------------------


class ByteReader:
    """Reads a fuzz input front to back; past the end it reads zeros and empty strings."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def u8(self) -> int:
        if self._pos >= len(self._data):
            return 0
        value = self._data[self._pos]
        self._pos += 1
        return value

    def u16(self) -> int:
        """Little-endian."""
        low = self.u8()
        return low | (self.u8() << 8)

    def take(self, count: int) -> bytes:
        chunk = self._data[self._pos : self._pos + count]
        self._pos += len(chunk)
        return chunk


class Op(IntEnum):
    """A step's first byte, modulo ``len(Op)``. The layout of each step's arguments:

    START      flags, model, language, corrupt_field, corrupt_value, SPLITS
    END        flags, SPLITS                    (CANCEL alike)
    TEXT       flags, length:u16, (fill | length bytes), SPLITS
    BINARY     length:u16, pattern, SPLITS
    TEXT_PART  flags, length, length bytes      (final=False; both replicas get it)
    AUDIO_PART length:u16, pattern              (final=False; both replicas get it)
    PARTIAL    TEXT_ARG, count, count x (TEXT_ARG, start, duration, confidence)
    FAILED     TEXT_ARG;   REFUSED: code, TEXT_ARG;   TICK: tenths of a second to wait

    SPLITS = spec, (spec & 3) x point:u16 -- where the replica splits the message; bit 7 of
    spec splits a str message's UTF-8 bytes instead of its characters.
    TEXT_ARG = spec, (spec & 63) bytes, decoded with surrogateescape if bit 6 else replace.
    """

    START = 0
    END = 1
    CANCEL = 2
    TEXT = 3
    BINARY = 4
    TEXT_PART = 5
    AUDIO_PART = 6
    OPENED = 7
    PARTIAL = 8
    ENDPOINT = 9
    FINAL = 10
    FAILED = 11
    REFUSED = 12
    AUTH_REJECTED = 13
    PEER_GONE = 14
    SHUTTING_DOWN = 15
    TICK = 16


# START flags
START_AS_BYTES = 1
START_LANGUAGE = 2
START_INTERIM = 4
START_INTERIM_VALUE = 8
START_WORDS = 16
START_WORDS_VALUE = 32
START_CORRUPT = 64
START_REVERSED = 128
# END / CANCEL flags
CONTROL_AS_BYTES = 1
CONTROL_EXTRA_FIELD = 2
CONTROL_SPACES = 4
# TEXT / TEXT_PART flags
TEXT_AS_BYTES = 1
TEXT_REPEAT = 2

MODELS: tuple[str, ...] = ("nemotron-3.5-asr-0.6b", "vosk-small-en", "m", "a" * 128, "a" * 129)
LANGUAGES: tuple[str, ...] = (
    "auto",
    "en",
    "en-US",
    "pt_br",
    "zh-Hant-TW",
    "sl-rozaj-biske",
    "de-1996",
    "EN_us",
    "",
    "english",
)
_DELETE = object()
START_FIELDS: tuple[str, ...] = (
    "type",
    "model",
    "encoding",
    "sample_rate",
    "channels",
    "language",
    "interim_results",
    "word_timestamps",
    "extra",
)
BAD_VALUES: tuple[object, ...] = (
    _DELETE,
    None,
    True,
    False,
    0,
    1,
    2,
    -1,
    8000,
    16000,
    16000.0,
    1.5,
    "",
    "start",
    "end",
    "pcm_s16le",
    "PCM_S16LE",
    "auto",
    "x" * 300,
    [],
    {},
    {"type": "start"},
)
MAX_TEXT = 2 * MAX_CONTROL_BYTES + 2  # TEXT lengths are taken modulo this
MAX_STEPS = 256
_PATTERN = bytes(range(256)) * ((FUZZ_LIMITS.max_frame_bytes + 65) // 256 + 2)


def _audio_size(raw: int) -> int:
    return raw % (FUZZ_LIMITS.max_frame_bytes + 65)


def _pattern(size: int, seed: int) -> bytes:
    """Distinct bytes, so that fragments reassembled out of order would show."""
    return _PATTERN[seed : seed + size]


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a program: the primary gets ``whole``, the replica ``split``, at ``now``."""

    now: float
    whole: tuple[Input, ...]
    split: tuple[Input, ...]
    label: str


def _decode_text_arg(reader: ByteReader) -> str:
    spec = reader.u8()
    raw = reader.take(spec & 63)
    return raw.decode("utf-8", "surrogateescape" if spec & 64 else "replace")


def _decode_words(reader: ByteReader) -> tuple[Word, ...]:
    words = []
    for _ in range(reader.u8() % 4):
        text = _decode_text_arg(reader)
        start = reader.u8() / 10
        end = start + reader.u8() / 10
        confidence_raw = reader.u8()
        confidence = None if confidence_raw == 255 else confidence_raw / 254
        words.append(Word(word=text, start=start, end=end, confidence=confidence))
    return tuple(words)


def _message(
    reader: ByteReader, data: str | bytes, *, binary: bool
) -> tuple[tuple[Input, ...], tuple[Input, ...]]:
    """The whole message for the primary and its fragments (from SPLITS) for the replica."""
    spec = reader.u8()
    points = [reader.u16() for _ in range(spec & 3)]
    whole: Input = BinaryReceived(data=data) if binary else TextReceived(data=data)  # type: ignore[arg-type]
    if not points:
        return (whole,), (whole,)
    source: str | bytes = data
    if isinstance(data, str) and spec & 128:
        source = data.encode("utf-8", "surrogatepass")
    cuts = sorted(p % (len(source) + 1) for p in points)
    pieces = [source[a:b] for a, b in pairwise([0, *cuts, len(source)])]
    last = len(pieces) - 1
    if binary:
        split: tuple[Input, ...] = tuple(
            BinaryReceived(data=piece, final=i == last)  # type: ignore[arg-type]
            for i, piece in enumerate(pieces)
        )
    else:
        split = tuple(TextReceived(data=piece, final=i == last) for i, piece in enumerate(pieces))
    return (whole,), split


def _start_text(reader: ByteReader) -> tuple[str | bytes, str]:
    flags = reader.u8()
    model = MODELS[reader.u8() % len(MODELS)]
    language = LANGUAGES[reader.u8() % len(LANGUAGES)]
    corrupt_field = START_FIELDS[reader.u8() % len(START_FIELDS)]
    corrupt_value = BAD_VALUES[reader.u8() % len(BAD_VALUES)]
    body: dict[str, object] = {
        "type": "start",
        "model": model,
        "encoding": "pcm_s16le",
        "sample_rate": SAMPLE_RATE,
        "channels": 1,
    }
    if flags & START_LANGUAGE:
        body["language"] = language
    if flags & START_INTERIM:
        body["interim_results"] = bool(flags & START_INTERIM_VALUE)
    if flags & START_WORDS:
        body["word_timestamps"] = bool(flags & START_WORDS_VALUE)
    label = "start"
    if flags & START_CORRUPT:
        if corrupt_value is _DELETE:
            body.pop(corrupt_field, None)
            label = f"start without {corrupt_field}"
        else:
            body[corrupt_field] = corrupt_value
            label = f"start with {corrupt_field}={corrupt_value!r:.20}"
    if flags & START_REVERSED:
        body = dict(reversed(body.items()))
    text = json.dumps(body)
    return (text.encode("utf-8") if flags & START_AS_BYTES else text), label


def _control_text(reader: ByteReader, kind: str) -> tuple[str | bytes, str]:
    flags = reader.u8()
    body: dict[str, object] = {"type": kind}
    if flags & CONTROL_EXTRA_FIELD:
        body["extra"] = 1
    text = json.dumps(body, separators=(", ", ": ") if flags & CONTROL_SPACES else (",", ":"))
    return (text.encode("utf-8") if flags & CONTROL_AS_BYTES else text), kind


def decode_program(data: bytes) -> list[Step]:
    """Decode fuzz bytes into at most ``MAX_STEPS`` steps (see :class:`Op`)."""
    reader = ByteReader(data)
    steps: list[Step] = []
    now = 0.0
    ops = tuple(Op)
    while reader.remaining and len(steps) < MAX_STEPS:
        op = ops[reader.u8() % len(ops)]
        message: str | bytes
        single: Input
        if op is Op.START:
            message, label = _start_text(reader)
        elif op in (Op.END, Op.CANCEL):
            message, label = _control_text(reader, op.name.lower())
        elif op is Op.TEXT:
            flags = reader.u8()
            length = reader.u16() % MAX_TEXT
            raw = bytes([reader.u8()]) * length if flags & TEXT_REPEAT else reader.take(length)
            message = raw if flags & TEXT_AS_BYTES else raw.decode("utf-8", "surrogateescape")
            label = f"text {len(raw)} bytes"
        elif op is Op.BINARY:
            size = _audio_size(reader.u16())
            pcm = _pattern(size, reader.u8())
            whole, split = _message(reader, pcm, binary=True)
            steps.append(Step(now, whole, split, f"binary {size} bytes"))
            continue
        else:
            if op is Op.TEXT_PART:
                flags = reader.u8()
                raw = reader.take(reader.u8())
                part = raw if flags & TEXT_AS_BYTES else raw.decode("utf-8", "surrogateescape")
                single = TextReceived(data=part, final=False)
            elif op is Op.AUDIO_PART:
                size = _audio_size(reader.u16())
                single = BinaryReceived(data=_pattern(size, reader.u8()), final=False)
            elif op is Op.OPENED:
                single = EngineOpened()
            elif op is Op.PARTIAL:
                single = EnginePartial(text=_decode_text_arg(reader), words=_decode_words(reader))
            elif op is Op.ENDPOINT:
                single = EngineEndpoint(text=_decode_text_arg(reader), words=_decode_words(reader))
            elif op is Op.FINAL:
                single = EngineFinal(text=_decode_text_arg(reader), words=_decode_words(reader))
            elif op is Op.FAILED:
                single = EngineFailed(detail=_decode_text_arg(reader))
            elif op is Op.REFUSED:
                code = _ERROR_CODES[reader.u8() % len(_ERROR_CODES)]
                single = Refused(code=code, detail=_decode_text_arg(reader))
            elif op is Op.AUTH_REJECTED:
                single = AuthRejected()
            elif op is Op.PEER_GONE:
                single = PeerGone()
            elif op is Op.SHUTTING_DOWN:
                single = ShuttingDown()
            else:
                now += reader.u8() / 10
                single = Tick()
            steps.append(Step(now, (single,), (single,), op.name.lower()))
            continue
        whole, split = _message(reader, message, binary=False)
        steps.append(Step(now, whole, split, label))
    return steps


class ProgramWriter:
    """Writes programs in the format :func:`decode_program` reads (for seeds and tests).

    ``splits`` are the replica's cut points (at most three; a str message is cut by
    characters unless ``split_bytes``).
    """

    def __init__(self) -> None:
        self._out = bytearray()

    def to_bytes(self) -> bytes:
        return bytes(self._out)

    def _u8(self, *values: int) -> None:
        for value in values:
            if not 0 <= value <= 255:
                raise ValueError(f"byte out of range: {value}")
            self._out.append(value)

    def _u16(self, value: int) -> None:
        if not 0 <= value <= 0xFFFF:
            raise ValueError(f"u16 out of range: {value}")
        self._out += value.to_bytes(2, "little")

    def _splits(self, splits: Sequence[int], split_bytes: bool) -> None:
        if len(splits) > 3:
            raise ValueError("at most three split points")
        self._u8(len(splits) | (128 if split_bytes else 0))
        for point in splits:
            self._u16(point)

    def _text_arg(self, text: str) -> None:
        """Engine text; lone surrogates U+DC80-U+DCFF (surrogateescape) stand for raw bytes."""
        raw = text.encode("utf-8", "surrogateescape")
        if len(raw) > 63:
            raise ValueError("engine text is at most 63 UTF-8 bytes")
        escaped = any(0xDC80 <= ord(char) <= 0xDCFF for char in text)
        self._u8(len(raw) | (64 if escaped else 0))
        self._out += raw

    def start(
        self,
        *,
        model: int = 0,
        language: int | None = None,
        interim_results: bool | None = None,
        word_timestamps: bool | None = None,
        corrupt: tuple[str, int] | None = None,
        as_bytes: bool = False,
        reversed_keys: bool = False,
        splits: Sequence[int] = (),
        split_bytes: bool = False,
    ) -> ProgramWriter:
        """``model``/``language`` index MODELS/LANGUAGES; ``corrupt``: (field, BAD_VALUES index)."""
        flags = START_AS_BYTES if as_bytes else 0
        if language is not None:
            flags |= START_LANGUAGE
        if interim_results is not None:
            flags |= START_INTERIM | (START_INTERIM_VALUE if interim_results else 0)
        if word_timestamps is not None:
            flags |= START_WORDS | (START_WORDS_VALUE if word_timestamps else 0)
        if corrupt is not None:
            flags |= START_CORRUPT
        if reversed_keys:
            flags |= START_REVERSED
        field_index = START_FIELDS.index(corrupt[0]) if corrupt else 0
        value_index = corrupt[1] if corrupt else 0
        self._u8(Op.START, flags, model, language or 0, field_index, value_index)
        self._splits(splits, split_bytes)
        return self

    def control(
        self,
        kind: str,
        *,
        extra_field: bool = False,
        spaces: bool = False,
        as_bytes: bool = False,
        splits: Sequence[int] = (),
        split_bytes: bool = False,
    ) -> ProgramWriter:
        """``kind`` is "end" or "cancel"."""
        flags = (
            (CONTROL_AS_BYTES if as_bytes else 0)
            | (CONTROL_EXTRA_FIELD if extra_field else 0)
            | (CONTROL_SPACES if spaces else 0)
        )
        self._u8(Op.END if kind == "end" else Op.CANCEL, flags)
        self._splits(splits, split_bytes)
        return self

    def text(
        self,
        data: bytes,
        *,
        as_bytes: bool = False,
        splits: Sequence[int] = (),
        split_bytes: bool = False,
    ) -> ProgramWriter:
        self._u8(Op.TEXT, TEXT_AS_BYTES if as_bytes else 0)
        self._u16(len(data))
        self._out += data
        self._splits(splits, split_bytes)
        return self

    def repeated_text(
        self, fill: int, length: int, *, as_bytes: bool = False, splits: Sequence[int] = ()
    ) -> ProgramWriter:
        self._u8(Op.TEXT, TEXT_REPEAT | (TEXT_AS_BYTES if as_bytes else 0))
        self._u16(length)
        self._u8(fill)
        self._splits(splits, False)
        return self

    def binary(self, size: int, *, pattern: int = 0, splits: Sequence[int] = ()) -> ProgramWriter:
        self._u8(Op.BINARY)
        self._u16(size)
        self._u8(pattern)
        self._splits(splits, False)
        return self

    def text_part(self, data: bytes, *, as_bytes: bool = False) -> ProgramWriter:
        self._u8(Op.TEXT_PART, TEXT_AS_BYTES if as_bytes else 0, len(data))
        self._out += data
        return self

    def audio_part(self, size: int, *, pattern: int = 0) -> ProgramWriter:
        self._u8(Op.AUDIO_PART)
        self._u16(size)
        self._u8(pattern)
        return self

    def opened(self) -> ProgramWriter:
        self._u8(Op.OPENED)
        return self

    def _transcript(
        self, op: Op, text: str, words: Sequence[tuple[str, float, float]]
    ) -> ProgramWriter:
        self._u8(op)
        self._text_arg(text)
        self._u8(len(words))
        for word, start, end in words:
            self._text_arg(word)
            self._u8(round(start * 10), round((end - start) * 10), 255)
        return self

    def partial(self, text: str, words: Sequence[tuple[str, float, float]] = ()) -> ProgramWriter:
        return self._transcript(Op.PARTIAL, text, words)

    def endpoint(self, text: str, words: Sequence[tuple[str, float, float]] = ()) -> ProgramWriter:
        return self._transcript(Op.ENDPOINT, text, words)

    def final(self, text: str, words: Sequence[tuple[str, float, float]] = ()) -> ProgramWriter:
        return self._transcript(Op.FINAL, text, words)

    def failed(self, detail: str) -> ProgramWriter:
        self._u8(Op.FAILED)
        self._text_arg(detail)
        return self

    def refused(self, code: ErrorCode, detail: str) -> ProgramWriter:
        self._u8(Op.REFUSED, _ERROR_CODES.index(code))
        self._text_arg(detail)
        return self

    def auth_rejected(self) -> ProgramWriter:
        self._u8(Op.AUTH_REJECTED)
        return self

    def peer_gone(self) -> ProgramWriter:
        self._u8(Op.PEER_GONE)
        return self

    def shutting_down(self) -> ProgramWriter:
        self._u8(Op.SHUTTING_DOWN)
        return self

    def tick(self, seconds: float) -> ProgramWriter:
        """Advance the clock by ``seconds`` (0-25.5, in tenths), then deliver Tick."""
        self._u8(Op.TICK, round(seconds * 10))
        return self


# -- the session oracle --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionReport:
    """How a checked program ended (the primary's view)."""

    steps: int
    outcome: str | None
    close_code: CloseCode | None
    error: ErrorCode | None
    frames: int
    samples: int
    actions: tuple[Action, ...]


def _joined_feeds(actions: Sequence[Action]) -> list[Action]:
    """``actions`` with each run of Feeds joined into one (their boundaries carry no meaning)."""
    out: list[Action] = []
    for action in actions:
        last = out[-1] if out else None
        if isinstance(action, Feed) and isinstance(last, Feed):
            out[-1] = Feed(pcm=last.pcm + action.pcm, frames=last.frames + action.frames)
        else:
            out.append(action)
    return out


def check_session_program(data: bytes, limits: SessionLimits = FUZZ_LIMITS) -> SessionReport:
    """Run the program ``data`` encodes through a session and two replicas.

    Every input goes through ``SessionAudit.step``. The fragmenting replica must give
    identical actions after every step (a message split into fragments is still one message);
    the batching replica gets runs of whole binary messages as one ``AudioBatch`` and must give
    the same actions once Feeds are joined. At the end all get ``PeerGone`` (every connection
    ends), which must close them, and they must agree.
    """
    steps = decode_program(data)
    names = ("whole", "split", "batched")
    runs = [(StreamSession(limits, now=0.0), SessionAudit(), name) for name in names]
    (a, primary, _), (b, replica, _), (c, batcher, _) = runs
    batch: list[bytes] = []
    batch_now = 0.0
    batch_expected: list[Action] = []

    def deliver_batch() -> None:
        nonlocal batch, batch_expected
        if batch:
            got = deliver(c, batcher, [AudioBatch(frames=tuple(batch))], batch_now, "batched")
            if _joined_feeds(got) != _joined_feeds(batch_expected):
                raise InvariantViolation(
                    f"AudioBatch of {len(batch)} frames differs from one input per frame:\n"
                    f"  batched:   {got}\n  per frame: {batch_expected}"
                )
            batch, batch_expected = [], []

    for index, step in enumerate(steps):
        label = f"step {index} ({step.label})"
        whole = deliver(a, primary, step.whole, step.now, f"whole, {label}")
        split = deliver(b, replica, step.split, step.now, f"fragmented, {label}")
        if whole != split:
            raise InvariantViolation(
                f"{label}: whole and fragmented delivery differ:\n"
                f"  whole:      {whole}\n  fragmented: {split}\n  fragments:  {step.split}"
            )
        one = step.whole[0] if len(step.whole) == 1 else None
        whole_binary = isinstance(one, BinaryReceived) and one.final
        if whole_binary and c._audio_parts is None and c._text_parts is None:
            assert isinstance(one, BinaryReceived)
            batch.append(one.data)
            batch_now = step.now
            batch_expected += whole
            continue
        deliver_batch()
        got = deliver(c, batcher, step.whole, step.now, f"batched, {label}")
        if got != whole:
            raise InvariantViolation(f"{label}: the batching replica differs: {got} / {whole}")
    deliver_batch()
    end = steps[-1].now if steps else 0.0
    for session, audit, name in runs:
        deliver(session, audit, [PeerGone()], end, f"{name}, the end")
    mine = (a.state, a.frames, a.samples, a.revision, a.outcome, a.close_code)
    for other in (b, c):
        theirs = (
            other.state,
            other.frames,
            other.samples,
            other.revision,
            other.outcome,
            other.close_code,
        )
        if mine != theirs:
            raise InvariantViolation(f"the replicas end apart: {mine} / {theirs}")
    return SessionReport(
        steps=len(steps),
        outcome=a.outcome,
        close_code=a.close_code,
        error=a.error.code if a.error is not None else None,
        frames=a.frames,
        samples=a.samples,
        actions=tuple(primary.actions),
    )
