"""Per-request streams: the engine's ``RequestUpdate``s for one request, in order, decoded.

The listener task calls ``deliver`` (never blocks); the handler awaits ``acknowledged`` and then
iterates ``pieces()``. A stream always ends with exactly one ``Finish``: the engine's, or one
made up here when an update went missing (sequence gap) or the engine went away, so a handler
never waits for an update that will not come.

Updates the handler has not taken yet are merged into one (text, token ids, logprobs, the
latest prefill progress; the last one's finish), so a client that reads slowly gets fewer,
larger pieces and its stream holds at most its output, however many ticks went by.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from tinyserve import protocol
from tinyserve.logs import fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finish:
    """How a request ended. ``engine_down``: the engine died or restarted under it."""

    reason: str
    detail: str = ""
    prompt_tokens: int = 0
    timeline: dict[str, Any] | None = None
    engine_down: bool = False
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


@dataclass(frozen=True)
class Piece:
    """One step of a request's output: decoded text, how many tokens made it, maybe the end.
    ``token_ids`` and ``logprobs`` are the engine's, one logprobs entry per token when asked."""

    text: str
    tokens: int = 0
    finish: Finish | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[list[Any]] = field(default_factory=list)
    prompt_logprobs: list[list[Any]] = field(default_factory=list)  # when asked, in order
    # Prefill progress, the latest the engine reported: prompt tokens in its KV cells (0: no
    # news) and how many of them the prefix cache served.
    prompt_done: int = 0
    prompt_cached: int = 0


class RequestStream:
    """Updates of one request, checked for gaps and decoded incrementally as UTF-8."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.accepted = False
        self.engine_finished = False  # the engine sent this request's final update
        self._closed = False  # a Finish is queued: later updates are ignored
        self._next_seq = 0
        self._merged: _Merged | None = None  # updates delivered, not yet taken by pieces()
        self._failure: Finish | None = None  # a made-up end, after whatever is merged
        self._ready = asyncio.Event()  # something to take
        self.on_piece: Callable[[Piece], None] | None = None  # sees each piece as it is taken
        self._acknowledged = asyncio.Event()
        self._early_finish: Finish | None = None
        # "replace": a token whose bytes are not UTF-8 at all becomes U+FFFD, but a character
        # split across updates is held back until complete and comes out whole.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    @property
    def pending(self) -> bool:
        """Sent to the engine, neither accepted nor finished yet."""
        return not self._acknowledged.is_set()

    def deliver(self, update: protocol.RequestUpdate) -> None:
        """Queue one update from the engine; a sequence gap ends the stream with an error."""
        if self._closed:
            return
        if update.seq != self._next_seq:
            detail = f"lost engine output (update {self._next_seq} missing, got {update.seq})"
            log.error("sequence gap", extra=fields(request_id=self.request_id, detail=detail))
            self.fail(detail)
            return
        self._next_seq += 1
        # Accepted and finished may arrive in one update (a short request): accepted first.
        if update.token_ids or update.text or update.accepted:
            self.accepted = True
        if update.finish_reason is not None:
            self.engine_finished = self._closed = True
            if not self.accepted:
                self._early_finish = _finish_of(update)
        if self._merged is None:
            self._merged = _Merged()
        self._merged.add(update)
        self._ready.set()
        if self.accepted or self._closed:
            self._acknowledged.set()

    def fail(self, detail: str, *, engine_down: bool = False) -> None:
        """End the stream with an error that did not come from the engine's own output (the
        engine may still hold the request: ``engine_finished`` stays False)."""
        if self._closed:
            return
        self._closed = True
        finish = Finish(protocol.FINISH_ERROR, detail, engine_down=engine_down)
        if not self.accepted:
            self._early_finish = finish
        self._failure = finish
        self._ready.set()
        self._acknowledged.set()

    async def acknowledged(self) -> Finish | None:
        """Wait until the engine accepted the request or it ended; returns the ``Finish`` when it
        ended before being accepted (rejected, failed), so the reply can still be an HTTP error."""
        await self._acknowledged.wait()
        return self._early_finish

    @property
    def queued(self) -> int:
        """Pieces ready to be taken: never more than two (the merged output, a failure)."""
        return (self._merged is not None) + (self._failure is not None)

    async def pieces(self) -> AsyncIterator[Piece]:
        """Decoded output up to and including the one piece that carries the ``Finish``."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            merged, self._merged = self._merged, None
            if merged is not None:
                piece = merged.piece(self._decoder)
                if piece.finish is not None:
                    self._drop_partial_character()
                yield self._taken(piece)
                if piece.finish is not None:
                    return
            if self._failure is not None and self._merged is None:
                self._drop_partial_character()
                yield self._taken(Piece("", finish=self._failure))
                return

    def _taken(self, piece: Piece) -> Piece:
        if self.on_piece is not None:
            self.on_piece(piece)
        return piece

    def _drop_partial_character(self) -> None:
        # Output cut mid-character (max_tokens, cancel): dropping the incomplete tail beats
        # ending the text with U+FFFD.
        pending, _ = self._decoder.getstate()
        if pending:
            log.debug(
                "dropping incomplete UTF-8 tail",
                extra=fields(request_id=self.request_id, bytes=len(pending)),
            )
        self._decoder.reset()


class _Merged:
    """Consecutive updates of one request, folded into what one ``Piece`` carries."""

    def __init__(self) -> None:
        self.updates = 0
        self.text = bytearray()
        self.token_ids: list[int] = []
        self.logprobs: list[list[Any]] = []
        self.prompt_logprobs: list[list[Any]] = []
        self.prompt_done = self.prompt_cached = 0
        self.last: protocol.RequestUpdate | None = None

    def add(self, update: protocol.RequestUpdate) -> None:
        self.updates += 1
        self.text += update.text
        self.token_ids += update.token_ids
        self.logprobs += update.logprobs
        self.prompt_logprobs += update.prompt_logprobs
        if update.prompt_done:
            self.prompt_done, self.prompt_cached = update.prompt_done, update.cached_tokens
        self.last = update

    def piece(self, decoder: codecs.IncrementalDecoder) -> Piece:
        assert self.last is not None
        finish = _finish_of(self.last) if self.last.finish_reason is not None else None
        text = decoder.decode(bytes(self.text))
        return Piece(
            text,
            len(self.token_ids),
            finish,
            self.token_ids,
            self.logprobs,
            self.prompt_logprobs,
            self.prompt_done,
            self.prompt_cached,
        )


def _finish_of(update: protocol.RequestUpdate) -> Finish:
    assert update.finish_reason is not None
    return Finish(
        update.finish_reason,
        update.detail,
        update.prompt_tokens,
        update.timeline,
        cached_tokens=update.cached_tokens,
    )
