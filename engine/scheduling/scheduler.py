"""The scheduler: who waits, who gets a slot, what goes in the batch, and when a request ends.

Every decision of the engine is made here, on plain state: acceptance and rejection, the
policy's queue, expiry (deadlines and timeouts), slot grants (with ``KvSpace`` choosing the
slot and what it reuses), the tick's plan (decode rows first, one per running sequence in slot
order, then prompt pieces of one length within the token budget), and after the decode what
each row's results mean: the end of a prompt, a stop string, ``max_tokens``, an
end-of-generation token.

Each step of serving one request runs under ``serving``: whatever it raises ends that request
alone with ``finish_reason: "error"``; the engine goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tinyserve import capacity
from tinyserve.config import Config
from tinyserve.engine.kv import forks
from tinyserve.engine.kv.kv_space import KvSpace
from tinyserve.engine.model.runner import Computed, Outcome, Row, Runner, Sampled
from tinyserve.engine.output.drafts import TickDrafts
from tinyserve.engine.output.report import Cause, Ended, Grant, Rejected
from tinyserve.engine.request import prompt_logprobs
from tinyserve.engine.request.sequence import Sequence, SequenceStatus
from tinyserve.engine.request.timeline import RecentTimelines, Timeline
from tinyserve.engine.scheduling import pieces
from tinyserve.engine.scheduling.deadline import overdue
from tinyserve.engine.scheduling.drain import DrainRate
from tinyserve.engine.scheduling.policies import Policy, make_policy
from tinyserve.engine.speculation.draft_model import DraftModel
from tinyserve.engine.speculation.guessing import Guessing
from tinyserve.errors import EngineFatalError, RequestError
from tinyserve.logs import fields
from tinyserve.protocol import (
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_REJECTED,
    FINISH_STOP,
    REJECT_DRAINING,
    REJECT_QUEUE_FULL,
    REJECT_TOO_LONG,
    Submit,
)

log = logging.getLogger(__name__)


class Scheduler:
    """All scheduling state of one engine. Single-threaded: only the engine loop calls it."""

    def __init__(
        self,
        config: Config,
        kv: KvSpace,
        runner: Runner,
        n_ctx: int,
        clock: Callable[[], int],
        draft_model: DraftModel | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.runner = runner
        self.n_ctx = n_ctx  # what one request may fill: a slot's cells
        self.clock = clock
        self.policy: Policy = make_policy(
            config.policy, config.tenant_weight_map, config.srpt_aging
        )
        self.slots: list[Sequence | None] = [None] * config.slots
        self.running: list[Sequence] = []  # in slot-grant order: earlier prefills go first
        self.by_id: dict[str, Sequence] = {}
        self.drafts = TickDrafts()
        self.recent = RecentTimelines(config.timeline_keep)
        self.drain = DrainRate(config.chunk, config.slots)
        self.guessing = Guessing(
            config.speculate, config.speculate_tokens, n_ctx, runner.time_rows, draft_model
        )
        self.draining = False
        self.tick = 0
        self._arrivals = 0
        self._grants = 0  # slot grants so far: "admitted ahead of it" in timelines

    # -- requests come and go ---------------------------------------------------------------

    def submit(self, request: Submit, now: int) -> None:
        """Accept ``request`` into the policy's queue, or reject it at once."""
        if request.request_id in self.by_id:
            log.warning("duplicate request id ignored", extra=fields(id=request.request_id))
            return
        reason = self._rejection(request)
        if reason:
            timeline = self.end_unaccepted(request, FINISH_REJECTED, reason)
            self.drafts.rejected(Rejected(reason, timeline))
            return
        seq = Sequence(request, policy_name=self.policy.name)
        self.by_id[request.request_id] = seq  # from here a failure ends it like any request
        with self.serving(seq, "accepting it"):
            forks.follow(seq, self.by_id)
            seq.cache_hint = self.kv.hint(request.prompt_ids)
            self._arrivals += 1
            seq.order = self._arrivals
            seq.timeline.accept(self.tick, now, self._grants, len(self.running), len(self.policy))
            self.policy.add(seq)
            seq.status = SequenceStatus.WAITING
            self.drafts.accepted(request)

    def _rejection(self, request: Submit) -> str:
        if not capacity.fits_context(len(request.prompt_ids), request.max_tokens, self.n_ctx):
            return REJECT_TOO_LONG
        if self.draining:
            return REJECT_DRAINING
        if capacity.queue_full(len(self.policy), self.slots.count(None), self.config.max_queue):
            return REJECT_QUEUE_FULL
        return ""

    def end_unaccepted(self, request: Submit, reason: str, detail: str) -> Timeline:
        """End a request the engine never accepted: its final update, and its timeline."""
        timeline = Timeline(request, self.policy.name)
        timeline.end(reason, detail, self.tick, self.clock(), 0)
        self.drafts.finish(request, reason, detail, timeline=self._record(timeline))
        return timeline

    def cancel(self, seq: Sequence, reason: str, detail: str, cause: Cause) -> None:
        self.finish(seq, reason, detail, cause)

    # -- one tick: schedule ------------------------------------------------------------------

    def schedule(self, now: int) -> list[Row]:
        """Expire what is due, give free slots to waiting requests, plan the batch."""
        self.drain.step(now, bool(self.running))
        self._expire(now)
        self._admit(now)
        return self._plan()

    def _expire(self, now: int) -> None:
        queue_s, total_s = self.config.queue_timeout, self.config.request_timeout
        for seq in list(self.by_id.values()):
            due = overdue(seq, now, queue_s, total_s)
            if due is not None:
                self.finish(seq, due[0], cause=due[1])

    def _admit(self, now: int) -> None:
        """Give free slots to waiting requests, in the order the policy chooses."""
        while free := [slot for slot, holder in enumerate(self.slots) if holder is None]:
            seq = self.policy.pop_next()
            if seq is None:
                return
            # out of the queue from here (the policy counts it as running): a failure
            # before it holds its slot ends a request without one.
            seq.status = SequenceStatus.PREFILL
            with self.serving(seq, "granting it a slot"):
                self._grant(seq, free, now)

    def _grant(self, seq: Sequence, free: list[int], now: int) -> None:
        reuse = self.kv.grant(seq, free)
        # slot state first, so that a failure below frees exactly this slot.
        seq.slot, seq.n_past = reuse.slot, reuse.tokens
        self.slots[reuse.slot] = seq
        self.running.append(seq)
        rule = self.policy.rule(seq)
        seq.timeline.grant(self.tick + 1, now, reuse.slot, rule, self._grants)
        seq.timeline.reused(reuse.tokens, reuse.tier, reuse.ns)
        self._grants += 1
        request, wait_s = seq.request, (seq.timeline.wait_ms() or 0.0) / 1e3
        kind = self.policy.rule_kind
        self.drafts.granted(Grant(seq.request_id, kind, request.tenant, request.priority, wait_s))
        self.runner.start(seq)
        forks.on_grant(seq, self.kv.runtime)
        seq.timeline.log_grant(waiting=len(self.policy))

    def _plan(self) -> list[Row]:
        """Every decoding sequence's token first, then prompt pieces within the token budget
        (in grant order, all of the first one's length: ``pieces``), then, in a tick with no
        prompt piece, guesses in what budget is left; the rows go to llama.cpp in slot order,
        since it decodes rows of consecutive sequence ids in one pass and splits the batch
        wherever the order breaks."""
        decoding = [seq for seq in self.running if seq.status is SequenceStatus.DECODE]
        plan: list[Row] = []
        budget = min(self.config.max_batch_tokens, self.kv.runtime.batch.capacity)
        room = budget - self.config.slots  # what a piece always fits beside (defers)
        used, length = len(decoding), 0  # rows so far; the length of the tick's pieces
        for seq in self.running:
            piece = pieces.next_piece(seq.prefill_left, self.config.chunk)
            n = min(piece, budget - used)
            if n <= 0 or (length and n != length) or prompt_logprobs.defers(seq, n, piece, room):
                continue
            last = seq.n_past + n == seq.prompt_len
            plan.append(Row(seq, n, last and seq.request.max_tokens > 0))
            used, length = used + n, n
        # A guess's rows would take as many of a piece's into a ubatch below a tile.
        guesses = {} if length else self.guessing.guesses(decoding, budget - used)
        for seq in decoding:
            guess = guesses.get(seq.slot, ())
            plan.append(Row(seq, 1 + len(guess), True, guess))
        return sorted(plan, key=lambda row: row.seq.slot)

    # -- one tick: after the decode ----------------------------------------------------------

    def postprocess(self, outcome: Outcome, now: int) -> None:
        """What the decode's results mean for each request in the batch."""
        self.tick += 1
        batch = outcome.batch
        decode_only = outcome.status == 0 and batch.tokens > 0 and not batch.prefill_tokens
        self.guessing.tick_ended(decode_only, batch.tokens, now)
        if outcome.status != 0:  # the batch's KV state is undefined: fail just these requests
            log.error("llama_decode failed", extra=fields(status=outcome.status))
            for item in outcome.computed:
                self.finish(item.row.seq, FINISH_ERROR, f"llama_decode returned {outcome.status}")
            return
        size = outcome.batch.requests
        for item in outcome.computed:
            with self.serving(item.row.seq, "taking its decoded rows"):
                if item.error is not None:
                    raise item.error
                self._advance(item, size, now, outcome.batch.decode_s)

    def _advance(self, item: Computed, batch_size: int, now: int, decode_s: float) -> None:
        seq, n = item.row.seq, item.row.n_tokens
        if item.prompt_logprobs is not None:
            self.drafts.prompt_logprobs(seq.request, item.prompt_logprobs)
        self.policy.charge(seq, n)
        if item.row.guess:
            self._take_guessed(item, batch_size, now)
            return
        seq.n_past += n
        if seq.status is SequenceStatus.DECODE:
            seq.timeline.decode_tick(self.tick, batch_size, now)
        else:
            seq.timeline.prefill_chunk(self.tick, n, now, int(decode_s * 1e9))
            self.drafts.progress(seq.request, seq.n_past, seq.timeline.prefix_tokens)
            if seq.n_past == seq.prompt_len and seq.request.max_tokens == 0:
                self.finish(seq, FINISH_LENGTH)  # the prompt's logprobs alone (echo)
                return
        if item.sampled is None:
            return
        if seq.status is SequenceStatus.PREFILL:
            seq.status = SequenceStatus.DECODE
            seq.timeline.first_token(now)
            self._fork(seq, item.logits_row, now)
            self.guessing.start(seq)
        self._take(seq, item.sampled)

    def _take_guessed(self, item: Computed, batch_size: int, now: int) -> None:
        """A decode row with guesses: its token and each confirmed guess's follower, in order,
        for as long as the request goes on; the cells of guesses not confirmed are dropped."""
        seq, guessed, confirmed = item.row.seq, len(item.row.guess), len(item.confirmed)
        assert seq.spec is not None and item.sampled is not None
        seq.spec.took(guessed, confirmed)
        seq.timeline.decode_tick(self.tick, batch_size, now)
        seq.timeline.guessed(self.tick, guessed, confirmed)
        self.drafts.guessed(guessed, confirmed)
        # The cells hold its last token, then the guesses: those up to the first wrong one
        # are now its tokens.
        self.kv.runtime.forget(seq.slot, seq.n_past + 1 + confirmed)
        for sampled in [item.sampled, *item.confirmed]:
            seq.n_past += 1
            self._take(seq, sampled)
            if seq.status is SequenceStatus.FINISHED:
                return

    def _fork(self, leader: Sequence, logits_row: int, now: int) -> None:
        """``leader``'s prompt is in: the choices waiting on it copy it and sample its row."""
        for follower in forks.waiting(leader):
            with self.serving(follower, "copying its prompt from the choice that prefilled it"):
                forks.fork(leader, follower, self.kv.runtime)
                follower.status = SequenceStatus.DECODE
                follower.timeline.first_token(now)
                self._take(follower, self.runner.sample(follower, logits_row))

    def _take(self, seq: Sequence, sampled: Sampled) -> None:
        """``seq`` generated ``sampled``: report it, and end the request where it should."""
        seq.last_token = sampled.token
        seq.output_ids.append(sampled.token)
        if seq.spec is not None:
            seq.spec.heard([sampled.token])
        text = seq.stops.feed(sampled.text) if sampled.text else b""
        self.drafts.token(seq.request, sampled.token, text, sampled.logprobs)
        if sampled.end or seq.stops.stopped:
            self.finish(seq, FINISH_STOP)
        elif seq.generated >= seq.request.max_tokens:
            self.finish(seq, FINISH_LENGTH)

    # -- the end of a request ----------------------------------------------------------------

    def finish(
        self, seq: Sequence, reason: str, detail: str = "", cause: Cause = Cause.NONE
    ) -> None:
        """End ``seq``: free its slot, then report. Only a broken invariant of the engine
        (the policy's state) raises here; a failing prefix cache does not."""
        if seq.status is not SequenceStatus.NEW:
            self.policy.remove(seq)
        forks.unfollow(seq)
        forks.release(seq)
        if seq.slot >= 0:
            self.runner.stop(seq)
            self.kv.finish(seq, served=reason != FINISH_ERROR)
            self.slots[seq.slot] = None
            self.running.remove(seq)
        seq.status = SequenceStatus.FINISHED
        del self.by_id[seq.request_id]
        seq.timeline.end(reason, detail, self.tick, self.clock(), seq.generated)
        timeline = self._record(seq.timeline)
        self.drafts.text(seq.request, seq.stops.flush())
        # Cached tokens are the ones its slot reused; a request that never got one reused none.
        cached = seq.timeline.prefix_tokens
        matched = seq.stops.matched or ""
        self.drafts.finish(seq.request, reason, detail, cached, timeline, matched)
        self.drafts.ended(Ended(reason, cause, seq.prompt_len, cached, seq.timeline))
        self.drain.finished()

    def _record(self, timeline: Timeline) -> dict[str, object]:
        """Keep a finished request's timeline for queries; returns it as the API shows it."""
        as_dict = timeline.to_dict()
        self.recent.add(timeline.request.request_id, as_dict)
        return as_dict

    @contextmanager
    def serving(self, seq: Sequence, step: str) -> Iterator[None]:
        """One step of serving ``seq`` (``step`` says which, for the log). Whatever goes wrong
        in it ends ``seq`` alone, with an error; the engine goes on."""
        try:
            yield
        except EngineFatalError:
            raise
        except Exception as exc:
            if seq.status is SequenceStatus.FINISHED:
                raise  # finishing it failed: an invariant of the whole engine is broken
            self.finish(seq, FINISH_ERROR, _log_failure(seq, step, exc))


def _log_failure(seq: Sequence, step: str, exc: Exception) -> str:
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
