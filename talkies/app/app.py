"""The HTTP application: every route, admission rule and error shape, written once.

Admission happens here, in one order, for both hosts:

1. public routes (``/healthz``) answer without a token;
2. everything else needs the bearer token when one is configured (401 with
   ``WWW-Authenticate: Bearer``), before the route is even looked up, so an unauthenticated
   client learns nothing about which routes exist;
3. unknown path → 404; known path, other method → 405 with ``Allow``;
4. a body whose declared length passes ``TALKIES_MAX_UPLOAD_BYTES`` → 413 before any of it
   is read; the cap is enforced again on the bytes as they arrive (:class:`Body`).

The WebSocket route's admission is written once too (:mod:`.websocket`); the hosts only
translate its handshake and frames. A plain HTTP request to it gets 426 here.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from .. import metrics
from ..config import Settings
from ..dialects import LISTEN_PATH
from ..dialects.realtime import CLIENT_SECRETS_PATH, REALTIME_PATH
from ..engines.base import StreamProvider
from ..engines.pool import ModelConflict, ModelPool
from ..engines.runtime import RecognitionModel
from ..engines.runtime.lag import lag_detail
from ..engines.runtime.slots import Slots
from . import leftovers
from .dialects import LISTEN_SCHEMES, ListenDialect
from .files import FileStore
from .http import (
    HttpError,
    PayloadTooLarge,
    Request,
    Response,
    bearer_ok,
    error_response,
    json_response,
)
from .mcp import MCP_PATH, McpEndpoint, request_limit
from .models import model_rows
from .realtime import ClientSecrets, RealtimeDialect, client_secrets_route
from .refusals import http_error
from .speech import speech_route, voices_route
from .transcribe import transcription_route
from .websocket import STREAM_PATH, Accept, StreamRoute

__all__ = ["WEBSOCKET_PATHS", "TalkiesApp", "auth_schemes"]

# The WebSocket routes the hosts upgrade: the native stream, Deepgram's /v1/listen and
# OpenAI's Realtime transcription.
WEBSOCKET_PATHS = frozenset({STREAM_PATH, LISTEN_PATH, REALTIME_PATH})


def auth_schemes(path: str) -> tuple[bytes, ...]:
    """The ``Authorization`` schemes a path takes: Bearer, and Deepgram's ``Token`` on its
    route (so a malformed upgrade there with a good token is told what is wrong with it)."""
    return LISTEN_SCHEMES if path == LISTEN_PATH else (b"bearer",)


_PAGE = Path(__file__).parent / "static" / "index.html"

Handler = Callable[..., Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class _Route:
    pattern: re.Pattern[str]
    methods: Mapping[str, Handler]
    body_limit: int | None = None  # this route's own cap, instead of the upload cap

    @property
    def allow(self) -> str:
        methods = set(self.methods) | ({"HEAD"} if "GET" in self.methods else set())
        return ", ".join(sorted(methods))


class TalkiesApp:
    """One instance per server process, shared by every connection of both hosts."""

    def __init__(self, settings: Settings, provider: StreamProvider) -> None:
        self.settings = settings
        self.provider = provider
        self.pool = provider if isinstance(provider, ModelPool) else None
        # Server-wide stream slots (TALKIES_STREAM_MAX_CONNECTIONS), shared by the hosts' WebSocket
        # routes; a stream gives its slot back before its close frame leaves.
        self.stream_slots = Slots(settings.stream_max_connections)
        self.streams = StreamRoute(settings, provider, self.stream_slots)
        self.files = FileStore(settings.data_dir / "files")
        # Ephemeral secrets for /v1/realtime (POST /v1/realtime/client_secrets).
        self.client_secrets = ClientSecrets()
        self.tmp_dir = settings.data_dir / "tmp"
        # Turns for file transcriptions' decoding (HTTP and MCP), server-wide: a request past
        # the bound waits for one, so many uploads queue rather than multiply memory.
        self.decodes = anyio.CapacityLimiter(settings.file_max_concurrency)
        self.mcp = McpEndpoint(
            settings, pool=self.pool, files=self.files, tmp_dir=self.tmp_dir, decodes=self.decodes
        )
        self._public: dict[str, _Route] = {}
        self._routes: list[_Route] = []
        self._public["/healthz"] = self._route("/healthz", GET=self._health)
        self._public["/readyz"] = self._route("/readyz", GET=self._ready)
        self._public["/"] = self._route("/", GET=self._page)
        metrics.track(self)
        self._routes = [
            self._route("/metrics", GET=self._metrics),
            self._route("/v1/models", GET=self._models),
            self._route("/v1/models/(?P<slug>[^/]+)", GET=self._model, DELETE=self._unload),
            self._route("/v1/audio/transcriptions", POST=self._transcribe),
            # Base64 audio up to the upload cap, in its JSON-RPC envelope.
            self._route(MCP_PATH, body_limit=request_limit(settings), POST=self.mcp.handle),
            self._route("/v1/audio/speech", POST=self._speech),
            self._route("/v1/audio/voices", GET=self._voices),
            self._route(STREAM_PATH, GET=self._needs_upgrade),
            self._route(LISTEN_PATH, GET=self._needs_upgrade),
            self._route(REALTIME_PATH, GET=self._needs_upgrade),
            self._route(CLIENT_SECRETS_PATH, POST=self._client_secret),
            self._route("/v1/files", GET=self._files),
            self._route(
                "/v1/files/(?P<path>.+)",
                GET=self._file_get,
                PUT=self._file_put,
                DELETE=self._file_delete,
            ),
        ]

    @staticmethod
    def _route(pattern: str, body_limit: int | None = None, **methods: Handler) -> _Route:
        return _Route(re.compile(pattern), methods, body_limit)

    # -- lifetime ----------------------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """What runs beside the server: the idle-model sweeper and the MCP endpoint (its tool
        calls end first); models unloaded at the end. First, what killed servers left in the
        data folder is removed, and this server's lock on it taken (:mod:`.leftovers`)."""
        claim = await anyio.to_thread.run_sync(leftovers.start, self.settings.data_dir)
        try:
            async with anyio.create_task_group() as tg:
                if self.pool is not None:
                    tg.start_soon(self.pool.run_sweeper)
                try:
                    async with self.mcp.lifespan():
                        yield
                finally:
                    tg.cancel_scope.cancel()
            if self.pool is not None:
                await self.pool.aclose()
        finally:
            claim.release()

    # -- requests ----------------------------------------------------------------------------

    def authorized(self, request: Request) -> bool:
        return bearer_ok(
            request.headers, self.settings.auth_token, schemes=auth_schemes(request.path)
        )

    async def handle(self, request: Request) -> Response:
        """The response to ``request``; never raises for a bad request (only for a client
        that left, which the host handles)."""
        try:
            return await self._dispatch(request)
        except HttpError as exc:
            return exc.response()

    async def _dispatch(self, request: Request) -> Response:
        route = self._public.get(request.path)
        params: dict[str, str] = {}
        if route is None:
            if not self.authorized(request):
                return error_response(
                    401,
                    "missing or invalid bearer token",
                    code="invalid_api_key",
                    headers=[(b"www-authenticate", b"Bearer")],
                )
            route, params = self._match(request.path)
        method = "GET" if request.method == "HEAD" else request.method
        handler = route.methods.get(method)
        if handler is None:
            return error_response(
                405,
                f"{request.method} is not allowed here",
                code="method_not_allowed",
                headers=[(b"allow", route.allow.encode())],
            )
        if route.body_limit is not None:
            request.body.limit = route.body_limit
        if request.body.declared is not None and request.body.declared > request.body.limit:
            raise PayloadTooLarge(request.body.limit)
        return await handler(request, **params)

    def _match(self, path: str) -> tuple[_Route, dict[str, str]]:
        for route in self._routes:
            match = route.pattern.fullmatch(path)
            if match is not None:
                return route, match.groupdict()
        raise HttpError(404, f"no route {path!r}", code="not_found")

    # -- routes ------------------------------------------------------------------------------

    async def _metrics(self, request: Request) -> Response:
        body = await anyio.to_thread.run_sync(metrics.render)
        return Response(
            status=200, headers=[(b"content-type", metrics.CONTENT_TYPE.encode())], body=body
        )

    async def _health(self, request: Request) -> Response:
        return json_response(200, {"status": "ok"})

    async def _page(self, request: Request) -> Response:
        """The browser page: one self-contained file (no CDN, no build step)."""
        page = await anyio.Path(_PAGE).read_bytes()
        headers = [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            # Everything the page loads is its own: no third party, and the microphone only
            # for this origin.
            (
                b"content-security-policy",
                b"default-src 'self'; script-src 'self' 'unsafe-inline' blob:; "
                b"style-src 'self' 'unsafe-inline'; connect-src 'self' ws: wss:; "
                b"media-src 'self' blob:; img-src 'self' data:",
            ),
        ]
        return Response(status=200, headers=headers, body=page)

    async def _ready(self, request: Request) -> Response:
        """Readiness for a load balancer: 503 while no stream slot is free, a model lags
        behind its streams' audio (it refuses new ones: engines/runtime/lag.py) or no model
        can be served, so traffic goes to another instance; /healthz stays liveness only."""
        slots = self.stream_slots
        if slots.held >= slots.limit:
            return json_response(503, {"status": "full", "streams": slots.held})
        lagging = self._lagging()
        if lagging is not None:
            slug, lag, bound = lagging
            body = {"status": "lagging", "model": slug, "lag": round(lag, 3), "max_lag": bound}
            return json_response(503, {**body, "reason": lag_detail(slug, lag, bound)})
        if self.pool is not None and not self.pool.servable():
            return json_response(503, {"status": "no_models"})
        return json_response(200, {"status": "ready", "streams": slots.held})

    async def serve_websocket(
        self,
        path: str,
        query: bytes,
        headers: Iterable[tuple[bytes, bytes]],
        subprotocols: Iterable[str],
        accept: Accept,
        *,
        peer: str | None,
        close_timeout: float,
    ) -> None:
        """One WebSocket handshake on a path of :data:`WEBSOCKET_PATHS`, served until its
        connection closes: the native stream, or a dialect of it on the same route."""
        dialect: ListenDialect | RealtimeDialect | None = None
        if path == LISTEN_PATH:
            dialect = ListenDialect(self.settings, query)
        elif path == REALTIME_PATH:
            dialect = RealtimeDialect(self.settings, query, self.client_secrets)
        await self.streams.serve(
            headers,
            subprotocols,
            accept,
            peer=peer,
            close_timeout=close_timeout,
            dialect=dialect,
        )

    def _lagging(self) -> tuple[str, float, float] | None:
        """A loaded model that is refusing new streams for its lag: (slug, lag, bound)."""
        pool = self.pool
        for slug in pool.loaded() if pool is not None else ():
            model = pool.peek(slug) if pool is not None else None
            if isinstance(model, RecognitionModel):
                lag = model.rounds.lagging()
                if lag is not None:
                    return slug, lag, model.rounds.max_lag
        return None

    async def _needs_upgrade(self, request: Request) -> Response:
        return error_response(
            426,
            "this route needs a WebSocket upgrade",
            code="upgrade_required",
            headers=[(b"upgrade", b"websocket")],
        )

    async def _client_secret(self, request: Request) -> Response:
        return await client_secrets_route(request, self.client_secrets)

    def _require_pool(self) -> ModelPool:
        if self.pool is None:
            raise HttpError(404, "this server has no model registry", code="model_not_found")
        return self.pool

    async def _models(self, request: Request) -> Response:
        return json_response(200, {"object": "list", "data": model_rows(self.pool)})

    async def _model(self, request: Request, slug: str) -> Response:
        """One model's row of ``GET /v1/models`` (OpenAI's ``models.retrieve``)."""
        for row in model_rows(self.pool):
            if row["id"] == slug:
                return json_response(200, row)
        raise HttpError(404, f"unknown model {slug!r}", code="model_not_found")

    async def _unload(self, request: Request, slug: str) -> Response:
        """Unload a model; 409 while streams pin it or requests use it (spec)."""
        pool = self.pool
        if pool is None or pool.entry(slug) is None:
            raise HttpError(404, f"unknown model {slug!r}", code="model_not_found")
        try:
            await pool.unload(slug)
        except ModelConflict as exc:  # in use: 409 model_in_use
            raise http_error(exc) from None
        return json_response(200, {"id": slug, "object": "model", "loaded": False})

    async def _transcribe(self, request: Request) -> Response:
        return await transcription_route(
            request,
            pool=self._require_pool(),
            files=self.files,
            tmp_dir=self.tmp_dir,
            max_seconds=self.settings.stream_max_duration,
            decodes=self.decodes,
        )

    async def _speech(self, request: Request) -> Response:
        return await speech_route(
            request,
            pool=self._require_pool(),
            chunk_steps=self.settings.qwen3_stream_chunk_size,
        )

    async def _voices(self, request: Request) -> Response:
        return await voices_route(request, pool=self._require_pool())

    async def _files(self, request: Request) -> Response:
        return json_response(200, {"object": "list", "data": await self.files.listing()})

    async def _file_get(self, request: Request, path: str) -> Response:
        # Opened once: a PUT or DELETE of the path meanwhile cannot change what is served.
        staged = await self.files.read(path)
        headers = [
            (b"content-type", b"application/octet-stream"),
            (b"content-length", str(staged.size).encode()),
        ]
        if request.method == "HEAD":
            await staged.aclose()
            return Response(status=200, headers=headers)
        return Response(status=200, headers=headers, body=staged)

    async def _file_put(self, request: Request, path: str) -> Response:
        return json_response(201, await self.files.put(path, request.body))

    async def _file_delete(self, request: Request, path: str) -> Response:
        return json_response(200, await self.files.delete(path))
