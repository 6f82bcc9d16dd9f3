"""Run a talkies Server in a benchmark's server process until SIGTERM or SIGINT.

It settles the garbage collector as ``talkies serve`` does (talkies/heap.py), prints
``PORT n`` once listening (the parent reads that), and calls ``on_usr1`` for each
SIGUSR1 when given one (a way for the parent to ask the server process for a report).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import anyio

from talkies import heap


def serve_until_signal(server: Any, on_usr1: Callable[[], None] | None = None) -> None:
    wanted = [signal.SIGTERM, signal.SIGINT]
    if on_usr1 is not None:
        wanted.append(signal.SIGUSR1)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            heap.settle()  # as ``talkies serve`` does
            print(f"PORT {server.port}", flush=True)
            with anyio.open_signal_receiver(*wanted) as signals:
                async for signum in signals:
                    if signum == signal.SIGUSR1 and on_usr1 is not None:
                        on_usr1()
                        continue
                    await server.shutdown(0.5)
                    break

    anyio.run(main)
