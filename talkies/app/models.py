"""The model listing, one shape for every surface that lists models (GET /v1/models, MCP
``list_models``): OpenAI's model object (``id``, ``object``, ``owned_by``) followed by the
pool's own columns (:meth:`talkies.engines.pool.ModelPool.status`)."""

from __future__ import annotations

from typing import Any

from ..engines.pool import ModelPool

__all__ = ["model_rows"]


def model_rows(pool: ModelPool | None) -> list[dict[str, Any]]:
    """One row per configured model; none when the server has no registry."""
    rows = pool.status() if pool is not None else []
    return [
        {"id": row.pop("model"), "object": "model", "owned_by": "talkies", **row} for row in rows
    ]
