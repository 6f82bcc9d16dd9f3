"""A minimal StreamProvider over already-loaded models, for engine tests before the pool."""

from __future__ import annotations

from collections.abc import Mapping

from talkies.engines.base import EngineStream, LoadedModel, Refusal
from talkies.protocol import ErrorCode
from talkies.protocol.messages import StartOptions


class LoadedModelProvider:
    def __init__(self, models: Mapping[str, LoadedModel], max_buffered_bytes: int = 160000):
        self.models = dict(models)
        self.max_buffered_bytes = max_buffered_bytes

    async def open_stream(self, options: StartOptions) -> EngineStream:
        model = self.models.get(options.model)
        if model is None:
            raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {options.model!r}")
        return await model.open_stream(options, max_buffered_bytes=self.max_buffered_bytes)
