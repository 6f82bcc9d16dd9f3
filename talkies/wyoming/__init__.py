"""Wyoming, Home Assistant's protocol for speech services: a server for speech-to-text and
text-to-speech on Talkies' model pool (:mod:`.server`: the listener and shutdown;
:mod:`.connection`: one client's read loop; :mod:`.asr`, :mod:`.tts` and :mod:`.describe`:
the requests; :mod:`.channel`: sending), its capped framing (:mod:`.framing`) and the
conversion of a client's audio to 16 kHz mono (:mod:`.audio`)."""

from .server import WyomingServer

__all__ = ["WyomingServer"]
