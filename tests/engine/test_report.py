"""engine/output/report.py: the one TickReport a core step returns, with the real model. Everything
proc.py publishes, meters and traces is read from it."""

from __future__ import annotations

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.output.report import RULE_ARRIVAL, RULE_TENANT, Cause
from tinyserve.engine.runtime.runtime import LlamaRuntime

from .conftest import core_config
from .test_core import FRONTEND, PROMPT, Driver


def test_a_tick_reports_grants_batch_composition_and_load(runtime: LlamaRuntime) -> None:
    d = Driver(EngineCore(core_config(policy="wfq"), runtime))
    first = d.submit(PROMPT, max_tokens=4)
    report = d.core.step()
    assert [(g.request_id, g.rule, g.tenant) for g in report.grants] == [
        (first, RULE_TENANT, "default")
    ]
    assert report.grants[0].wait_s >= 0
    assert report.batch is not None
    assert (report.batch.prefill_tokens, report.batch.decode_tokens) == (32, 0)  # --chunk 32
    assert (report.load.running, report.load.blocks_used) == (1, 2)  # 32 tokens in its slot
    assert [u.accepted for u in report.updates[FRONTEND]] == [True]
    report = d.core.step()  # the rest of the prompt (8 tokens) and no decode row yet
    assert report.batch is not None and (report.batch.prefill_tokens, report.batch.tokens) == (8, 8)
    assert report.generated == 1  # the prompt's last chunk gave the first token
    report = d.core.step()
    assert report.batch is not None and report.batch.decode_tokens == 1
    assert report.load.tick == d.core.scheduler.tick == 3 and not report.grants


def test_finishes_say_who_ended_them(runtime: LlamaRuntime) -> None:
    d = Driver(EngineCore(core_config(policy="fifo"), runtime))
    client = d.submit(PROMPT, max_tokens=50)
    d.submit(PROMPT[1:], max_tokens=50)  # ends when its frontend goes
    d.step()
    d.core.cancel(client)  # a Cancel from its frontend
    report = d.core.step()
    assert [(f.reason, f.cause) for f in report.finishes] == [(p.FINISH_CANCELLED, Cause.CLIENT)]
    d.core.cancel_frontend(FRONTEND)
    report = d.core.step()
    finish = report.finishes[0]
    assert (finish.reason, finish.cause) == (p.FINISH_CANCELLED, Cause.FRONTEND_GONE)
    assert finish.prompt_tokens == len(PROMPT) - 1
    assert report.ended() == [finish.timeline] and finish.timeline.finish is not None
    assert report.load.running == report.load.waiting == report.load.blocks_used == 0
    assert [g.rule for g in d.grants] == [RULE_ARRIVAL, RULE_ARRIVAL]


def test_rejections_are_reported_apart_from_finishes(runtime: LlamaRuntime) -> None:
    d = Driver(EngineCore(core_config(), runtime))
    d.submit(list(range(1, 510)), max_tokens=8)  # more than a slot's 512 cells
    report = d.core.step()
    assert [r.reason for r in report.rejections] == [p.REJECT_TOO_LONG]
    assert not report.finishes and report.batch is None
    assert report.ended() == [report.rejections[0].timeline]


def test_an_idle_report_has_the_load_and_nothing_else(runtime: LlamaRuntime) -> None:
    core = EngineCore(core_config(), runtime)
    report = core.report()
    assert report.load.blocks_total == 4 * 512 // 16 and report.load.waiting == 0
    assert not (report.updates or report.grants or report.finishes or report.rejections)
    assert report.batch is None and report.generated == 0
