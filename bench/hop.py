"""What one event-loop -> worker-thread -> event-loop hop costs, with nothing else running.

    python bench/hop.py [--rates 1000,2000,4000] [--seconds 4]

At each rate, an asyncio loop hands a job to a worker thread through a ``queue.SimpleQueue``
on a timer, and the thread hands it back with ``call_soon_threadsafe`` (the shape of a decode
round in talkies/engines/rounds.py, with a job that does nearly nothing). Printed: the CPU
time of the loop's thread and of the worker per hop (``time.thread_time``). On a busy server
a hop costs more than this (the GIL is contended); this is its floor on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import threading
import time
from collections.abc import Callable

Job = Callable[[], None] | None


def _worker(
    loop: asyncio.AbstractEventLoop, jobs: queue.SimpleQueue[Job], out: list[float]
) -> None:
    began = time.thread_time()
    while (job := jobs.get()) is not None:
        loop.call_soon_threadsafe(job)
    out.append(time.thread_time() - began)


async def measure(rate: int, seconds: float) -> tuple[float, float]:
    """(loop CPU us per hop, worker CPU us per hop) at ``rate`` hops a second."""
    loop = asyncio.get_running_loop()
    jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
    worker_cpu: list[float] = []
    thread = threading.Thread(target=_worker, args=(loop, jobs, worker_cpu))
    thread.start()
    total = int(rate * seconds)
    returned = 0
    finished = loop.create_future()

    def back() -> None:
        nonlocal returned
        returned += 1
        if returned == total:
            finished.set_result(None)

    began_cpu, began = time.thread_time(), loop.time()
    sent = 0

    def tick() -> None:
        nonlocal sent
        sent += 1
        jobs.put(back)
        if sent < total:
            loop.call_at(began + sent / rate, tick)

    loop.call_soon(tick)
    await finished
    loop_cpu = time.thread_time() - began_cpu
    jobs.put(None)
    await asyncio.to_thread(thread.join)
    return loop_cpu / total * 1e6, worker_cpu[0] / total * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="1000,2000,4000")
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    for rate in (int(r) for r in args.rates.split(",")):
        loop_us, worker_us = asyncio.run(measure(rate, args.seconds))
        print(f"{rate:6d} hops/s: event loop {loop_us:5.1f} us/hop, worker {worker_us:5.1f} us/hop")


if __name__ == "__main__":
    main()
