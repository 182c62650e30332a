"""Collects what happened to each request during a tick, then packs one message per frontend."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tinyserve.protocol import EngineStats, Event, RequestUpdate, Submit, TickOutput


@dataclass
class _Draft:
    frontend_id: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[list[Any]] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    events: list[Event] = field(default_factory=list)
    finish_reason: str | None = None
    detail: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    timeline: dict[str, Any] | None = None


class Outbox:
    """Per-request drafts for the current tick; ``flush`` turns them into ``TickOutput``s.

    Each request's updates are numbered from 0 so its frontend can detect a lost message.
    """

    def __init__(self) -> None:
        self._drafts: dict[str, _Draft] = {}
        self._next_seq: dict[str, int] = {}

    def _draft(self, request: Submit) -> _Draft:
        draft = self._drafts.get(request.request_id)
        if draft is None:
            draft = self._drafts[request.request_id] = _Draft(request.frontend_id)
        return draft

    def event(
        self, request: Submit, kind: str, tick: int, value: int = 0, detail: str = ""
    ) -> None:
        self._draft(request).events.append(Event(kind, tick, value, detail))

    def token(
        self, request: Submit, token_id: int, text: bytes, logprobs: list[Any] | None = None
    ) -> None:
        draft = self._draft(request)
        draft.token_ids.append(token_id)
        draft.text += text
        if logprobs is not None:
            draft.logprobs.append(logprobs)

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
        draft = self._draft(request)
        draft.finish_reason = reason
        draft.detail = detail
        draft.prompt_tokens = len(request.prompt_ids)
        draft.cached_tokens = cached_tokens
        draft.timeline = timeline

    def __bool__(self) -> bool:
        return bool(self._drafts)

    def flush(self, stats: EngineStats) -> list[TickOutput]:
        """All drafts of this tick as one ``TickOutput`` per frontend; the outbox empties."""
        per_frontend: dict[str, list[RequestUpdate]] = defaultdict(list)
        for request_id, d in self._drafts.items():
            seq = self._next_seq.get(request_id, 0)
            if d.finish_reason is None:
                self._next_seq[request_id] = seq + 1
            else:
                self._next_seq.pop(request_id, None)
            per_frontend[d.frontend_id].append(
                RequestUpdate(
                    request_id,
                    seq,
                    token_ids=d.token_ids,
                    text=bytes(d.text),
                    events=d.events,
                    finish_reason=d.finish_reason,
                    detail=d.detail,
                    prompt_tokens=d.prompt_tokens,
                    cached_tokens=d.cached_tokens,
                    timeline=d.timeline,
                    logprobs=d.logprobs,
                )
            )
        self._drafts.clear()
        return [TickOutput(fid, updates, stats) for fid, updates in per_frontend.items()]
