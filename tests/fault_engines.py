"""Test doubles for engine faults (never registered by the product; slugs end in ``-test``).

- :class:`HangModel` (``hang-test``): the energy recognizer of tests/fake_engine.py until a
  stream has accepted ``after`` bytes (or is given audio holding ``poison``); its next decode
  call then blocks until ``release`` is set (or ``limit`` seconds pass), the way a wedged
  native decoder would.
- :class:`RaiseModel` (``raise-test``): the same, but that call raises.

Both count what the runtime does with their recognitions (calls, closes), so tests can show
that a recognition given up at the decode deadline is closed once, after its call returned,
and never used again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from talkies.engines.base import EngineUpdate, Recognition
from talkies.engines.runtime import RecognitionModel
from talkies.protocol import EngineFinal
from talkies.protocol.messages import StartOptions

from .fake_engine import Behaviour, EnergyRecognition, Stats


@dataclass
class FaultStats:
    opened: int = 0
    closed: int = 0
    hung: int = 0  # calls that blocked
    returned: int = 0  # blocked calls that returned
    calls_after_return: int = 0  # calls on a recognition whose blocked call returned: never
    closed_before_return: int = 0  # closes while its call was blocked: never
    log: list[str] = field(default_factory=list)


class FaultRecognition:
    def __init__(self, model: FaultModel, n: int) -> None:
        self._model = model
        self._inner = EnergyRecognition(Behaviour(), Stats())
        self._accepted = 0
        self._n = n
        self._blocked = False
        self._done = False  # its blocked call returned

    def _fault(self, pcm: bytes = b"") -> None:
        model, stats = self._model, self._model.stats
        if self._done:
            stats.calls_after_return += 1
        stats.log.append(f"call {self._n}")
        if model.poison is not None:
            if model.poison not in pcm:
                return
        elif self._accepted < model.after or (model.only and self._n not in model.only):
            return
        if isinstance(model.raises, Exception):
            raise model.raises
        if model.raises:
            raise RuntimeError("fault-test engine failed on purpose")
        stats.hung += 1
        stats.log.append(f"hang {self._n}")
        self._blocked = True
        model.release.wait(model.limit)
        self._blocked = False
        self._done = True
        stats.returned += 1
        stats.log.append(f"return {self._n}")

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        self._fault(pcm)
        self._accepted += len(pcm)
        return self._inner.accept(pcm)

    def finish(self) -> EngineFinal:
        self._fault()
        return self._inner.finish()

    def close(self) -> None:
        stats = self._model.stats
        if self._blocked:
            stats.closed_before_return += 1
        stats.closed += 1
        stats.log.append(f"close {self._n}")


class FaultModel(RecognitionModel):
    """A loaded model of the pool whose streams fail after ``after`` bytes of audio (all of
    them, or those numbered in ``only``)."""

    raises: bool | Exception = False  # an exception: the one the call raises

    def __init__(
        self,
        *,
        after: int = 0,
        limit: float | None = None,
        only: set[int] | None = None,
        poison: bytes | None = None,
    ) -> None:
        self.after = after
        self.limit = limit
        self.only = only  # the streams (numbered from 1, in opening order) that fail
        self.poison = poison  # if set: fail on audio holding these bytes, and only then
        self.release = threading.Event()
        self.stats = FaultStats()

    def recognition(self, options: StartOptions) -> Recognition:
        self.stats.opened += 1
        return FaultRecognition(self, self.stats.opened)


class HangModel(FaultModel):
    """``hang-test``: the call blocks (until ``release``, or ``limit`` seconds)."""


class RaiseModel(FaultModel):
    """``raise-test``: the call raises."""

    raises = True


class SlowModel(RecognitionModel):
    """``slow-test``: the energy recognizer, whose streams take ``open_delay`` seconds to open
    (their recognition is made in a worker thread) and ``finish_delay`` to flush: a client can
    leave before its ready, or after its end and before its final, every time."""

    def __init__(self, *, open_delay: float = 1.0, finish_delay: float = 1.0) -> None:
        self.open_delay = open_delay
        self.behaviour = Behaviour(finish_delay=finish_delay)
        self.stats = Stats()

    def recognition(self, options: StartOptions) -> Recognition:
        time.sleep(self.open_delay)
        return EnergyRecognition(self.behaviour, self.stats)
