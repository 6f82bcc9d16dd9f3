"""Talkies: a self-hosted live speech server.

The package is layered: :mod:`talkies.protocol` is pure (no I/O), :mod:`talkies.engines`
owns models and threads, :mod:`talkies.transport` wires sockets to both.
"""

__version__ = "0.1.0"
