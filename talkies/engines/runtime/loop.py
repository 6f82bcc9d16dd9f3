"""Callbacks onto an event loop from any thread, and timers on it (the runtime's plumbing)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ["Callback", "Wake", "ignore", "later", "waker"]

Callback = Callable[[], None]
Wake = Callable[[Callback], None]


def waker(token: anyio.lowlevel.EventLoopToken) -> Wake:
    """Schedule a callback on the event loop of ``token`` from any thread, without waiting
    for it where the backend allows (asyncio, trio)."""
    native = token.native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        loop = native

        def on_asyncio(callback: Callback) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(callback)

        return on_asyncio
    run_sync_soon = getattr(native, "run_sync_soon", None)
    if callable(run_sync_soon):

        def on_trio(callback: Callback) -> None:
            with contextlib.suppress(Exception):  # trio.RunFinishedError: the run is over
                run_sync_soon(callback)

        return on_trio

    def blocking(callback: Callback) -> None:
        with contextlib.suppress(Exception):  # the loop is gone
            anyio.from_thread.run_sync(callback, token=token)

    return blocking


def later(token: anyio.lowlevel.EventLoopToken, delay: float, callback: Callback) -> Callback:
    """Run ``callback`` on the event loop after ``delay`` seconds; returns a cancel function."""
    native = token.native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        return native.call_later(delay, callback).cancel
    timer = threading.Timer(delay, waker(token), (callback,))
    timer.daemon = True
    timer.start()
    return timer.cancel


def ignore(callback: Callback) -> None:
    """A :data:`Wake` for a stream whose event loop is not known yet: nothing to wake."""
    return
