"""One MCP tool, as :class:`~talkies.app.mcp.McpEndpoint` serves it: its arguments, its
output's shape, and the coroutine that runs it.

- **Arguments are a pydantic model** (:class:`StrictArguments`): it gives the input schema
  that ``tools/list`` publishes and the validation; unknown arguments are refused, not
  ignored. Bad arguments are 400 ``invalid_arguments``.
- **Refusals are tool errors shaped like HTTP.** A tool refuses with the same
  :class:`HttpError` the HTTP routes raise; :func:`tool_error` turns it into ``isError`` with
  the OpenAI error object plus ``status`` as structured content (a full model: 429
  ``model_full``). A bug is a 500 tool error whose details stay in the log.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import mcp_types as types
from pydantic import BaseModel, ConfigDict, ValidationError

from .http import HttpError

__all__ = ["McpTool", "StrictArguments", "ToolResult", "tool_error"]

log = logging.getLogger("talkies.app")

ArgsT = TypeVar("ArgsT", bound=BaseModel)


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolResult:
    """What a tool answers: text for the model to read, and the same as structured content."""

    text: str
    structured: dict[str, Any]
    audio: tuple[bytes, str] | None = None  # (data, MIME type): returned as audio content


def tool_error(exc: HttpError) -> types.CallToolResult:
    """A refusal as a tool error: the OpenAI error object the HTTP route would answer (one
    mapping from status to ``type``: :func:`~talkies.app.http.error_response`), with the HTTP
    status beside it."""
    body = exc.response().body
    assert isinstance(body, bytes)  # error responses are never streamed
    error: dict[str, Any] = json.loads(body)["error"]
    error["status"] = exc.status
    label = error["code"] or error["type"]
    return types.CallToolResult(
        content=[types.TextContent(text=f"Error {exc.status} ({label}): {exc.message}")],
        structured_content={"error": error},
        is_error=True,
    )


def _invalid_arguments(exc: ValidationError) -> HttpError:
    errors = exc.errors(include_url=False, include_input=False)
    problems = [
        f"{'.'.join(str(part) for part in error['loc']) or 'arguments'}: {error['msg']}"
        for error in errors
    ]
    first = errors[0]["loc"] if errors else ()
    return HttpError(
        400,
        "invalid arguments: " + "; ".join(problems),
        code="invalid_arguments",
        param=str(first[0]) if first else None,
    )


@dataclass(frozen=True, kw_only=True)
class McpTool(Generic[ArgsT]):
    """One tool: its arguments (a pydantic model: the input schema and its validation), the
    shape of its structured output, and the coroutine that runs it. ``run`` refuses with
    :class:`HttpError`, as a route would."""

    name: str
    description: str
    arguments: type[ArgsT]
    output: type[BaseModel]
    run: Callable[[ArgsT], Awaitable[ToolResult]]
    read_only: bool = True

    def definition(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema(),
            output_schema=self.output.model_json_schema(),
            annotations=types.ToolAnnotations(read_only_hint=self.read_only, open_world_hint=False),
        )

    def input_schema(self) -> dict[str, Any]:
        return self.arguments.model_json_schema()

    async def call(self, raw: Mapping[str, Any]) -> types.CallToolResult:
        try:
            arguments = self.arguments.model_validate(raw)
        except ValidationError as exc:
            return tool_error(_invalid_arguments(exc))
        try:
            result = await self.run(arguments)
        except HttpError as exc:
            return tool_error(exc)
        except Exception:
            # A bug, not a refusal: the details go to the log, never to the client.
            log.exception("MCP tool failed", extra={"tool": self.name})
            return tool_error(HttpError(500, "the tool failed; the server's log has the details"))
        content: list[types.ContentBlock] = [types.TextContent(text=result.text)]
        if result.audio is not None:
            data, mime = result.audio
            content.append(types.AudioContent(data=base64.b64encode(data).decode(), mime_type=mime))
        return types.CallToolResult(content=content, structured_content=result.structured)


class StrictArguments(BaseModel):
    """The base of every tool's arguments."""

    # Unknown arguments are refused, not ignored: a misspelt option must not silently
    # fall back to its default.
    model_config = ConfigDict(extra="forbid")
