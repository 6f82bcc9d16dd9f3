"""Isolation: native engines in a process of their own, so that a crash never ends the server.

The parent keeps a proxy (:mod:`.proxy`) that is an ordinary loaded model to the pool and the
runtime; the child (:mod:`.child`, run as ``python -m talkies.engines.isolation.child``) loads
the real model and answers the proxy's calls over authenticated local sockets.
"""
