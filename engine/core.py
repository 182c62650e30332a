"""The engine's logic, free of sockets: one tick is schedule -> run -> postprocess -> report.

The scheduler (``scheduler.py``) decides everything: who waits, who gets a slot, what goes in
the batch, what each result means. The runner (``runner.py``) writes the batch, decodes it and
samples, deciding nothing. ``KvSpace`` (``kv_space.py``) puts each request's KV where the
scheduler asks. The core sequences them and is the one surface ``proc.py`` talks to; what a
tick did comes back as one ``TickReport`` of plain values, from which ``proc.py`` derives the
wire messages, the board, the metrics and the spans.

Failures come in two tiers: whatever goes wrong while serving one request ends that request
(``Scheduler.serving``); anything else that escapes ``step`` or ``submit`` means the engine
itself is broken, and ``proc.py`` ends the process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from tinyserve.config import Config
from tinyserve.engine.embeddings.embedder import Embeddings, EmbedSpec
from tinyserve.engine.kv.host_cache import CacheStats
from tinyserve.engine.kv.kv_space import KvSpace
from tinyserve.engine.model.runner import Runner
from tinyserve.engine.output.report import Cause, Load, TickReport
from tinyserve.engine.request.sequence import Sequence
from tinyserve.engine.runtime.runtime import LlamaRuntime
from tinyserve.engine.scheduling.scheduler import Scheduler
from tinyserve.engine.speculation.draft_model import DraftModel
from tinyserve.protocol import FINISH_CANCELLED, FINISH_ERROR, Embed, Submit


class EngineCore:
    """One engine's scheduler, runner and KV space. Single-threaded: the engine loop's."""

    def __init__(
        self,
        config: Config,
        runtime: LlamaRuntime,
        clock: Callable[[], int] = time.monotonic_ns,
        draft: LlamaRuntime | None = None,
    ) -> None:
        """``draft``: the draft model's runtime (``--draft-model``), whose guesses then
        replace prompt lookup's."""
        runtime.clear()  # all KV state must be ours: the accounting starts from empty
        self.clock = clock
        self.runtime = runtime
        self.kv = KvSpace(config, runtime)
        self.runner = Runner(runtime)
        draft_model = DraftModel(draft, runtime) if draft is not None else None
        self.scheduler = Scheduler(
            config, self.kv, self.runner, runtime.n_ctx_seq, clock, draft_model
        )
        spec = EmbedSpec.from_config(config)
        self.embeddings = Embeddings(
            spec, runtime.model, runtime.n_vocab, config, self.scheduler.recent
        )

    @property
    def n_ctx(self) -> int:
        """The most one request may fill: prompt and output within one slot's cells."""
        return self.scheduler.n_ctx

    @property
    def cache_stats(self) -> CacheStats:
        return self.kv.stats

    # -- inputs between ticks -----------------------------------------------------------------

    def submit(self, request: Submit) -> None:
        """Accept ``request`` into the queue, or reject it at once."""
        self.scheduler.submit(request, self.clock())

    def embed(self, request: Embed) -> None:
        """Queue an embedding request, or end it at once (refused, or unfit to run)."""
        ended = self.embeddings.submit(request, self.draining, self.scheduler.tick, self.clock())
        if ended is not None:
            self.scheduler.drafts.embedded([ended])

    def refuse(self, request: Submit, fault: str) -> None:
        """A request the engine will not run as sent (``proc.submit_fault``): it ends at once
        with an error naming the fault, so whoever waits for it is answered."""
        self.scheduler.end_unaccepted(request, FINISH_ERROR, fault)

    def cancel(
        self,
        request_id: str,
        reason: str = FINISH_CANCELLED,
        detail: str = "",
        cause: Cause = Cause.CLIENT,
    ) -> bool:
        """End a waiting or running request now; unknown ids (already finished) are ignored."""
        seq = self.scheduler.by_id.get(request_id)
        if seq is None:
            ended = self.embeddings.cancel(request_id, reason, self.scheduler.tick, self.clock())
            if ended is not None:
                self.scheduler.drafts.embedded([ended])
            return ended is not None
        self.scheduler.cancel(seq, reason, detail, cause)
        return True

    def cancel_frontend(self, frontend_id: str) -> int:
        """End every request of a frontend that went away; returns how many."""
        gone = [s for s in self.scheduler.by_id.values() if s.request.frontend_id == frontend_id]
        for seq in gone:
            self.scheduler.cancel(seq, FINISH_CANCELLED, "frontend gone", Cause.FRONTEND_GONE)
        embeds = self.embeddings.cancel_frontend(
            frontend_id, FINISH_CANCELLED, self.scheduler.tick, self.clock()
        )
        self.scheduler.drafts.embedded(embeds)
        return len(gone) + len(embeds)

    def drain(self) -> None:
        """Refuse new requests from now on (``draining``); running ones go on."""
        self.scheduler.draining = True

    def end_all(self, detail: str) -> None:
        """The drain ran out of time: every request still here ends with an error."""
        for request_id in list(self.scheduler.by_id):
            self.cancel(request_id, FINISH_ERROR, detail, Cause.ENGINE)
        ended = self.embeddings.end_all(FINISH_ERROR, detail, self.scheduler.tick, self.clock())
        self.scheduler.drafts.embedded(ended)

    # -- one tick -----------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self.scheduler.draining

    def has_work(self) -> bool:
        return bool(self.scheduler.by_id or self.embeddings)

    def step(self) -> TickReport:
        """One tick: schedule, run the generation batch, make sense of its results, then the
        tick's embedding part when embeddings wait; report."""
        scheduler = self.scheduler
        plan = scheduler.schedule(self.clock())
        batch = None
        if plan:
            outcome = self.runner.run(plan)
            scheduler.postprocess(outcome, self.clock())
            batch = outcome.batch
        if self.embeddings:
            self._embed(bool(plan), batch.decode_s if batch is not None else 0.0)
        else:
            self.embeddings.share.idle()
        return scheduler.drafts.flush(self.load(), batch, self.kv.stats)

    def _embed(self, generated: bool, generation_s: float) -> None:
        """The tick's embedding part: as large as the engine's time shared with generation
        allows (``EmbedShare``); none on ticks where embeddings have had their share."""
        scheduler, share = self.scheduler, self.embeddings.share
        generating = generated or bool(scheduler.by_id)
        room = share.room(generating)
        part = None
        if room:
            if not generated:
                scheduler.tick += 1  # a tick of embeddings alone is a tick too
            ended, part = self.embeddings.step(room, scheduler.tick, self.clock())
            scheduler.drafts.embedded(ended, part)
            if part is not None:
                scheduler.guessing.other_work()
        spent_ns, tokens = (int(part.seconds * 1e9), part.tokens) if part else (0, 0)
        share.ran(generating, int(generation_s * 1e9), spent_ns, tokens)

    def report(self) -> TickReport:
        """What happened since the last report (requests refused or cancelled between ticks)
        and the load now: an idle pass's report."""
        return self.scheduler.drafts.flush(self.load(), None, self.kv.stats)

    def pending(self) -> bool:
        """Whether updates wait to go out though no tick ran."""
        return bool(self.scheduler.drafts)

    def abandon(self, detail: str) -> TickReport:
        """The engine cannot go on: every request in flight ends with an error. Only the drafts
        are touched (the rest of the state may be what broke); pending updates go out too."""
        drafts = self.scheduler.drafts
        for seq in self.scheduler.by_id.values():
            drafts.finish(seq.request, FINISH_ERROR, detail)
        drafts.embedded(self.embeddings.end_all(FINISH_ERROR, detail, 0, 0))
        return drafts.flush(_NO_LOAD, None, None)

    # -- what observers read ------------------------------------------------------------------

    def load(self) -> Load:
        """The load now: for the board and the gauges, taken once per pass."""
        s = self.scheduler
        total, used, kept = self.kv.blocks(s.running)
        waiting = len(s.policy)
        embed_waiting = self.embeddings.queue.waiting()
        rate = s.drain.rate(s.running)
        return Load(s.tick, waiting, len(s.running), total, used, kept, rate, embed_waiting)

    def slots(self) -> list[Sequence | None]:
        """Each slot's request, or None: for the dashboard's feed."""
        return list(self.scheduler.slots)

    def queued(self) -> Iterator[Sequence]:
        """Accepted requests without a slot yet."""
        return iter(self.scheduler.policy)

    def queued_embeddings(self) -> Iterator[Sequence]:
        """Embedding requests waiting for their first part."""
        return self.embeddings.queue.queued()

    def timeline_of(self, request_id: str) -> dict[str, Any] | None:
        """A request's timeline: live while it runs, then kept for the recent ones."""
        seq = self.scheduler.by_id.get(request_id) or self.embeddings.live(request_id)
        if seq is not None:
            return seq.timeline.to_dict()
        return self.scheduler.recent.get(request_id)


_NO_LOAD = Load(0, 0, 0, 0, 0, 0, 0.0)  # abandon's report: the state may be what broke
