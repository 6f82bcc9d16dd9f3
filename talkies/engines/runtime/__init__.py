r"""The engine runtime: a byte-bounded queue in, events out, decoding in rounds.

Every live stream of every engine runs here (``shared/design.md``, "One engine runtime"):

- **Queue.** Each stream (:class:`ThreadedStream`) queues audio in a queue bounded in bytes
  (``TALKIES_STREAM_MAX_BUFFER_SECONDS`` of PCM). A full queue makes ``feed`` wait, so the
  transport stops reading the socket and a slow decoder slows the client's TCP window instead
  of growing the server's memory.
- **Rounds.** Decoding happens in rounds on worker threads (:class:`DecodeRounds`, one per
  model). A stream that gets work (audio, the end of its input) joins the model's ready list;
  if fewer than ``parallel`` rounds are running, a round starts at once: it takes every ready
  stream's :class:`~talkies.engines.base.Work` (its queued audio, whether its input ends) to
  one worker thread, and when it is done the event loop gives every stream its results and
  starts the next round with the streams that have work by then. So a thread hop is paid per
  round, not per stream or frame: under load one hop serves many streams, and an idle server
  answers a single stream with a single hop. Once decoding costs more than a hop (over 1 ms
  per stream and round), the ready streams are shared between the free round threads, so
  one-by-one decoders use every core. Rounds are started from ``feed``/``flush`` and
  from the previous round's completion, all on the event loop: no task leads them, so a
  round never waits for some stream's task to be scheduled, nor dies with it.
- **Spacing.** While decoding costs less than the hop (a cheap decoder: under 1 ms per
  stream and round), the hop is the whole cost, and under load a round per frame made the
  event loop and a round thread take turns at the GIL thousands of times a second. Then
  rounds start at most every 0.9 ms, one at a time while the running one is quick, so one
  hop serves the audio of every stream that came meanwhile; a model out of idle, or whose
  open streams all have work, starts at once, and a round that turns out slow (a hung call)
  holds the others back for 20 ms at most. The gap is waited for in the round thread: the
  next round is handed to it when the last one ends, and streams that get audio meanwhile
  join it until it is due (an event-loop timer would wake at the selector's next whole
  millisecond, not at the gap). Not for a model that gathers (sherpa: its own ``max_wait``
  batches), nor off asyncio (a timer there is a thread). Measured in bench/README.md
  ("Transport efficiency").
- **Results.** A consumer may :meth:`ThreadedStream.listen`: the results are then offered to
  it in the callback that ends the round (the transport answers a partial there, writing
  to the socket at once), and ``events()`` wakes only for what it leaves.
- **Batching.** In a round, recognitions that offer ``decode_many``
  (:class:`~talkies.engines.base.BatchRecognition`: sherpa) are decoded together, one call
  per recognition type; the others one by one, with ``accept`` and ``finish``. A batched
  decoder may keep decodable input for later (``Work.more``): the stream then goes again in
  the next round without new audio, and its queue, not the decoder, absorbs the backlog.
- **Gathering.** With ``gather`` > 0 (sherpa's ``max_wait``), a round that would start from
  idle first waits up to that long for every open stream of the model to have work, so one
  batched call serves them all rather than the first one alone.
- **Opening.** A stream's recognition is created in a worker thread (:meth:`DecodeRounds.open`):
  a Vosk recognizer takes ~70 ms, which on the event loop would stall every connection.
- **Deadline.** A decode call (``accept``, ``finish``, ``decode_many``) that has not returned
  after ``timeout`` seconds (``TALKIES_DECODE_TIMEOUT``, 30 s) is given up on: its streams get
  an EngineFailed (4500 ``server_error``), so their slots are freed and their clients
  answered; the round's other streams get their results (calls that returned) or their work
  back (calls not yet made), and the model's other rounds go on in fresh threads. The hung
  thread keeps the recognitions of that call and closes them when the call finally returns;
  they are never used again. Python cannot stop a thread, so it is abandoned, not killed.

The runtime passes events through as the decoders report them: dropping unchanged partials
and empty endpoints is the protocol session's job alone (``docs/protocol.md``).

Modules: :mod:`.rounds` (a model's :class:`DecodeRounds` and its :class:`ThreadedStream`\ s),
:mod:`.threads` (the round threads, a round's steps, the deadline's bookkeeping), :mod:`.model`
(:class:`RecognitionModel`, the loaded-model base of every engine the runtime drives),
:mod:`.loop` (callbacks onto the event loop from threads), :mod:`.slots` (a model's
concurrent users), :mod:`.memory` (a closed stream's heap back to the system) and :mod:`.lag`
(how far each stream's decoder is behind its audio; a model that cannot keep up refuses new
streams).
"""

from .model import RecognitionModel
from .rounds import DEFAULT_DECODE_TIMEOUT, DecodeRounds, ThreadedStream

__all__ = ["DEFAULT_DECODE_TIMEOUT", "DecodeRounds", "RecognitionModel", "ThreadedStream"]
