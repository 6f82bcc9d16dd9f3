"""Counted slots that are never queued for, except behind a release already under way.

The spec refuses a stream at once when its model or the server is full ("A full model rejects
a new stream with connection_limit; it does not queue it"). A slot whose stream has already
been told to go (its close frame is being prepared, its client vanished) is different: it
will be free within the time the engine takes to finish a decode in flight, and a client that
reconnects the instant its previous stream closed must not be refused for it. So a slot is
taken in two steps on the way out: :meth:`Slot.leaving` (synchronously, the moment the stream
is released) and :meth:`Slot.release`; :meth:`Slots.acquire` waits only while every missing
slot is a leaving one, for at most ``leaving_wait`` seconds.
"""

from __future__ import annotations

import anyio

__all__ = ["Slot", "Slots"]


class Slot:
    """One taken slot; ``leaving`` and ``release`` are idempotent."""

    __slots__ = ("_left", "_owner", "_released")

    def __init__(self, owner: Slots) -> None:
        self._owner = owner
        self._left = False
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def leaving(self) -> None:
        """The holder is going away: a new holder may wait for this slot."""
        if not self._left and not self._released:
            self._left = True
            self._owner._leaving += 1

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        owner = self._owner
        owner.held -= 1
        if self._left:
            owner._leaving -= 1
        owner._changed.set()
        owner._changed = anyio.Event()


class Slots:
    """``limit`` slots, for one model or for the whole server."""

    def __init__(self, limit: int, *, leaving_wait: float = 5.0) -> None:
        self.limit = limit
        self.held = 0
        self._leaving = 0
        self._leaving_wait = leaving_wait
        self._changed = anyio.Event()

    @property
    def leaving(self) -> int:
        """Slots whose holders were released and are still finishing."""
        return self._leaving

    def try_acquire(self) -> Slot | None:
        """A slot now, or None when all are held."""
        if self.held >= self.limit:
            return None
        self.held += 1
        return Slot(self)

    async def acquire(self) -> Slot | None:
        """A slot, waiting only for slots that are already leaving; None when full."""
        slot = self.try_acquire()
        if slot is not None or not self._leaving:
            return slot
        with anyio.move_on_after(self._leaving_wait):
            while self.held >= self.limit and self._leaving:
                await self._changed.wait()
        return self.try_acquire()

    async def wait_for_leaving(self) -> bool:
        """Wait (bounded) until no slot is leaving; True if none is left leaving."""
        with anyio.move_on_after(self._leaving_wait):
            while self._leaving:
                await self._changed.wait()
        return not self._leaving
