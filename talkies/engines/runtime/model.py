"""The loaded-model base of every engine whose streams the runtime drives."""

from __future__ import annotations

from ...protocol.messages import StartOptions
from ..base import EngineStream, Recognition
from .rounds import DecodeRounds

__all__ = ["RecognitionModel"]


class RecognitionModel:
    """A :class:`LoadedModel` for engines whose streams are :class:`Recognition` objects, all
    run by the one engine-stream runtime (:mod:`talkies.engines.runtime.rounds`): one set of
    worker-thread decode rounds per model."""

    def recognition(self, options: StartOptions) -> Recognition:
        """Create a stream's decoder state. Called in a worker thread (creating one may take
        tens of milliseconds: a Vosk recognizer); may raise :class:`Refusal`."""
        raise NotImplementedError

    def decode_rounds(self) -> DecodeRounds:
        """The model's rounds, made on first use (override to tune them)."""
        return DecodeRounds()

    _rounds: DecodeRounds | None = None

    @property
    def rounds(self) -> DecodeRounds:
        if self._rounds is None:
            self._rounds = self.decode_rounds()
            self._rounds.label = str(getattr(self, "slug", "") or type(self).__name__)
        return self._rounds

    async def open_stream(self, options: StartOptions, *, max_buffered_bytes: int) -> EngineStream:
        return await self.rounds.open(
            lambda: self.recognition(options), max_buffered_bytes=max_buffered_bytes
        )

    def close(self) -> None:
        return None
