"""What the current tick did so far: each request's update, slot grants, ends and rejections;
``flush`` packs them into the tick's one ``TickReport``.

A request's update is the wire's ``RequestUpdate`` from the start, each fact of the tick
merged into it (``RequestUpdate.merge``): the one record of a request's output, from here to
the frontend's stream.
"""

from __future__ import annotations

from typing import Any

from tinyserve.engine.kv.host_cache import CacheStats
from tinyserve.engine.output.report import (
    Batch,
    EmbedBatch,
    Ended,
    Grant,
    Guessed,
    Load,
    Rejected,
    TickReport,
)
from tinyserve.protocol import Embedded, RequestUpdate, Submit


class TickDrafts:
    """Collects one tick's facts; ``flush`` turns them into a ``TickReport`` and empties.

    Each request's updates are numbered from 0 so its frontend can detect a lost message.
    """

    def __init__(self) -> None:
        self._updates: dict[str, tuple[str, RequestUpdate]] = {}  # id -> (frontend, update)
        self._next_seq: dict[str, int] = {}
        self._grants: list[Grant] = []
        self._ended: list[Ended] = []
        self._rejections: list[Rejected] = []
        self._embedded: list[Embedded] = []
        self._embed_batch: EmbedBatch | None = None
        self._guessed = Guessed()

    def _add(self, request: Submit, update: RequestUpdate) -> None:
        held = self._updates.get(request.request_id)
        merged = held[1].merge(update) if held else update
        self._updates[request.request_id] = (request.frontend_id, merged)

    def _seq(self, request: Submit) -> int:
        """The number this tick's update of ``request`` goes out with."""
        return self._next_seq.get(request.request_id, 0)

    def accepted(self, request: Submit) -> None:
        self._add(request, RequestUpdate(request.request_id, self._seq(request), accepted=True))

    def token(
        self, request: Submit, token_id: int, text: bytes, logprobs: list[Any] | None = None
    ) -> None:
        entries = [logprobs] if logprobs is not None else []
        seq = self._seq(request)
        self._add(
            request, RequestUpdate(request.request_id, seq, [token_id], text, logprobs=entries)
        )

    def progress(self, request: Submit, done: int, cached: int) -> None:
        """A prefill chunk ran: ``done`` prompt tokens are in its slot, ``cached`` of them
        reused (what the frontend's progress events report)."""
        seq = self._seq(request)
        update = RequestUpdate(request.request_id, seq, cached_tokens=cached, prompt_done=done)
        self._add(request, update)

    def prompt_logprobs(self, request: Submit, entries: list[list[Any]]) -> None:
        seq = self._seq(request)
        self._add(request, RequestUpdate(request.request_id, seq, prompt_logprobs=entries))

    def text(self, request: Submit, text: bytes) -> None:
        if text:
            self._add(request, RequestUpdate(request.request_id, self._seq(request), text=text))

    def finish(
        self,
        request: Submit,
        reason: str,
        detail: str = "",
        cached_tokens: int = 0,
        timeline: dict[str, Any] | None = None,
        stop_string: str = "",
    ) -> None:
        """The request's final update (what its frontend reads)."""
        end = RequestUpdate(
            request.request_id,
            self._seq(request),
            finish_reason=reason,
            detail=detail,
            prompt_tokens=len(request.prompt_ids),
            cached_tokens=cached_tokens,
            timeline=timeline,
            stop_string=stop_string,
        )
        self._add(request, end)

    def granted(self, grant: Grant) -> None:
        self._grants.append(grant)

    def ended(self, ended: Ended) -> None:
        self._ended.append(ended)

    def rejected(self, rejected: Rejected) -> None:
        self._rejections.append(rejected)

    def embedded(self, ended: list[Embedded], batch: EmbedBatch | None = None) -> None:
        """Embedding requests that ended (each with its one ``Embedded``), and the batch run."""
        self._embedded += ended
        self._embed_batch = batch or self._embed_batch

    def guessed(self, tokens: int, accepted: int) -> None:
        """A decode row carried ``tokens`` guessed tokens; ``accepted`` were confirmed."""
        self._guessed.add(tokens, accepted)

    def __bool__(self) -> bool:
        return bool(self._updates or self._embedded)

    def flush(self, load: Load, batch: Batch | None, cache: CacheStats | None) -> TickReport:
        """This tick's report: the updates per frontend, numbered, and the rest as collected."""
        updates: dict[str, list[RequestUpdate]] = {}
        for request_id, (frontend_id, update) in self._updates.items():
            if update.ended:
                self._next_seq.pop(request_id, None)
            else:
                self._next_seq[request_id] = update.seq + 1
            updates.setdefault(frontend_id, []).append(update)
        report = TickReport(
            load,
            updates,
            self._grants,
            self._ended,
            self._rejections,
            batch,
            cache,
            self._embedded,
            self._embed_batch,
            self._guessed,
        )
        self._updates = {}
        self._grants, self._ended, self._rejections, self._embedded = [], [], [], []
        self._embed_batch = None
        self._guessed = Guessed()
        return report
