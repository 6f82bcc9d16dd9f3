"""Engines: models, worker threads and the bounded queues between them and the event loop.

Adapters (:class:`~talkies.engines.base.Recognition`) are synchronous and run only in worker
threads; :class:`~talkies.engines.runner.ThreadedStream` bridges one to the event loop with a
byte-bounded queue. Transports see only :class:`~talkies.engines.base.StreamProvider`.
"""
