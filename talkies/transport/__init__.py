"""Transports: sockets, timers and queues around the pure protocol core.

- :mod:`.driver` runs one :class:`~talkies.protocol.StreamSession` over any message channel.
- :mod:`.ws` is that channel over wsproto; :mod:`.http` and :mod:`.server` the anyio server.
- :mod:`.asgi` is the same session inside any ASGI server.
"""
