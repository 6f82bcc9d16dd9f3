"""A test double for lag (never registered by the product; its slug ends in ``-test``).

:class:`LaggingEnergyModel` (``energy-lagging-test``) is the energy recognizer of
tests/fake_engine.py behind the real runtime, but every decode call takes ``factor`` times
the duration of the audio it is given (a sleep: it costs no CPU), so a client that sends in
real time finds it further behind at every round when ``factor`` > 1.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from talkies.engines.base import EngineUpdate, Recognition
from talkies.engines.runtime import RecognitionModel
from talkies.protocol import EngineFinal
from talkies.protocol.messages import StartOptions

from .fake_engine import Behaviour, EnergyRecognition, Stats

LAGGING_SLUG = "energy-lagging-test"


class LaggingRecognition:
    def __init__(self, factor: float) -> None:
        self._factor = factor
        self._inner = EnergyRecognition(Behaviour(), Stats())

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        time.sleep(self._factor * len(pcm) / 32000)
        return self._inner.accept(pcm)

    def finish(self) -> EngineFinal:
        return self._inner.finish()

    def close(self) -> None:
        self._inner.close()


class LaggingEnergyModel(RecognitionModel):
    """Decoding takes ``factor`` seconds per second of audio."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def recognition(self, options: StartOptions) -> Recognition:
        return LaggingRecognition(self.factor)
