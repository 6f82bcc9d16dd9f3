"""Engines: models, worker threads and the bounded queues between them and the event loop.

By concern: :mod:`.base` is the interface every engine implements and transports see
(:class:`~talkies.engines.base.StreamProvider`); :mod:`.runtime` runs live streams in decode
rounds on worker threads behind byte-bounded queues; :mod:`.supply` is the registry and the
files of models; :mod:`.isolation` runs native engines in processes of their own; :mod:`.pool`
keeps slots, pinning and loaded models' lifetimes. Each engine is a folder of its own
(``sherpa``, ``vosk``, ``whisper``, ``parakeet``, ``kokoro``, ``qwen3``), and :mod:`.tts` is the
interface speech engines share.
"""
