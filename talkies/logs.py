"""Structured logging: one JSON object per line, with the fields a record was given in ``extra``."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["CHATTER", "Demote", "JsonFormatter", "configure"]

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


# Lines libraries log once per request that tell an operator nothing: at the debug level
# only. Other lines of the same loggers, their real warnings among them, are left alone.
CHATTER = {
    # The MCP SDK's stateless transport ends a session of no id after every call.
    "mcp.server.streamable_http": ("Terminating session: ",),
    # phonemizer (Kokoro's espeak front end) when espeak reads "$5" or "Mr." as other words
    # than the text has: the phonemes are still right.
    "phonemizer": ("words count mismatch",),
}


class Demote(logging.Filter):
    """Turns the records of a logger whose message starts with one of ``prefixes`` into
    debug records, passed on only when the root logger shows debug."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith(self.prefixes)):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def configure(level: str = "info") -> None:
    """Send JSON log lines to stderr (the library itself only ever calls ``logging``), with
    the libraries' :data:`CHATTER` at the debug level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name, prefixes in CHATTER.items():
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, Demote)]:
            logger.removeFilter(old)
        logger.addFilter(Demote(prefixes))
