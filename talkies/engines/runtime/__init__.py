"""The engine runtime: how a live stream's audio reaches a decoder and its results come back.

Every live stream of every engine runs here. A :class:`ThreadedStream` queues a stream's PCM
in a queue bounded in bytes (a full queue makes ``feed`` wait, so the transport stops reading
and TCP pushes back); the model's :class:`DecodeRounds` take the audio of every ready stream to
worker threads in rounds (:mod:`.threads` runs them and watches the decode deadline), so one
thread hop serves many streams and nothing blocks the event loop. :mod:`.slots` counts a
model's concurrent users, and :mod:`.memory` gives a closed stream's heap back to the system.
"""

from .rounds import DEFAULT_DECODE_TIMEOUT, DecodeRounds, ThreadedStream

__all__ = ["DEFAULT_DECODE_TIMEOUT", "DecodeRounds", "ThreadedStream"]
