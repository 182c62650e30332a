"""The engine's logic, free of sockets: accept, schedule, batch, decode, sample, report.

``EngineCore.step`` is one tick and reads as its steps; it returns one ``TickReport`` (plain
values: updates, slot grants, finishes, rejections, the batch, the load). Tests drive it
in-process with the real model; ``proc.py`` wraps it with ZeroMQ, the board, metrics and
spans, all derived from the report: the core calls no transport, tracing or metrics code.
The KV side of each step (blocks, the prefix cache, the cells a slot keeps) is ``KvSpace``'s
(``kv_space.py``).

Failures come in two tiers. Each per-request step (accept, slot grant, batch row, sampling)
runs under ``_serving``: whatever goes wrong in it ends that request alone with
``finish_reason: "error"``. A failure of the prefix cache also resets the cache, whose state
may then be inconsistent (``KvSpace.call``). Anything else that escapes ``step`` or
``submit`` means the engine itself is broken; ``proc.py`` ends the process.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from tinyserve import capacity
from tinyserve.config import Config
from tinyserve.engine import forks, prompt_logprobs
from tinyserve.engine.deadline import due_ns
from tinyserve.engine.drafts import TickDrafts
from tinyserve.engine.drain import DrainRate
from tinyserve.engine.kv_space import KvSpace
from tinyserve.engine.policies import Policy, make_policy
from tinyserve.engine.prefix_cache import PrefixCache
from tinyserve.engine.report import Batch, Cause, Finish, Grant, Load, Rejection, TickReport
from tinyserve.engine.resident import SlotPrefixes
from tinyserve.engine.runtime import LlamaRuntime
from tinyserve.engine.sampler import Sampler
from tinyserve.engine.sequence import Sequence, Status
from tinyserve.engine.timeline import RecentTimelines, Timeline
from tinyserve.errors import EngineFatalError, RequestError
from tinyserve.logs import fields
from tinyserve.protocol import (
    FINISH_CANCELLED,
    FINISH_DEADLINE_MISSED,
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_QUEUE_TIMEOUT,
    FINISH_REJECTED,
    FINISH_STOP,
    FINISH_TIMEOUT,
    REJECT_DRAINING,
    REJECT_KV_CACHE_FULL,
    REJECT_QUEUE_FULL,
    REJECT_TOO_LONG,
    RequestUpdate,
    Submit,
)
from tinyserve_native.kv_blocks import BlockAccountant

log = logging.getLogger(__name__)

QUEUED = (Status.WAITING, Status.BLOCKED)  # accepted, no slot yet: what --queue-timeout bounds


@dataclass(frozen=True)
class BatchRow:
    """One sequence's share of a tick's batch: ``n_tokens`` rows ending at ``last_row``, the
    next token sampled from ``row`` (-1: none yet)."""

    seq: Sequence
    n_tokens: int
    row: int
    last_row: int = -1


class EngineCore:
    """All scheduling state of one engine. Single-threaded: only the engine loop calls it."""

    def __init__(
        self,
        config: Config,
        runtime: LlamaRuntime,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.clock = clock
        self.n_ctx = runtime.n_ctx_seq  # what one request may fill
        runtime.clear()  # NOTE: all KV state must be ours: the accounting starts from empty
        self.kv = KvSpace(config, runtime, lambda: self.by_id.values(), self._fail)
        self.policy: Policy = make_policy(
            config.policy, config.tenant_weight_map, config.srpt_aging
        )
        self.slots: list[Sequence | None] = [None] * config.slots
        self.running: list[Sequence] = []  # in slot-grant order: earlier prefills go first
        self.samplers: dict[int, Sampler] = {}  # by slot
        self.by_id: dict[str, Sequence] = {}
        self.blocked: deque[Sequence] = deque()  # accepted, waiting for KV blocks, in order
        self.drafts = TickDrafts()
        self.tick = 0
        self.draining = False
        self._arrivals = 0
        self._grants = 0  # slot grants so far: "admitted ahead of it" in timelines
        self.recent = RecentTimelines(config.timeline_keep)
        self.drain = DrainRate(config.chunk, config.slots)
        self._batch: Batch | None = None  # decoded this tick

    @property
    def blocks(self) -> BlockAccountant:
        return self.kv.blocks

    @property
    def cache(self) -> PrefixCache | None:
        return self.kv.cache

    @property
    def resident(self) -> SlotPrefixes | None:
        return self.kv.resident

    # -- inputs between ticks ---------------------------------------------------------------

    def submit(self, request: Submit) -> None:
        """Accept ``request`` (reserving its worst-case KV blocks, or queueing it until they
        free up) or reject it at once."""
        if request.request_id in self.by_id:
            log.warning("duplicate request id ignored", extra=fields(id=request.request_id))
            return
        reason = self._rejection(request)
        if reason:
            self._reject(request, reason)
            return
        seq = Sequence(request, [], 0, status=Status.NEW, policy_name=self.policy.name)
        self.by_id[request.request_id] = seq  # from here a failure ends it like any request
        now = self.clock()
        with self._serving(seq, "accepting it"):
            # First come, first served for blocks: nobody passes a request that waits for them.
            if self.blocked or not self._reserve(seq, now):
                seq.status, seq.blocked_ns = Status.BLOCKED, now
                self.blocked.append(seq)
            self.drafts.accepted(request)

    def _reserve(self, seq: Sequence, now: int) -> bool:
        """Reserve ``seq``'s blocks and queue it for a slot (accepted at ``now``); False
        (holding nothing) when the free and evictable blocks are not enough now."""
        own = self.kv.reserve(seq, forks.leader_of(seq, self.by_id))
        if own is None:
            return False
        self._arrivals += 1
        seq.order = self._arrivals
        waiting = len(self.policy)
        kv_wait = now - seq.blocked_ns if seq.status is Status.BLOCKED else 0
        seq.timeline.accept(self.tick, now, own, self._grants, len(self.running), waiting, kv_wait)
        self.policy.add(seq)
        seq.status = Status.WAITING
        return True

    def _unblock(self, now: int) -> None:
        """Requests waiting for KV blocks get them in arrival order, while there is room."""
        while self.blocked:
            seq = self.blocked[0]
            with self._serving(seq, "reserving its blocks"):
                if not self._reserve(seq, now):
                    return
            if self.blocked and self.blocked[0] is seq:  # reserved, or ended by a failure
                self.blocked.popleft()

    def _rejection(self, request: Submit) -> str:
        prompt, max_tokens = len(request.prompt_ids), request.max_tokens
        block_size, total = self.config.block_size, self.blocks.total
        if not capacity.fits_context(prompt, max_tokens, self.n_ctx, block_size, total):
            return REJECT_TOO_LONG
        if self.draining:
            return REJECT_DRAINING
        waiting = len(self.policy) + len(self.blocked)
        need = self.blocks.blocks_for(prompt + max_tokens)
        short = bool(self.blocked) or need > self.blocks.available
        if capacity.queue_full(waiting, self.slots.count(None), self.config.max_queue, short):
            return REJECT_KV_CACHE_FULL if short else REJECT_QUEUE_FULL
        return ""

    def _reject(self, request: Submit, reason: str) -> None:
        timeline = self._end_unaccepted(request, FINISH_REJECTED, reason)
        self.drafts.rejected(Rejection(reason, timeline))

    def refuse(self, request: Submit, fault: str) -> None:
        """A request the engine will not run as sent (``proc.submit_fault``: our frontends
        check first, so a bug or a foreign sender): it ends at once with an error finish
        naming the fault, so whoever waits for it is answered instead of timing out."""
        self._end_unaccepted(request, FINISH_ERROR, fault)

    def _end_unaccepted(self, request: Submit, reason: str, detail: str) -> Timeline:
        """End a request the engine never accepted: its final update, and its timeline."""
        timeline = Timeline(request, self.policy.name)
        timeline.end(reason, detail, self.tick, self.clock(), 0)
        self.drafts.finish(request, reason, detail, timeline=self._record(timeline))
        return timeline

    def cancel(
        self,
        request_id: str,
        reason: str = FINISH_CANCELLED,
        detail: str = "",
        cause: Cause = Cause.CLIENT,
    ) -> bool:
        """End a waiting or running request now; unknown ids (already finished) are ignored."""
        seq = self.by_id.get(request_id)
        if seq is None:
            return False
        self._finish(seq, reason, detail, cause)
        return True

    def cancel_frontend(self, frontend_id: str) -> int:
        """End every request of a frontend that went away; returns how many."""
        gone = [s for s in self.by_id.values() if s.request.frontend_id == frontend_id]
        for seq in gone:
            self._finish(seq, FINISH_CANCELLED, "frontend gone", Cause.FRONTEND_GONE)
        return len(gone)

    # -- one tick ----------------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self.by_id)

    def queued(self) -> Iterator[Sequence]:
        """Accepted requests without a slot: the policy's queue, then those short of blocks."""
        yield from self.policy
        yield from self.blocked

    def step(self) -> TickReport:
        """One tick: expire, admit, build one batch, decode it, sample, report."""
        now = self.clock()
        self.drain.step(now, bool(self.running))
        self._batch = None
        self._expire(now)
        # One stamp for the tick's acceptances and grants: a slot is never granted before
        # its request was accepted.
        self._unblock(now)
        self._admit(now)
        batch = self._build_batch()
        if batch:
            self.tick += 1
            if self._decode(batch):
                self._sample(batch, self.clock())
        return self.report()

    def report(self) -> TickReport:
        """What happened since the last report (nothing on an idle pass) and the load now."""
        batch, self._batch = self._batch, None
        return self.drafts.flush(self.load(), batch, self.kv.stats())

    def _expire(self, now: int) -> None:
        queue_ns = int(self.config.queue_timeout * 1e9)
        total_ns = int(self.config.request_timeout * 1e9)
        for seq in list(self.by_id.values()):
            age = now - seq.request.arrival_ns
            due = due_ns(seq.request)
            if due is not None and now > due:
                self._finish(seq, FINISH_DEADLINE_MISSED, cause=Cause.DEADLINE)
            elif queue_ns and seq.status in QUEUED and age > queue_ns:
                self._finish(seq, FINISH_QUEUE_TIMEOUT, cause=Cause.QUEUE_TIMEOUT)
            elif total_ns and age > total_ns:
                self._finish(seq, FINISH_TIMEOUT, cause=Cause.REQUEST_TIMEOUT)

    def _admit(self, now: int) -> None:
        """Give free slots to waiting requests, in the order the policy chooses."""
        while free := [slot for slot, holder in enumerate(self.slots) if holder is None]:
            seq = self.policy.pop_next()
            if seq is None:
                return
            with self._serving(seq, "granting it a slot"):
                slot, reused = self.kv.choose_slot(seq, free)
                self._grant(seq, slot, now, reused)

    def _grant(self, seq: Sequence, slot: int, now: int, reused: int = 0) -> None:
        """``seq`` takes ``slot``; with ``--kv-layout slots``, reusing the first ``reused``
        tokens the slot's cells hold."""
        # NOTE: slot state first, so that a failure below frees exactly this slot.
        seq.status, seq.slot = Status.PREFILL, slot
        self.slots[slot] = seq
        self.running.append(seq)
        rule = self.policy.rule(seq)
        seq.timeline.grant(self.tick + 1, now, slot, rule, self._grants)
        self._grants += 1
        request, accepted = seq.request, seq.timeline.accepted
        wait_s = (seq.timeline.wait_ms() or 0.0) / 1e3
        kv_wait_s = accepted.kv_wait_ns / 1e9 if accepted is not None else 0.0
        grant = Grant(
            seq.request_id,
            self.policy.rule_kind,
            request.tenant,
            request.priority,
            wait_s,
            kv_wait_s,
        )
        self.drafts.granted(grant)
        self.samplers[slot] = sampler = self.runtime.new_sampler(request.sampling)
        seq.timeline.grammar = sampler.grammar
        self.kv.attach(seq, slot, reused)
        forks.on_grant(seq, self.runtime)
        if log.isEnabledFor(logging.DEBUG):
            self._log_grant(seq, rule)

    def _log_grant(self, seq: Sequence, rule: str) -> None:
        assert seq.timeline.slot is not None
        log.debug(
            "slot granted",
            extra=fields(
                request_id=seq.request_id,
                slot=seq.slot,
                policy=self.policy.name,
                rule=rule,
                ahead=seq.timeline.slot.ahead,
                waited_ms=seq.timeline.wait_ms(),
                waiting=len(self.policy),
            ),
        )

    def _build_batch(self) -> list[BatchRow]:
        """Decode rows first (one token each), then prefill chunks within the token budget."""
        builder = self.runtime.batch
        builder.clear()
        rows: list[BatchRow] = []
        # NOTE: a row is the last thing a step adds, so a request that fails has none. In slot
        # order: with a KV stream per slot, llama.cpp decodes in one pass only rows of
        # consecutive sequence ids, and splits the batch at every other step.
        decoding = [s for s in self.running if s.status is Status.DECODE]
        for seq in sorted(decoding, key=attrgetter("slot")):
            with self._serving(seq, "adding its token to the batch"):
                rows.append(
                    BatchRow(seq, 1, builder.add(seq.last_token, seq.n_past, seq.slot, True))
                )
        for seq in [s for s in self.running if s.prefill_left]:
            with self._serving(seq, "adding its prompt to the batch"):
                row = self._prefill_row(seq)
                if row is not None:
                    rows.append(row)
        return rows

    def _prefill_row(self, seq: Sequence) -> BatchRow | None:
        """The next chunk of ``seq``'s prompt, as much as the tick's token budget leaves."""
        builder = self.runtime.batch
        budget = min(self.config.max_batch_tokens, builder.capacity) - builder.n_tokens
        n = min(seq.prefill_left, self.config.chunk, budget)
        room = min(self.config.max_batch_tokens, builder.capacity) - self.config.slots
        if n <= 0 or prompt_logprobs.defers(seq, n, self.config.chunk, room):
            return None
        last = seq.n_past + n == seq.prompt_len
        every = prompt_logprobs.wanted(seq)
        prompt = seq.request.prompt_ids
        row = builder.add_span(prompt, seq.n_past, n, seq.n_past, seq.slot, last, every)
        return BatchRow(seq, n, row if last else -1, row)

    def _decode(self, batch: list[BatchRow]) -> bool:
        started = time.perf_counter()
        status = self.runtime.decode()
        elapsed = time.perf_counter() - started
        tokens = sum(r.n_tokens for r in batch)
        decode_tokens = sum(1 for r in batch if r.seq.status is Status.DECODE)
        self._batch = Batch(len(batch), tokens, tokens - decode_tokens, decode_tokens, elapsed)
        if status == 0:
            return True
        # A failed decode leaves the batch's KV state undefined: fail just these requests.
        log.error("llama_decode failed", extra=fields(status=status, rows=len(batch)))
        for item in batch:
            self._finish(item.seq, FINISH_ERROR, f"llama_decode returned {status}")
        return False

    def _sample(self, batch: list[BatchRow], now: int) -> None:
        for item in batch:
            with self._serving(item.seq, "sampling its next token"):
                self._advance(item, len(batch), now)

    def _advance(self, item: BatchRow, batch_size: int, now: int) -> None:
        """Account for the rows ``item`` had decoded; take its next token if it has logits."""
        seq = item.seq
        if seq.status is Status.PREFILL and prompt_logprobs.wanted(seq):
            entries = prompt_logprobs.chunk_entries(self.runtime, seq, item.last_row, item.n_tokens)
            self.drafts.prompt_logprobs(seq.request, entries)
        seq.n_past += item.n_tokens
        self.policy.charge(seq, item.n_tokens)
        if seq.status is Status.PREFILL:
            decode_ns = int(self._batch.decode_s * 1e9) if self._batch else 0
            seq.timeline.prefill_chunk(self.tick, item.n_tokens, now, decode_ns)
        else:
            seq.timeline.decode_tick(self.tick, batch_size, now)
        if item.row < 0:
            return
        if seq.status is Status.PREFILL:
            seq.status = Status.DECODE
            seq.timeline.first_token(now)
            self._fork(seq, item.row, now)
        self._accept_token(seq, item.row)

    def _fork(self, leader: Sequence, row: int, now: int) -> None:
        """``leader``'s prompt is in: the choices waiting on it copy it and sample from ``row``."""
        for follower in forks.waiting(leader):
            with self._serving(follower, "copying its prompt from the choice that prefilled it"):
                forks.fork(leader, follower, self.runtime)
                follower.status = Status.DECODE
                follower.timeline.first_token(now)
                self._accept_token(follower, row)

    def _accept_token(self, seq: Sequence, row: int) -> None:
        if seq.request.max_tokens == 0:  # echo of the prompt alone (its logprobs are sent)
            self._finish(seq, FINISH_LENGTH)
            return
        token = self.samplers[seq.slot].sample(self.runtime.ctx, row)
        seq.generated += 1
        seq.last_token = token
        seq.output_ids.append(token)
        top_n = seq.request.sampling.logprobs
        logprobs = self.runtime.logprobs(row, token, top_n) if top_n >= 0 else None
        # An end-of-generation token is generated like any other (counted, with its logprob:
        # scoring a continuation by echo needs that entry) but adds no text, as in vLLM and
        # llama-server.
        end = self.runtime.is_eog(token)
        text = b"" if end else seq.stops.feed(self.runtime.piece(token))
        self.drafts.token(seq.request, token, text, logprobs)
        if end or seq.stops.stopped:
            self._finish(seq, FINISH_STOP)
        elif seq.generated >= seq.request.max_tokens:
            self._finish(seq, FINISH_LENGTH)

    def _finish(
        self, seq: Sequence, reason: str, detail: str = "", cause: Cause = Cause.NONE
    ) -> None:
        """End ``seq``: free its slot and blocks, then report. Only a broken invariant of the
        engine (block accounting, policy state) raises here; a failing prefix cache does not."""
        if seq.status is Status.BLOCKED:
            self.blocked.remove(seq)
        elif seq.status is not Status.NEW:
            self.policy.remove(seq)
        forks.unfollow(seq)
        forks.release(seq)
        had_slot = seq.status in (Status.PREFILL, Status.DECODE)
        seq.status = Status.FINISHED
        if had_slot:
            # NOTE: after a failure (a failed decode included) the KV content may be wrong:
            # neither cached nor kept.
            self.kv.park(seq, reason)
            self._free_slot(seq, keep=reason != FINISH_ERROR)
        self.kv.release(seq, had_slot)
        del self.by_id[seq.request_id]
        now = self.clock()
        seq.timeline.end(reason, detail, self.tick, now, seq.generated)
        timeline = self._record(seq.timeline)
        self.drafts.text(seq.request, seq.stops.flush())
        # Cached tokens are the ones a slot reused; a request that never got one reused none.
        cached = seq.timeline.prefix_tokens
        self.drafts.finish(seq.request, reason, detail, cached, timeline)
        self.drafts.finished(Finish(reason, cause, seq.prompt_len, cached, seq.timeline))
        self.drain.finished()

    def _record(self, timeline: Timeline) -> dict[str, Any]:
        """Keep a finished request's timeline for queries; returns it as the API shows it."""
        as_dict = timeline.to_dict()
        self.recent.add(timeline.request.request_id, as_dict)
        return as_dict

    def _free_slot(self, seq: Sequence, keep: bool) -> None:
        """``keep``: with ``--kv-layout slots``, the slot keeps the cells for the next grant."""
        sampler = self.samplers.pop(seq.slot, None)  # None when the grant failed before it
        if sampler is not None:
            sampler.free()
        self.kv.vacate(seq, keep)
        self.slots[seq.slot] = None
        self.running.remove(seq)

    # -- failures ----------------------------------------------------------------------------

    @contextmanager
    def _serving(self, seq: Sequence, step: str) -> Iterator[None]:
        """One step of serving ``seq`` (``step`` says which, for the log). Whatever goes wrong
        in it ends ``seq`` alone, with an error; the engine goes on."""
        try:
            yield
        except EngineFatalError:
            raise
        except Exception as exc:
            if seq.status is Status.FINISHED:
                raise  # finishing it failed: an invariant of the whole engine is broken
            self._finish(seq, FINISH_ERROR, self._log_failure(seq, step, exc))

    def _log_failure(self, seq: Sequence, step: str, exc: Exception) -> str:
        """One log line for a failed request; returns the detail its client gets."""
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        expected = isinstance(exc, RequestError) and cause is exc
        log.error(
            "request failed while %s; the engine goes on",
            step,
            exc_info=None if expected else cause,
            extra=fields(request_id=seq.request_id, error=f"{type(cause).__name__}: {cause}"),
        )
        return str(exc) if isinstance(exc, RequestError) else f"internal error while {step}"

    def _fail(self, seq: Sequence, detail: str) -> None:
        self._finish(seq, FINISH_ERROR, detail)

    def abandon(self, detail: str) -> dict[str, list[RequestUpdate]]:
        """The engine cannot go on: every request in flight ends with an error. Only the drafts
        are touched (the rest of the state may be what broke); pending updates go out too.
        Returns the updates per frontend (nothing else of the state is to be trusted)."""
        for seq in self.by_id.values():
            self.drafts.finish(seq.request, FINISH_ERROR, detail)
        return self.drafts.flush(_NO_LOAD, None, None).updates

    # -- reporting ---------------------------------------------------------------------------

    def timeline_of(self, request_id: str) -> dict[str, Any] | None:
        """A request's timeline: live while it runs, then kept for the recent ones."""
        seq = self.by_id.get(request_id)
        return seq.timeline.to_dict() if seq is not None else self.recent.get(request_id)

    def load(self) -> Load:
        """The load now: for the board and the gauges, taken once per pass."""
        blocks = self.blocks
        return Load(
            self.tick,
            len(self.policy) + len(self.blocked),
            len(self.running),
            blocks.total,
            blocks.used,
            blocks.cached,
            self.drain.rate(self.running),
        )


_NO_LOAD = Load(0, 0, 0, 0, 0, 0, 0.0)  # abandon's report: the state may be what broke
