"""HTTP routes that both transports serve the same way, independent of h11 or ASGI."""

from __future__ import annotations

from typing import Any

from ..engines.base import StreamProvider
from ..engines.pool import ModelConflict, ModelPool
from .http import error_body

__all__ = ["MODELS_PREFIX", "is_models_path", "models_route"]

MODELS_PREFIX = "/v1/models"

Response = tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]


def is_models_path(path: str) -> bool:
    return path == MODELS_PREFIX or path.startswith(MODELS_PREFIX + "/")


async def models_route(provider: StreamProvider, method: str, path: str) -> Response:
    """``GET /v1/models`` (the registry and what is loaded) and ``DELETE /v1/models/{slug}``
    (unload; 409 while streams pin the model or requests use it, as the spec requires)."""
    pool = provider if isinstance(provider, ModelPool) else None
    slug = path[len(MODELS_PREFIX) + 1 :]
    if not slug:
        if method != "GET":
            return (
                405,
                error_body(405, "method not allowed", "method_not_allowed"),
                [(b"allow", b"GET")],
            )
        rows = pool.status() if pool is not None else []
        data = [
            {"id": row.pop("model"), "object": "model", "owned_by": "talkies", **row}
            for row in rows
        ]
        return 200, {"object": "list", "data": data}, []
    if method != "DELETE":
        return (
            405,
            error_body(405, "method not allowed", "method_not_allowed"),
            [(b"allow", b"DELETE")],
        )
    if pool is None or pool.entry(slug) is None:
        return 404, error_body(404, f"unknown model {slug!r}", "model_not_found"), []
    try:
        await pool.unload(slug)
    except ModelConflict as exc:
        return 409, error_body(409, str(exc), "model_in_use"), []
    return 200, {"id": slug, "object": "model", "loaded": False}, []
