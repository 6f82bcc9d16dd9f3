"""How far a stream's decoder is behind its audio, and a model's refusal when it cannot keep up.

**A stream's lag** at time ``t`` is the audio the server has received for it (handed to
``ThreadedStream.feed``) that the decoder has not answered for yet, in seconds: audio counts
as answered when a decode round that was given it ends with the decoder holding none of it
back (``Work.more`` false). It is capped by the age of the oldest unanswered audio: a client
that sends faster than real time (a file, sent as fast as the socket takes it) builds a
backlog of audio without the decoder being behind real time, and for a client that sends in
real time the two are the same. So the lag rises while a round decodes and drops when it
ends: a decoder that keeps up answers each round with the lag of the audio that came while
it ran; one that cannot falls further behind at every round, until the stream's bounded queue
(``TALKIES_STREAM_MAX_BUFFER_SECONDS``) is full and backpressure holds the client, beyond
what the server can see. Each result carries the lag at the moment its round ended.

**A model's lag** is the worst lag of its open streams, each taken as the lag its last round
ended with (for a client that sends in real time, about how long its rounds take), or, while
a round runs longer than that, how long it has run: so the sawtooth does not count twice, and
a decoder stuck in a long round counts at once. Over ``bound`` seconds
(``TALKIES_STREAM_MAX_LAG``, or the entry's ``max_lag``; 0: never) the model is *lagging*: new
streams are refused with ``connection_limit`` (:class:`LagGate`), and ``/readyz`` answers
503, until its lag is back at or under half the bound (hysteresis, so a model at the edge
does not flap), which it is at once when its streams end.

Times are ``time.monotonic()`` seconds, read by the callers on the event loop.
"""

from __future__ import annotations

from collections import deque

__all__ = ["RECOVER", "LagGate", "LagMeter", "lag_detail"]

_BYTES_PER_SECOND = 32000.0  # 16 kHz PCM16 mono
# Arrivals closer together than this share one marker; past _MARKERS, neighbours merge in
# pairs, each keeping the older time (so an age is overstated by at most what a marker spans,
# never understated), and the spacing doubles until the backlog is answered, so old and new
# markers span alike.
_COALESCE = 0.05
_MARKERS = 512
# A lagging model takes new streams again once its lag is at or under this share of the bound.
RECOVER = 0.5


class LagMeter:
    """One stream's received and answered audio, and when the unanswered part arrived.

    ``received`` when audio arrives; ``claimed`` when a round takes it (negative when it is
    given back); ``settled`` when a round ends. All on the event loop.
    """

    __slots__ = ("_answered", "_arrivals", "_claimed", "_received", "_spacing", "_split")

    def __init__(self) -> None:
        self._received = 0  # bytes
        self._claimed = 0  # bytes handed to rounds (less those given back)
        self._answered = 0  # bytes the decoder has answered for
        # (end offset in bytes, arrival time) of audio not yet answered, oldest first.
        self._arrivals: deque[list[float]] = deque()
        self._spacing = _COALESCE
        self._split = False  # a round took the audio so far: the next arrival starts a marker

    def received(self, size: int, now: float) -> None:
        if size <= 0:
            return
        self._received += size
        arrivals = self._arrivals
        if arrivals and not self._split and now - arrivals[-1][1] < self._spacing:
            arrivals[-1][0] = self._received
            return
        self._split = False
        arrivals.append([self._received, now])
        if len(arrivals) > _MARKERS:
            pairs = list(arrivals)
            merged = [[pairs[i + 1][0], pairs[i][1]] for i in range(0, len(pairs) - 1, 2)]
            if len(pairs) % 2:
                merged.append(pairs[-1])
            self._arrivals = deque(merged)
            self._spacing *= 2

    def claimed(self, size: int) -> None:
        self._claimed += size
        self._split = True  # (so markers end where rounds' audio does)

    def settled(self, more: bool, now: float) -> float:
        """A round ended; ``more``: the decoder still holds audio it was given. The lag now."""
        if not more:
            self._answered = self._claimed
            arrivals = self._arrivals
            while arrivals and arrivals[0][0] <= self._answered:
                arrivals.popleft()
            if not arrivals:
                self._spacing = _COALESCE
        return self.lag(now)

    def lag(self, now: float) -> float:
        """Seconds of received audio the decoder has not answered for, at most the age of
        the oldest of it."""
        behind = (self._received - self._answered) / _BYTES_PER_SECOND
        try:  # (the gauges read it from a scrape's thread, while the event loop answers)
            oldest = self._arrivals[0][1]
        except IndexError:
            return 0.0
        return max(0.0, min(behind, now - oldest))


class LagGate:
    """Whether a model is lagging, with hysteresis: over ``bound`` it is; it is not again
    until its lag is at or under ``RECOVER`` times the bound. ``bound`` 0: never."""

    __slots__ = ("bound", "lagging", "worst")

    def __init__(self, bound: float = 0.0) -> None:
        self.bound = bound
        self.lagging = False
        self.worst = 0.0  # the model's lag when last checked

    def check(self, lag: float) -> bool:
        """The model's lag now; whether it is lagging."""
        self.worst = lag
        if self.bound <= 0:
            self.lagging = False
        elif lag > self.bound:
            self.lagging = True
        elif lag <= self.bound * RECOVER:
            self.lagging = False
        return self.lagging


def lag_detail(slug: str, lag: float, bound: float) -> str:
    """What a stream refused for lag is told (the detail of its ``connection_limit``)."""
    return (
        f"model {slug!r} cannot keep its streams real time: its decoder is {lag:.1f} s behind "
        f"the audio (the bound is {bound:g} s); try again when it has caught up"
    )
