"""Log output: JSON lines when not on a terminal (or ``OSTE_LOG_FORMAT=json``), text otherwise.

A JSON line holds ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message``, the record's extra
fields (the delivery lines carry ``activity_id``, ``attempt``, ``outcome``, ``http_status``,
``duration_ms``…) and, when there is one, the traceback as one ``exception`` string field.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return orjson.dumps(entry, default=str).decode()


def json_wanted(log_format: str | None, stream: TextIO) -> bool:
    """JSON unless asked for text, or unset and ``stream`` is a terminal."""
    if log_format is not None:
        return log_format == "json"
    isatty = getattr(stream, "isatty", None)
    return not (isatty is not None and isatty())


CHATTY_LOGGERS = ("tortoise", "hypercorn.error")
"""Libraries whose INFO lines say nothing an operator acts on ("Tortoise-ORM shutdown" while migrating,
Hypercorn's "Running on" before OSTE's own line): shown at DEBUG only."""


def configure_logging(level: str, log_format: str | None, stream: TextIO | None = None) -> None:
    """Send the root logger's records to ``stream`` (standard error) as JSON or text, at ``level``;
    ``CHATTY_LOGGERS`` at WARNING unless ``level`` is DEBUG."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    formatter = JsonFormatter() if json_wanted(log_format, stream) else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level == "DEBUG" else logging.WARNING)
