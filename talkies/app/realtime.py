"""OpenAI Realtime transcription on the stream route: the I/O half of ``dialects/realtime.py``.

A :class:`RealtimeDialect` is one ``GET /v1/realtime?intent=transcription`` handshake. Like
Deepgram's (:mod:`.dialects`), it gives
:meth:`StreamRoute.serve <talkies.app.websocket.StreamRoute.serve>` what differs from the
native route and nothing else: the same session, driver, server-wide and model slots, frame,
duration and idle limits, engine runtime, metrics and log line.

- admission: ``Authorization: Bearer <t>``, or the browsers' subprotocols ``realtime`` +
  ``openai-insecure-api-key.<t>`` (the server selects ``realtime``); ``<t>`` is the server's
  token or an ephemeral client secret (:class:`ClientSecrets`, minted by
  ``POST /v1/realtime/client_secrets``: short-lived, single use, accepted here only, never
  logged); never the URL;
- refusal: a query it will not serve, answered as an ``error`` event and the native close
  code before anything is read;
- the channel (:class:`RealtimeChannel`): ``session.created`` first (the beta's
  ``transcription_session.created`` when the client asked for the beta: ``OpenAI-Beta:
  realtime=v1``), then the client's
  events through the translator. Once the translator gives the native ``start`` (the first
  session update or append), nothing more is read from the socket until the session's
  ``ready``, and the audio appended meanwhile is delivered then; the 24 kHz audio is
  resampled to 16 kHz by the :class:`~talkies.app.dialects.PcmResampler`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

from ..config import Settings
from ..dialects.realtime import (
    INPUT_RATE,
    EventError,
    QueryError,
    RealtimeConfig,
    RealtimeTranslator,
    configure,
    event_limit,
    parse_realtime_query,
    session_object,
)
from ..engines.supply.builtin import DEFAULT_MODEL
from ..protocol import Refused, SessionLimits
from .dialects import PcmResampler, TranslatingChannel
from .driver import Channel, ClientMessage, DirectChannel
from .http import HttpError, Request, Response, json_response

__all__ = [
    "ClientSecrets",
    "RealtimeChannel",
    "RealtimeDialect",
    "client_secrets_route",
]

_SUBPROTOCOL = "realtime"
_KEY_PROTOCOL = "openai-insecure-api-key."
_BETA_PROTOCOL = "openai-beta.realtime-v1"
_SECRET_PREFIX = "ek_"
# OpenAI's bounds for expires_after.seconds, and its default.
MIN_SECRET_SECONDS = 10
MAX_SECRET_SECONDS = 7200
DEFAULT_SECRET_SECONDS = 600
# Secrets outstanding at once: minting past it is refused (429) until some are used or expire.
MAX_SECRETS = 1024
_MAX_SECRET_BODY = 16_384


@dataclass(frozen=True, slots=True)
class _Secret:
    deadline: float  # time.monotonic() after which it is refused
    config: RealtimeConfig | None  # the session it was minted with, if any


class ClientSecrets:
    """Ephemeral client secrets for ``/v1/realtime``: each good for one session, until it
    expires. Only their SHA-256 is kept, so neither this store nor a log holds a secret."""

    def __init__(self, *, max_secrets: int = MAX_SECRETS) -> None:
        self._max = max_secrets
        self._secrets: dict[bytes, _Secret] = {}

    def __len__(self) -> int:
        return len(self._secrets)

    def mint(self, seconds: int, config: RealtimeConfig | None) -> str | None:
        """A new secret, valid for ``seconds``; None when too many are outstanding."""
        now = time.monotonic()
        if len(self._secrets) >= self._max:
            self._secrets = {k: v for k, v in self._secrets.items() if v.deadline > now}
            if len(self._secrets) >= self._max:
                return None
        value = _SECRET_PREFIX + secrets.token_urlsafe(32)
        self._secrets[_digest(value)] = _Secret(now + seconds, config)
        return value

    def redeem(self, value: str) -> tuple[bool, RealtimeConfig | None]:
        """(whether ``value`` is a live secret, the session it carries); used up either way."""
        if not value.startswith(_SECRET_PREFIX):
            return False, None
        found = self._secrets.pop(_digest(value), None)
        if found is None or found.deadline <= time.monotonic():
            return False, None
        return True, found.config


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def _credential(
    headers: Iterable[tuple[bytes, bytes]], offered: list[str]
) -> tuple[str | None, bool]:
    """(the credential presented, whether it came as a Bearer header or a subprotocol; False
    for a header of another scheme)."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, credentials = bytes(value).partition(b" ")
            if scheme.lower() != b"bearer":
                return None, False
            return credentials.strip().decode("utf-8", "surrogateescape"), True
    if _SUBPROTOCOL in offered:
        for protocol in offered:
            if protocol.startswith(_KEY_PROTOCOL):
                return protocol[len(_KEY_PROTOCOL) :], True
    return None, True


def _asks_beta(headers: Iterable[tuple[bytes, bytes]], offered: list[str]) -> bool:
    """Whether the client asked for the beta dialect: the ``OpenAI-Beta: realtime=v1`` header
    its SDKs send, or the browsers' ``openai-beta.realtime-v1`` subprotocol."""
    for name, value in headers:
        if name.lower() == b"openai-beta":
            return any(part.strip() == b"realtime=v1" for part in bytes(value).split(b","))
    return _BETA_PROTOCOL in offered


class RealtimeDialect:
    """One ``/v1/realtime`` handshake (see the module docstring)."""

    name = "realtime"

    def __init__(self, settings: Settings, query: bytes, client_secrets: ClientSecrets) -> None:
        self._settings = settings
        self._secrets = client_secrets
        self._problem: QueryError | None = None
        try:
            model = parse_realtime_query(query, default_model=DEFAULT_MODEL).model
        except QueryError as exc:
            self._problem = exc
            model = DEFAULT_MODEL  # never opened: refused first
        self.translator = RealtimeTranslator(
            RealtimeConfig(model=model),
            session_id="sess_" + secrets.token_hex(12),
            max_event_bytes=event_limit(settings.stream_max_frame_bytes),
            max_frame_bytes=settings.stream_max_frame_bytes,
        )

    def admission(
        self, headers: Iterable[tuple[bytes, bytes]], subprotocols: Iterable[str], token: str | None
    ) -> tuple[bool, str | None]:
        offered = [p.strip() for p in subprotocols]
        selected = _SUBPROTOCOL if _SUBPROTOCOL in offered else None
        headers = list(headers)
        self.translator.beta = _asks_beta(headers, offered)
        credential, usable = _credential(headers, offered)
        if not usable:
            return token is None, selected
        if credential is not None:
            if token is not None and hmac.compare_digest(
                credential.encode("utf-8", "surrogateescape"), token.encode("utf-8")
            ):
                return True, selected
            redeemed, config = self._secrets.redeem(credential)
            if redeemed:
                if config is not None and self._problem is None:
                    self.translator.config = config
                return True, selected
        return token is None, selected

    def limits(self, native: SessionLimits) -> SessionLimits:
        return native

    def refusal(self) -> Refused | None:
        problem = self._problem
        return None if problem is None else Refused(code=problem.code, detail=problem.detail)

    def wrap(self, channel: Channel) -> Channel:
        resampler = PcmResampler(INPUT_RATE, self._settings.stream_max_frame_bytes)
        if isinstance(channel, DirectChannel):
            return DirectRealtimeChannel(channel, self.translator, resampler)
        return RealtimeChannel(channel, self.translator, resampler)


class RealtimeChannel(TranslatingChannel[RealtimeTranslator]):
    """The ``/v1/realtime`` channel: ``session.created`` first, audio held until the native
    ready, every append resampled to 16 kHz."""

    _ready_on_close = True

    def __init__(
        self, inner: Channel, translator: RealtimeTranslator, resampler: PcmResampler
    ) -> None:
        super().__init__(inner, translator)
        self._resampler = resampler
        self._connected = False

    async def receive(self) -> list[ClientMessage]:
        translator = self._translator
        if not self._connected:
            self._connected = True
            translator.connected()
            await self._send_pending()
        while True:
            if translator.opened:
                if not self._ready.is_set():  # as in ListenChannel.receive
                    await self._ready.wait()
                if translator.holding:
                    return self._resampler.convert(translator.held())
            batch = translator.client(await self._inner.receive())
            if translator.has_messages:  # answers to updates, errors (not a coroutine per read)
                await self._send_pending()
            if batch:
                return self._resampler.convert(batch)


class DirectRealtimeChannel(RealtimeChannel):
    """A :class:`RealtimeChannel` over a :class:`DirectChannel` (one native event makes at
    most seven events here: an item's whole sequence)."""

    def __init__(
        self, inner: DirectChannel, translator: RealtimeTranslator, resampler: PcmResampler
    ) -> None:
        super().__init__(inner, translator, resampler)
        self._direct = inner

    def can_send_now(self) -> bool:
        return self._direct.can_send_now()

    def send_text_now(self, text: str) -> None:
        self._send_now(self._direct, text)


async def client_secrets_route(request: Request, store: ClientSecrets) -> Response:
    """``POST /v1/realtime/client_secrets``: OpenAI's request and response shapes, for a
    transcription session. The secret is in the response only; nothing logs it."""
    raw = await request.body.read(_MAX_SECRET_BODY)
    try:
        document = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        raise HttpError(400, "the body is not JSON", code="invalid_json") from None
    if not isinstance(document, dict):
        raise HttpError(400, "the body must be a JSON object", code="invalid_request")
    for key in document:
        if key not in ("expires_after", "session"):
            raise HttpError(400, f"unknown parameter: {key}", code="unknown_parameter", param=key)
    seconds = DEFAULT_SECRET_SECONDS
    expires = document.get("expires_after")
    if expires is not None:
        if not isinstance(expires, dict) or set(expires) - {"anchor", "seconds"}:
            raise HttpError(400, "expires_after is invalid", param="expires_after")
        if expires.get("anchor", "created_at") != "created_at":
            raise HttpError(400, "only the created_at anchor", param="expires_after.anchor")
        value = expires.get("seconds", DEFAULT_SECRET_SECONDS)
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not MIN_SECRET_SECONDS <= value <= MAX_SECRET_SECONDS
        ):
            raise HttpError(
                400,
                f"expires_after.seconds must be between {MIN_SECRET_SECONDS} and "
                f"{MAX_SECRET_SECONDS}",
                param="expires_after.seconds",
            )
        seconds = value
    config: RealtimeConfig | None = None
    if "session" in document:
        session = document["session"]
        if isinstance(session, dict) and session.get("type") != "transcription":
            raise HttpError(
                400,
                "only transcription sessions are served here (session.type transcription)",
                code="invalid_value",
                param="session.type",
            )
        try:
            config = configure(RealtimeConfig(model=DEFAULT_MODEL), session, beta=False)
        except EventError as exc:
            raise HttpError(400, exc.message, code=exc.code, param=exc.param) from None
    value_ = store.mint(seconds, config)
    if value_ is None:
        raise HttpError(429, "too many client secrets are outstanding", code="rate_limit_exceeded")
    expires_at = int(time.time()) + seconds
    shown = session_object(
        config or RealtimeConfig(model=DEFAULT_MODEL), session_id="sess_secret", beta=False
    )
    shown["expires_at"] = expires_at
    return json_response(200, {"value": value_, "expires_at": expires_at, "session": shown})
