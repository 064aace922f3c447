"""The log formats (``--log-format``): ``text``, a line a person reads, and ``json``, one object
per line as controller-runtime's zap encoder writes them: ``ts`` (RFC 3339, UTC, milliseconds),
``level`` (zap's names: debug, info, warn, error), ``logger``, ``msg``, then the line's structured
fields (kubeindex/runtime/logfields.py: resource, namespace, name, error), and ``stacktrace`` with a
traceback. Every library's lines go the same way (the root logger's one handler)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal

from kubeindex.runtime.logfields import FIELDS, describe

LogFormat = Literal["text", "json"]
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error",
          logging.CRITICAL: "fatal"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": LEVELS.get(record.levelno, record.levelname.lower()),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, FIELDS, None)
        if isinstance(extra, dict):
            line.update((key, value) for key, value in extra.items() if key not in line)
        if record.exc_info and record.exc_info[1] is not None:
            line.setdefault("error", describe(record.exc_info[1]))
            line["stacktrace"] = self.formatException(record.exc_info)
        elif record.stack_info:
            line["stacktrace"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=str)


def configure(level: str, log_format: LogFormat) -> None:
    """The root logger's one handler, on stderr, in ``log_format``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    if log_format == "json":
        logging.captureWarnings(True)  # Python's warnings as log lines too, not free text on stderr
