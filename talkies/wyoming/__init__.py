"""Wyoming, Home Assistant's protocol for speech services: a server for speech-to-text and
text-to-speech on Talkies' model pool (:mod:`.server`), its capped framing (:mod:`.framing`)
and the conversion of a client's audio to 16 kHz mono (:mod:`.audio`)."""

from .server import WyomingServer

__all__ = ["WyomingServer"]
