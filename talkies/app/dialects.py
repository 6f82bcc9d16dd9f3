"""Other clients' protocols on the stream route: the I/O half of ``talkies/dialects``.

A :class:`ListenDialect` is one ``GET /v1/listen`` handshake (Deepgram's live API). It gives
:meth:`StreamRoute.serve <talkies.app.websocket.StreamRoute.serve>` what differs from the
native route, and nothing else differs: the same session, driver, server-wide and model slots,
frame and duration limits, engine runtime, metrics and log line.

- admission: ``Authorization: Token <t>`` or ``Bearer <t>``, or the browsers' subprotocol
  pair ``token, <t>`` (the server selects ``token``); never the URL;
- limits: Deepgram's idle timeout (``TALKIES_DEEPGRAM_IDLE_TIMEOUT``, 10 s, as Deepgram's own
  service) instead of the native one; every other limit is the native route's;
- refusal: a query it will not serve, answered as an ``Error`` message and the native close
  code, before any audio is read;
- the channel (:class:`ListenChannel`): the translator between the host's channel and the
  driver. Its first message is the native ``start`` the query implies. Deepgram clients send
  audio at once, without waiting for anything, so nothing more is read from the socket until
  the session's ``ready`` (or its close): their audio waits in the TCP window while the model
  opens, as a slow decoder's does, and none is refused for arriving early.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

import anyio
import numpy as np
import numpy.typing as npt
import soxr  # type: ignore[import-untyped]

from ..config import Settings
from ..dialects.deepgram import (
    END,
    ListenError,
    ListenOptions,
    ListenTranslator,
    parse_listen_query,
)
from ..engines.supply.builtin import DEFAULT_MODEL
from ..protocol import (
    SAMPLE_RATE,
    AudioBatch,
    BinaryReceived,
    CutRequested,
    Refused,
    SessionLimits,
)
from .driver import Channel, ClientMessage, DirectChannel
from .g711 import DECODERS
from .http import bearer_ok

__all__ = ["LISTEN_SCHEMES", "ListenChannel", "ListenDialect", "PcmResampler", "listen_admission"]

_TOKEN_PROTOCOL = "token"
LISTEN_SCHEMES = (b"token", b"bearer")  # Authorization schemes /v1/listen takes
# model_uuid: stable per model slug, so a client can group results by it as it would by
# Deepgram's model ids.
_MODEL_NAMESPACE = uuid.UUID("5b0c3c3e-6d1f-4d8e-9c43-7a1f0f6f2a11")


def listen_admission(
    headers: Iterable[tuple[bytes, bytes]], subprotocols: Iterable[str], token: str | None
) -> tuple[bool, str | None]:
    """(authorized, the subprotocol to select) for a ``/v1/listen`` handshake."""
    offered = [p.strip() for p in subprotocols]
    selected = _TOKEN_PROTOCOL if _TOKEN_PROTOCOL in offered else None
    if token is None:
        return True, selected
    if any(name.lower() == b"authorization" for name, _ in headers):
        return bearer_ok(headers, token, schemes=LISTEN_SCHEMES), selected
    if selected is not None:
        at = offered.index(_TOKEN_PROTOCOL)
        if at + 1 < len(offered):
            candidate = offered[at + 1].encode("utf-8", "surrogateescape")
            return hmac.compare_digest(candidate, token.encode("utf-8")), selected
    return False, selected


class ListenDialect:
    """One ``/v1/listen`` handshake (see the module docstring)."""

    name = "deepgram"

    def __init__(self, settings: Settings, query: bytes) -> None:
        self._settings = settings
        self._problem: ListenError | None = None
        try:
            options = parse_listen_query(query, default_model=DEFAULT_MODEL)
        except ListenError as exc:
            self._problem = exc
            options = ListenOptions(model=DEFAULT_MODEL)  # never opened: refused first
        self.translator = ListenTranslator(
            options,
            request_id=str(uuid.uuid4()),
            model_uuid=str(uuid.uuid5(_MODEL_NAMESPACE, options.model)),
            created=datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        )

    def admission(
        self, headers: Iterable[tuple[bytes, bytes]], subprotocols: Iterable[str], token: str | None
    ) -> tuple[bool, str | None]:
        return listen_admission(headers, subprotocols, token)

    def limits(self, native: SessionLimits) -> SessionLimits:
        return replace(native, idle_timeout_seconds=self._settings.deepgram_idle_timeout)

    def refusal(self) -> Refused | None:
        problem = self._problem
        return None if problem is None else Refused(code=problem.code, detail=problem.detail)

    def wrap(self, channel: Channel) -> Channel:
        options = self.translator.options
        rate, encoding = options.sample_rate, options.encoding
        max_frame = self._settings.stream_max_frame_bytes
        resampler = None
        if rate != SAMPLE_RATE or encoding != "linear16":
            resampler = PcmResampler(rate, max_frame, decoder=DECODERS.get(encoding))
        if isinstance(channel, DirectChannel):
            return DirectListenChannel(channel, self.translator, resampler)
        return ListenChannel(channel, self.translator, resampler)


class PcmResampler:
    """A client's PCM16 mono at ``rate`` (or G.711, decoded by ``decoder``'s table first) as
    16 kHz frames for the session, streaming.

    soxr's HQ resampler (libsoxr, the maintained library Talkies already uses for Piper's and
    Wyoming's audio; its quality is measured in tests/test_dialect_deepgram_resample.py),
    state kept across frames so frame boundaries change nothing. A frame the session would
    refuse (empty, an odd number of bytes, over ``TALKIES_STREAM_MAX_FRAME_BYTES``) is passed
    on as the client sent it, so it is refused with the native code; a resampled frame over
    the limit (upsampling) is split. Fragments of a message are joined first, up to the
    limit. At a cut (a Realtime commit) the resampler gives what it holds before the cut and
    starts again after it: the utterance before the cut gets all of its audio.

    Every frame goes straight to soxr's stream object (``soxr_ext.CSoxr``, what
    ``soxr.ResampleStream`` wraps: the same libsoxr stream and settings, without the
    wrapper's per-call checks and reshapes), the frame's bytes viewed, not copied, and
    the result's bytes taken as they are on a little-endian machine (bench/README.md,
    ``paced_dialects.py``).
    """

    # int16 as the wire has it (little-endian): then no conversion either way.
    _NATIVE = np.dtype(np.int16) == np.dtype("<i2")

    def __init__(
        self, rate: int, max_frame_bytes: int, *, decoder: npt.NDArray[np.int16] | None = None
    ) -> None:
        self._rate = rate
        self._decoder = decoder  # G.711: each byte's sample (talkies.app.g711)
        self._max = max_frame_bytes
        self._step = max_frame_bytes & ~1
        self._parts = bytearray()
        self._process = self._new_stream()

    def _new_stream(self) -> Callable[[np.ndarray[Any, Any], bool], np.ndarray[Any, Any]]:
        """A fresh stream's ``process`` (a 2-D int16 array of frames x 1 channel in, the
        same out); the stream lives as long as the bound method."""
        ext = soxr.soxr_ext
        stream = ext.CSoxr(self._rate, SAMPLE_RATE, 1, ext.SOXR_INT16_I, ext.HQ, False)
        process: Callable[[np.ndarray[Any, Any], bool], np.ndarray[Any, Any]]
        process = stream.process_int16
        return process

    def convert(self, batch: list[ClientMessage]) -> list[ClientMessage]:
        if len(batch) == 1 and type(batch[0]) is AudioBatch:  # one append: the usual
            return [self._audio(batch[0])]
        out: list[ClientMessage] = []
        for item in batch:
            if isinstance(item, AudioBatch):
                out.append(self._audio(item))
            elif isinstance(item, BinaryReceived):
                if len(self._parts) + len(item.data) > self._max:
                    whole = bytes(self._parts) + item.data  # over the limit: refused as sent
                    self._parts.clear()
                    out.append(BinaryReceived(data=whole))
                elif not item.final:
                    self._parts += item.data
                else:
                    whole = bytes(self._parts) + item.data
                    self._parts.clear()
                    out.append(AudioBatch(frames=tuple(self._frame(whole))))
            elif isinstance(item, CutRequested):
                held = self.tail()
                if held:
                    out.append(AudioBatch(frames=tuple(held)))
                out.append(item)
            else:
                out.append(item)
        return out

    def _audio(self, batch: AudioBatch) -> AudioBatch:
        frames: list[bytes] = []
        for frame in batch.frames:
            frames.extend(self._frame(frame if type(frame) is bytes else bytes(frame)))
        return AudioBatch(frames=tuple(frames))

    def tail(self) -> list[bytes]:
        """What the resampler still holds, at the end of the audio (or at a cut); audio
        after it starts a fresh stream (libsoxr takes nothing after its last input)."""
        held = self._split(self._process(np.zeros((0, 1), dtype=np.int16), True))
        self._process = self._new_stream()
        return held

    def _frame(self, pcm: bytes) -> list[bytes]:
        if not pcm or len(pcm) > self._max:
            return [pcm]
        if self._decoder is not None:  # G.711: a byte is a sample
            samples = self._decoder[np.frombuffer(pcm, dtype=np.uint8)]
            return self._split(self._process(samples.reshape(-1, 1), False))
        if len(pcm) & 1:
            return [pcm]
        if self._NATIVE:
            samples = np.frombuffer(pcm, dtype=np.int16)
        else:
            samples = np.frombuffer(pcm, dtype="<i2").astype(np.int16)
        return self._split(self._process(samples.reshape(-1, 1), False))

    def _split(self, resampled: np.ndarray[Any, Any]) -> list[bytes]:
        pcm = resampled.tobytes() if self._NATIVE else resampled.astype("<i2").tobytes()
        step = self._step
        if 0 < len(pcm) <= step:
            return [pcm]
        return [pcm[i : i + step] for i in range(0, len(pcm), step)]  # none when empty


class Translating(Protocol):
    """What a channel needs of a dialect's translator (talkies/dialects)."""

    streaming: bool
    closed: bool

    def session(self, text: str) -> None: ...
    def closing(self) -> None: ...
    @property
    def has_messages(self) -> bool: ...
    def pull_messages(self) -> list[str]: ...


T = TypeVar("T", bound=Translating)


class TranslatingChannel(Generic[T]):
    """The driver's channel over a host's channel, through a dialect's translator: what both
    dialects' channels share. The session's events go through the translator and its
    messages out; ``_ready`` is set at the session's ready (and at its close where
    ``_ready_on_close``: a Realtime client's reads go on until then), or when the
    connection closes."""

    _ready_on_close = False

    def __init__(self, inner: Channel, translator: T) -> None:
        self._inner = inner
        self._translator = translator
        self._ready = anyio.Event()

    async def send_text(self, text: str) -> None:
        self._session(text)
        await self._send_pending()

    async def close(self, code: int, reason: str) -> None:
        self._translator.closing()
        self._ready.set()  # the client's answer to the close frame is read
        await self._inner.close(code, reason)

    async def aclose(self) -> None:
        self._ready.set()
        await self._inner.aclose()

    def _session(self, text: str) -> None:
        translator = self._translator
        translator.session(text)
        if translator.streaming or (self._ready_on_close and translator.closed):
            self._ready.set()

    async def _send_pending(self) -> None:
        for message in self._translator.pull_messages():
            await self._inner.send_text(message)

    def _send_now(self, direct: DirectChannel, text: str) -> None:
        """The standalone server's fast path: a native event written from the engine's
        callback; what the socket does not take is buffered, and the next message waits in
        ``send_text``."""
        self._session(text)
        for message in self._translator.pull_messages():
            direct.send_text_now(message)


class ListenChannel(TranslatingChannel[ListenTranslator]):
    """The ``/v1/listen`` channel: the native start first, the client's audio resampled."""

    def __init__(
        self, inner: Channel, translator: ListenTranslator, resampler: PcmResampler | None = None
    ) -> None:
        super().__init__(inner, translator)
        self._resampler = resampler
        self._started = False

    async def receive(self) -> list[ClientMessage]:
        translator = self._translator
        if not self._started:
            self._started = True
            return [translator.start()]
        resampler = self._resampler
        while True:
            if not self._ready.is_set():
                # Only an unset event is waited on: anyio's Event.wait() yields to the event
                # loop even when the event is set, a whole loop iteration per audio message
                # (bench/paced_dialects.py) that the native route does not pay.
                await self._ready.wait()
            batch = await self._inner.receive()
            if resampler is not None:
                batch = resampler.convert(batch)
            batch = translator.client(batch)
            if resampler is not None and any(item is END for item in batch):
                at = next(i for i, item in enumerate(batch) if item is END)
                batch[at:at] = [AudioBatch(frames=tuple(resampler.tail()))]
            if translator.has_messages:  # a Finalize's Results (not a coroutine per read)
                await self._send_pending()
            if batch:
                return batch


class DirectListenChannel(ListenChannel):
    """A :class:`ListenChannel` over a :class:`DirectChannel` (one native event makes at most
    three messages here: SpeechStarted, Results, UtteranceEnd)."""

    def __init__(
        self,
        inner: DirectChannel,
        translator: ListenTranslator,
        resampler: PcmResampler | None = None,
    ) -> None:
        super().__init__(inner, translator, resampler)
        self._direct = inner

    def can_send_now(self) -> bool:
        return self._direct.can_send_now()

    def send_text_now(self, text: str) -> None:
        self._send_now(self._direct, text)
