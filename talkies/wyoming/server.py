"""The Wyoming server: Home Assistant's speech-to-text and text-to-speech over TCP.

It runs in ``talkies serve``'s process beside the HTTP server, on the same model pool: a
transcription is a pool stream (the same slots, pinning and engine runtime as a WebSocket
stream, :mod:`.asr`), a synthesis a pool slot on the speech model (as ``/v1/audio/speech``,
:mod:`.tts`). ``describe`` is answered from the registry alone (:mod:`.describe`); each
connection's read loop and dispatch is :mod:`.connection`, its sending half
:mod:`.channel`. Caps are checked where the bytes enter (:mod:`.framing`).

This module owns what spans connections: the listener, the connection limit, and shutdown
(stop accepting, let requests in progress finish within the grace, then close everything).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from ..config import Settings, wyoming_address
from ..engines.pool import ModelPool
from ..transport.server import ListenError
from .advertise import AdvertiseError, Advertisement
from .channel import Channel, Close
from .connection import Connection
from .describe import program_info

__all__ = ["MAX_CONNECTIONS", "WyomingServer"]

log = logging.getLogger("talkies.wyoming")

MAX_CONNECTIONS = 64


class WyomingServer:
    """Serve Wyoming on ``settings.wyoming_uri`` with ``pool`` until :meth:`shutdown`."""

    def __init__(self, settings: Settings, pool: ModelPool) -> None:
        if settings.wyoming_uri is None:
            raise ValueError("TALKIES_WYOMING_URI is not set")
        self.settings = settings
        self.pool = pool
        self.host, self.port = wyoming_address(settings.wyoming_uri)
        self.connections = 0
        self.busy = 0  # requests in progress
        self._idle = anyio.Event()
        self._idle.set()
        self._accept: anyio.CancelScope | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self._stopping = False
        self.advertisement: Advertisement | None = None

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[WyomingServer] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until :meth:`shutdown` ends; ``task_status`` gets the server when bound."""
        try:
            listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        except OSError as exc:
            reason = str(exc.strerror or exc).lower()
            raise ListenError(
                f"cannot listen for Wyoming on {self.host}:{self.port}: {reason} "
                "(set TALKIES_WYOMING_URI or --wyoming)"
            ) from exc
        self.port = listener.listeners[0].extra(anyio.abc.SocketAttribute.local_port)
        if self.settings.wyoming_zeroconf is not None:
            try:
                self.advertisement = Advertisement(
                    self.settings.wyoming_zeroconf, self.host, self.port
                )
            except AdvertiseError as exc:
                await listener.aclose()
                raise ListenError(str(exc)) from None
        # The first look at the installed distributions takes ~0.5 s: not in the first
        # describe's time (Home Assistant waits 1 s for its info).
        await anyio.to_thread.run_sync(self.info)
        log.info("wyoming listening", extra={"host": self.host, "port": self.port})
        try:
            async with listener, anyio.create_task_group() as tasks:
                self._tasks = tasks
                if self.advertisement is not None:
                    tasks.start_soon(self._advertise, self.advertisement)
                with anyio.CancelScope() as accept:
                    self._accept = accept
                    task_status.started(self)
                    await listener.serve(self._connection, task_group=tasks)
        finally:
            if self.advertisement is not None:  # however serving ended
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.advertisement.unregister)

    async def shutdown(self, grace: float) -> None:
        """Stop accepting; requests in progress may finish for ``grace`` seconds; then every
        connection is closed."""
        self._stopping = True
        if self._accept is not None:
            self._accept.cancel()
        if self.advertisement is not None:  # gone from Home Assistant's list at once
            await anyio.to_thread.run_sync(self.advertisement.unregister)
            log.info("wyoming no longer advertised")
        with anyio.move_on_after(grace):
            await self._idle.wait()
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()

    async def _advertise(self, advertisement: Advertisement) -> None:
        """Register the zeroconf service; a network that refuses it is a warning, not the
        end of the server."""
        try:
            await anyio.to_thread.run_sync(advertisement.register)
        except Exception as exc:
            log.warning("wyoming not advertised: %s", exc, extra={"error": str(exc)})
            return
        if self._stopping:  # shutdown came while the name was being probed
            await anyio.to_thread.run_sync(advertisement.unregister)
            return
        log.info(
            "wyoming advertised",
            extra={
                "service": advertisement.name,
                "address": advertisement.address,
                "port": advertisement.port,
            },
        )

    def info(self) -> dict[str, Any]:
        """The ``info`` event's data: the registry as Wyoming programs (nothing loaded)."""
        return program_info(self.settings, self.pool)

    def _set_busy(self, delta: int) -> None:
        self.busy += delta
        if self.busy == 0:
            self._idle.set()
        elif self.busy == 1 and delta > 0:
            self._idle = anyio.Event()

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        try:
            _bound_send_buffer(stream)
            async with stream:
                channel = Channel(stream, self.settings, self.pool, self._set_busy)
                if self.connections > MAX_CONNECTIONS:
                    with contextlib.suppress(anyio.BrokenResourceError, OSError, Close):
                        await channel.error(
                            f"the server is at its limit of {MAX_CONNECTIONS} Wyoming connections",
                            "connection_limit",
                        )
                    return
                connection = Connection(channel, info=self.info, stopping=lambda: self._stopping)
                await connection.run()
        except Exception:
            log.exception("wyoming connection failed")
        finally:
            self.connections -= 1


# The kernel's send buffer of a Wyoming connection. A send waits at most the idle timeout
# (channel.py: "stopped reading"), and Linux wakes a blocked writer only once half of what
# is queued has left; autotuned up to tcp_wmem's 4 MB, that is 2 MB, 42 s of 24 kHz audio
# for a client that plays a long synthesis as it reads it (real time): such a client was
# dropped as one that stopped reading. 64 KiB (the kernel doubles it) keeps the wait near
# 1.3 s of audio played; 256 KiB (5.3 s) was still dropped now and then at a 6 s timeout.
# A LAN's (or a 20 ms path's) bandwidth-delay product at Wyoming's rates is far less.
SEND_BUFFER_BYTES = 64 * 1024


def _bound_send_buffer(stream: anyio.abc.SocketStream) -> None:
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if raw is not None:
        with contextlib.suppress(OSError):
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
