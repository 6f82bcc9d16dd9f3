"""``/mcp``: a Model Context Protocol server over the Streamable HTTP transport.

The protocol is the official ``mcp`` SDK's: its low-level :class:`~mcp.server.lowlevel.Server`
answers ``initialize``, ``server/discover``, ``tools/list`` and ``tools/call``, and its
:class:`~mcp.server.streamable_http_manager.StreamableHTTPSessionManager` speaks the HTTP side.
This module only bridges that ASGI callable to the app layer (a :class:`Request` in, a
:class:`Response` out, through the app's one ASGI translation, :mod:`.asgi`, so both hosts
serve it alike) and dispatches to the tools: :mod:`.mcp_tool` is what a tool is,
:mod:`.mcp_speech` has Talkies' own (``transcribe``, ``speak``, ``list_models``).

Choices, and why:

- **Stateless, JSON responses.** Every POST is answered by one JSON body, so the bridge can
  collect the SDK's whole response and hand it over as bytes. Stateless means no session
  outlives its request: a client that leaves mid-call cancels the tool (the transcription stops
  and its slot is freed at once, as on the HTTP route), and there is nothing to expire. The
  cost is what needs a stream back to the client (progress notifications, server-to-client
  requests), which these tools do not use; ``GET /mcp`` answers 405, as the transport spec
  allows for a server without a standalone stream.
- **The low-level Server, not MCPServer.** MCPServer's constructor calls
  ``logging.basicConfig`` (a handler on the root logger of whoever embeds the ASGI app); the
  low-level server does not, and pydantic models give the same schemas and validation.
- **Refusals are tool errors shaped like HTTP** (:func:`~.mcp_tool.tool_error`). An unknown
  tool is a JSON-RPC error (-32602), as the MCP spec asks.

Adding a tool is one :class:`McpTool` (arguments model, output model, coroutine) passed to
:meth:`McpEndpoint.add_tool`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError

from .. import __version__
from ..config import Settings
from ..engines.pool import ModelPool
from .asgi import call_asgi
from .files import FileStore
from .http import HttpError, Request, Response
from .mcp_speech import SpeechTools
from .mcp_tool import McpTool, ToolResult, tool_error

__all__ = [
    "LARGE_BODY",
    "MCP_PATH",
    "McpEndpoint",
    "McpTool",
    "ToolResult",
    "request_limit",
    "tool_error",
]

log = logging.getLogger("talkies.app")

MCP_PATH = "/mcp"

Context = ServerRequestContext[dict[str, Any]]  # the default lifespan's state: an empty dict

# JSON-RPC's envelope around a base64 payload: method, id, tool name, the other arguments.
_ENVELOPE_BYTES = 64 * 1024
# A call whose body is larger than this (audio, in practice) waits for a turn (_read).
LARGE_BODY = 1 << 20
# A large call's body, once it holds a turn, arrives at least this fast on average, after a
# grace (_read): 16 MiB of base64 audio in 4 minutes. A slower client gets a 408.
LARGE_CALL_MIN_RATE = 64 * 1024
LARGE_CALL_GRACE = 5.0


def request_limit(settings: Settings) -> int:
    """The /mcp route's body cap: base64 audio at the upload cap (4 bytes for every 3) and
    its JSON-RPC envelope."""
    return 4 * -(-settings.max_upload_bytes // 3) + _ENVELOPE_BYTES


# -- the endpoint ------------------------------------------------------------------------------


class McpEndpoint:
    """The MCP server of one :class:`~talkies.app.TalkiesApp`: its tools, and the SDK's
    Streamable HTTP manager, which runs only inside :meth:`lifespan`."""

    def __init__(
        self,
        settings: Settings,
        *,
        pool: ModelPool | None,
        files: FileStore,
        tmp_dir: Path,
        decodes: anyio.CapacityLimiter,
    ) -> None:
        self.settings = settings
        self._tools: dict[str, McpTool[Any]] = {}
        self.server: Server[dict[str, Any]] = Server(
            "talkies",
            version=__version__,
            instructions=(
                "Talkies, a speech server. transcribe turns audio into text: a file staged "
                "on the server (file_path) or base64 audio; speak turns text into speech; "
                "list_models lists the models."
            ),
            get_tool_input_schema=self._input_schema,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self._manager: StreamableHTTPSessionManager | None = None
        # Turns for calls whose body is over LARGE_BODY (base64 audio), server-wide.
        self._large_calls = anyio.CapacityLimiter(settings.file_max_concurrency)
        tools = SpeechTools(settings, pool=pool, files=files, tmp_dir=tmp_dir, decodes=decodes)
        for tool in tools.tools():
            self.add_tool(tool)

    def add_tool(self, tool: McpTool[Any]) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} exists already")
        self._tools[tool.name] = tool

    # -- lifetime and requests -------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """The SDK's manager, for as long as the server runs. A manager runs only once, so
        each lifespan gets a new one; cancelling it ends every tool call in flight."""
        manager = StreamableHTTPSessionManager(
            self.server,
            json_response=True,
            stateless=True,
            max_request_body_size=request_limit(self.settings),
        )
        async with manager.run():
            self._manager = manager
            try:
                yield
            finally:
                self._manager = None

    async def handle(self, request: Request) -> Response:
        """``POST /mcp``: one JSON-RPC message in, the SDK's answer out."""
        manager = self._manager
        if manager is None:  # an ASGI host running without lifespan events
            raise HttpError(
                503,
                "the MCP endpoint runs only while the server's lifespan does",
                code="unavailable",
            )
        async with AsyncExitStack() as turn:
            # Handed to the SDK without a name here, so nothing of ours keeps it meanwhile.
            response = await call_asgi(
                manager.handle_request, request, await self._read(request, turn)
            )
        if response is None:
            log.error("the MCP server sent no response", extra={"method": request.method})
            raise HttpError(500, "the MCP server sent no response")
        return response

    async def _read(self, request: Request, turn: AsyncExitStack) -> list[bytes]:
        """The request's body as the chunks it was read in (handed to the SDK one by one and
        never joined here), under the app's cap and with its 413 rather than inside the SDK
        (a JSON-RPC message is parsed whole anyway).

        A body once more than :data:`LARGE_BODY` bytes of it have arrived waits for a turn
        among the server's large calls, held in ``turn`` until the answer: the SDK holds about
        three copies of a body while its tool runs (its size check's buffer, starlette's body,
        the parsed JSON), so only ``TALKIES_FILE_MAX_CONCURRENCY`` such calls hold them at
        once. A declared length alone takes no turn (it did: a client that declared 2 MiB and
        sent nothing held one until the body timeout, and every other large call waited), and
        a body holding a turn must keep up :data:`LARGE_CALL_MIN_RATE` (a 408 otherwise)."""
        body = request.body
        if body.declared is not None and body.declared > LARGE_BODY:
            body.check_declared()  # a 413 at once, before a byte is read
        parts: list[bytes] = []
        size = 0
        chunks = body.chunks().__aiter__()
        # Once a turn is held, the rest must keep coming at LARGE_CALL_MIN_RATE on average
        # (after a grace): a client trickling a byte now and then within the body's stall
        # deadline held a turn up to TALKIES_UPLOAD_TIMEOUT, and two of them every large call.
        held_since: float | None = None
        held_bytes = 0
        while True:
            if held_since is None:
                chunk = await anext(chunks, None)
            else:
                due = held_since + LARGE_CALL_GRACE + held_bytes / LARGE_CALL_MIN_RATE
                with anyio.move_on_after(max(0.0, due - anyio.current_time())) as late:
                    chunk = await anext(chunks, None)
                if late.cancelled_caught:
                    raise HttpError(
                        408,
                        f"a call over {LARGE_BODY} bytes must send its body at "
                        f"{LARGE_CALL_MIN_RATE // 1024} KiB/s or more once it has a turn",
                    )
            if chunk is None:
                return parts
            if held_since is not None:
                held_bytes += len(chunk)
            size += len(chunk)
            if size > LARGE_BODY and held_since is None:
                await turn.enter_async_context(self._large_calls)
                held_since = anyio.current_time()
            parts.append(chunk)

    # -- protocol handlers -----------------------------------------------------------------

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        tool = self._tools.get(name)
        return tool.input_schema() if tool is not None else None

    async def _list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.definition() for tool in self._tools.values()])

    async def _call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = self._tools.get(params.name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")
        return await tool.call(params.arguments or {})
