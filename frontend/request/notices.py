"""What a request asked for that the server did otherwise, told to whoever asks why: fields
it accepted and ignored (unknown ones, or asking for what this server does not do), and
lengths it clamped. ``models.parse.read_body`` and the pipeline note them on the request; the
response carries them in ``X-TinyServe-Ignored`` (paths without list indices, each once), the
frontend logs each field the first time it sees it, and ``tinyserve_ignored_fields_total``
counts them by field."""

from __future__ import annotations

import logging
import re

from aiohttp import web

from tinyserve.frontend.models.parse import IGNORED_FIELDS
from tinyserve.logs import fields
from tinyserve.metrics import FrontendMetrics

log = logging.getLogger(__name__)

HEADER = "X-TinyServe-Ignored"
MAX_HEADER_CHARS = 2000
MAX_FIELD_CHARS = 80
# Field labels are the client's words: past this many distinct ones a frontend counts the
# rest as OTHER_FIELD, so a client cannot grow the metrics without bound.
MAX_LABELS = 256
OTHER_FIELD = "other"
_INDEX = re.compile(r"\[\d+\]")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")  # a header carries printable ASCII only


def note(request: web.Request, *paths: str) -> None:
    """``paths`` of ``request`` were ignored (or clamped: ``max_tokens (clamped to N)``)."""
    request[IGNORED_FIELDS] = [*request.get(IGNORED_FIELDS, []), *paths]


class Notices:
    """One frontend's report of what its requests had ignored."""

    def __init__(self, metrics: FrontendMetrics) -> None:
        self._counted = metrics.ignored_fields_total
        self._seen: set[str] = set()

    def report(self, request: web.Request, response: web.StreamResponse) -> None:
        """Tell of ``request``'s ignored fields in ``response``'s headers, the log, the
        metric."""
        paths = request.get(IGNORED_FIELDS)
        if not paths:
            return
        names = list(dict.fromkeys(_name(path) for path in paths))
        header = ", ".join(names)
        if len(header) > MAX_HEADER_CHARS:
            header = header[: MAX_HEADER_CHARS - 4].rsplit(", ", 1)[0] + ", ..."
        response.headers[HEADER] = header
        for name in names:
            self._counted.labels(self._label(name, request.path)).inc()

    def _label(self, name: str, path: str) -> str:
        if name in self._seen:
            return name
        if len(self._seen) >= MAX_LABELS:
            return OTHER_FIELD
        self._seen.add(name)
        log.info("request field ignored", extra=fields(field=name, path=path))
        return name


def _name(path: str) -> str:
    return _UNPRINTABLE.sub("?", _INDEX.sub("[]", path))[:MAX_FIELD_CHARS]
