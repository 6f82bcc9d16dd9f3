"""Transports: sockets and frames around the app layer, which they only translate to.

- :mod:`.tcp`, :mod:`.http`, :mod:`.h11app` and :mod:`.server` are the standalone anyio server;
  :mod:`.ws` is its WebSocket channel over wsproto, for the app's stream route
  (:mod:`talkies.app.websocket`, which runs :class:`~talkies.app.driver.StreamDriver`).
- :mod:`.asgi` hosts the same routes inside any ASGI server.
"""
