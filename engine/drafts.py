"""What the current tick did so far: per-request update drafts, slot grants, finishes and
rejections; ``flush`` packs them into the tick's one ``TickReport``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tinyserve.engine.prefix_cache import CacheStats
from tinyserve.engine.report import Batch, Finish, Grant, Load, Rejection, TickReport
from tinyserve.protocol import RequestUpdate, Submit


@dataclass(slots=True)
class _Draft:
    frontend_id: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[list[Any]] = field(default_factory=list)
    prompt_logprobs: list[list[Any]] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    accepted: bool = False
    finish_reason: str | None = None
    detail: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    timeline: dict[str, Any] | None = None


class TickDrafts:
    """Collects one tick's facts; ``flush`` turns them into a ``TickReport`` and empties.

    Each request's updates are numbered from 0 so its frontend can detect a lost message.
    """

    def __init__(self) -> None:
        self._drafts: dict[str, _Draft] = {}
        self._next_seq: dict[str, int] = {}
        self._grants: list[Grant] = []
        self._finishes: list[Finish] = []
        self._rejections: list[Rejection] = []
        self._generated = 0

    def _draft(self, request: Submit) -> _Draft:
        draft = self._drafts.get(request.request_id)
        if draft is None:
            draft = self._drafts[request.request_id] = _Draft(request.frontend_id)
        return draft

    def accepted(self, request: Submit) -> None:
        self._draft(request).accepted = True

    def granted(self, grant: Grant) -> None:
        self._grants.append(grant)

    def token(
        self, request: Submit, token_id: int, text: bytes, logprobs: list[Any] | None = None
    ) -> None:
        draft = self._draft(request)
        draft.token_ids.append(token_id)
        draft.text += text
        self._generated += 1
        if logprobs is not None:
            draft.logprobs.append(logprobs)

    def prompt_logprobs(self, request: Submit, entries: list[list[Any]]) -> None:
        self._draft(request).prompt_logprobs += entries

    def text(self, request: Submit, text: bytes) -> None:
        self._draft(request).text += text

    def finish(
        self,
        request: Submit,
        reason: str,
        detail: str = "",
        cached_tokens: int = 0,
        timeline: dict[str, Any] | None = None,
    ) -> None:
        """The request's final update (what its frontend reads)."""
        draft = self._draft(request)
        draft.finish_reason = reason
        draft.detail = detail
        draft.prompt_tokens = len(request.prompt_ids)
        draft.cached_tokens = cached_tokens
        draft.timeline = timeline

    def finished(self, finish: Finish) -> None:
        self._finishes.append(finish)

    def rejected(self, rejection: Rejection) -> None:
        self._rejections.append(rejection)

    def __bool__(self) -> bool:
        return bool(self._drafts)

    def flush(self, load: Load, batch: Batch | None, cache: CacheStats | None) -> TickReport:
        """This tick's report: the drafts as updates per frontend, and the rest as collected."""
        updates: dict[str, list[RequestUpdate]] = {}
        for request_id, d in self._drafts.items():
            seq = self._next_seq.get(request_id, 0)
            if d.finish_reason is None:
                self._next_seq[request_id] = seq + 1
            else:
                self._next_seq.pop(request_id, None)
            update = RequestUpdate(
                request_id,
                seq,
                d.token_ids,
                bytes(d.text),
                d.accepted,
                d.finish_reason,
                d.detail,
                d.prompt_tokens,
                d.cached_tokens,
                d.timeline,
                d.logprobs,
                d.prompt_logprobs,
            )
            updates.setdefault(d.frontend_id, []).append(update)
        report = TickReport(
            load,
            updates,
            self._grants,
            self._finishes,
            self._rejections,
            batch,
            self._generated,
            cache,
        )
        self._drafts = {}
        self._grants, self._finishes, self._rejections = [], [], []
        self._generated = 0
        return report
