"""Logging set-up: plain text for people, JSON lines for machines (``--log-format``).

Code logs through ``logging`` with structured fields in ``extra={"fields": {...}}``; the JSON
formatter merges them into the line, the text formatter appends them as ``key=value``. When
systemd connected stderr to the journal, each line starts with its syslog priority ("<4>"),
which journald takes off and keeps as the entry's priority (``journalctl -p warning``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from logging.handlers import SysLogHandler
from typing import Any, TextIO

from tinyserve.config import Config, journal_stream


class JsonFormatter(logging.Formatter):
    def __init__(self, process_name: str) -> None:
        super().__init__()
        self._process = process_name

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "process": self._process,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self, process_name: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)s {process_name} %(name)s: %(message)s")
        self.converter = time.gmtime

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return text


class JournalPriority(logging.Formatter):
    """Another formatter's text with the record's syslog priority before each of its lines
    (sd-daemon(3)'s "<N>" prefixes: a traceback's lines are entries of their own there)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        # The standard library's syslog handler's table: crit 2, err 3, warning 4, info 6,
        # debug 7 (a level it does not know is a warning, as there).
        name = SysLogHandler.priority_map.get(record.levelname, "warning")
        prefix = f"<{SysLogHandler.priority_names[name]}>"
        return prefix + self._inner.format(record).replace("\n", "\n" + prefix)


def writes_to_journal(stream: TextIO) -> bool:
    """Whether ``stream`` is the one systemd connected to the journal: ``JOURNAL_STREAM``
    names its device and inode (a child whose stderr was redirected inherits the variable
    but not the stream)."""
    journal = journal_stream()
    if journal is None:
        return False
    try:
        stat = os.fstat(stream.fileno())
    except (OSError, ValueError):  # no descriptor: a test's capture, a closed stream
        return False
    return (stat.st_dev, stat.st_ino) == journal


def setup_logging(config: Config, process_name: str) -> None:
    """Route every logger of this process to stderr in the configured format."""
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter
    if config.log_format == "json":
        formatter = JsonFormatter(process_name)
    else:
        formatter = TextFormatter(process_name)
    if writes_to_journal(sys.stderr):
        formatter = JournalPriority(formatter)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log_level.upper())


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a structured log call: ``log.info("done", extra=fields(id=rid))``."""
    return {"fields": values}


class RateLimitedLog:
    """At most one warning per ``interval_s`` through ``logger``; the next one that goes out
    counts the ones held back, so a flood of junk cannot flood the log (or the disk)."""

    def __init__(self, logger: logging.Logger, interval_s: float = 5.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._next = 0.0
        self.suppressed = 0

    def warning(self, message: str, **values: Any) -> None:
        now = time.monotonic()
        if now < self._next:
            self.suppressed += 1
            return
        self._next = now + self._interval_s
        self._logger.warning(message, extra=fields(**values, suppressed=self.suppressed))
        self.suppressed = 0
