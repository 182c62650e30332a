"""Sampler chains and grammars, through the real core and model: each sampler changes the
output the way it should on a case built to show it."""

from __future__ import annotations

import re
from collections.abc import Callable

import llama_cpp

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.runtime.runtime import LlamaRuntime

from .conftest import core_config
from .test_core import Driver

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
YES_NO = 'root ::= ("yes" | "no") "." '
# A list of objects: deep enough that the grammar keeps several stacks alive.
JSON_LIST = r"""
root ::= "[" item ("," item)* "]"
item ::= "{\"n\":" [0-9] [0-9]? "}"
"""


def _run(runtime: LlamaRuntime, prompt: list[int], **sampling: object) -> tuple[Driver, str]:
    d = Driver(EngineCore(core_config(), runtime))
    rid = d.submit(prompt, **sampling)
    d.run()
    return d, rid


def test_grammar_constrains_every_token(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(CHAT.format("Is the sky green? Answer in one word."))
    for seed in range(4):
        d, rid = _run(runtime, prompt, max_tokens=16, temperature=1.0, seed=seed, grammar=YES_NO)
        assert d.text(rid) in (b"yes.", b"no."), d.text(rid)
        assert d.final(rid).finish_reason == p.FINISH_STOP  # the grammar ended: EOG allowed


def test_constrained_and_unconstrained_in_one_batch_both_come_out_right(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(CHAT.format("List some numbers."))
    alone = Driver(EngineCore(core_config(), runtime))
    plain_alone = alone.submit(prompt, max_tokens=12)
    alone.run()
    mixed = Driver(EngineCore(core_config(), runtime))
    plain = mixed.submit(prompt, max_tokens=12)
    constrained = mixed.submit(prompt, max_tokens=40, grammar=JSON_LIST)
    mixed.run()
    assert max(b.requests for b in mixed.batches) == 2
    assert mixed.tokens(plain) == alone.tokens(plain_alone)
    text = mixed.text(constrained).decode()
    # Cut by max_tokens or complete, it is a prefix of the language.
    assert re.fullmatch(r'\[(\{"n":\d\d?\},)*(\{"n":\d\d?\}\])?.*', text), text
    assert text.startswith('[{"n":'), text
    timeline = mixed.final(constrained).timeline
    assert timeline is not None and timeline["grammar"]["build_ms"] >= 0
    assert len(timeline["grammar"]["hash"]) == 16
    assert "grammar" not in (mixed.final(plain).timeline or {})


def test_bad_grammar_or_dead_end_fails_that_request_only(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(CHAT.format("Say yes."))
    d = Driver(EngineCore(core_config(), runtime))
    broken = d.submit(prompt, grammar="root ::= undefined-rule")
    # The grammar ends after "yes." and only EOG may follow, which ignore_eos bans.
    dead_end = d.submit(prompt, max_tokens=16, grammar=YES_NO, ignore_eos=True)
    fine = d.submit(prompt, max_tokens=4, ignore_eos=True)  # its length whatever it samples
    d.run()
    assert d.final(broken).finish_reason == p.FINISH_ERROR
    assert "grammar" in d.final(broken).detail
    assert d.final(dead_end).finish_reason == p.FINISH_ERROR
    assert "grammar allows no token" in d.final(dead_end).detail
    assert d.final(fine).finish_reason == p.FINISH_LENGTH
    assert d.core.load().blocks_used == 0 and not d.core.has_work()


def test_logit_bias_forces_and_bans_tokens(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(CHAT.format("Tell me about the sea."))
    d, rid = _run(runtime, prompt, max_tokens=6)
    greedy = d.tokens(rid)
    forced = tokenize("banana")[-1]
    d, rid = _run(runtime, prompt, max_tokens=3, logit_bias={forced: 100.0})
    assert d.tokens(rid) == [forced] * 3
    d, rid = _run(runtime, prompt, max_tokens=6, logit_bias={greedy[0]: -100.0})
    assert d.tokens(rid)[0] != greedy[0]


def test_min_tokens_holds_off_the_end(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(CHAT.format("Say hi."))
    d, rid = _run(runtime, prompt, max_tokens=200)
    natural = len(d.tokens(rid))
    assert d.final(rid).finish_reason == p.FINISH_STOP
    assert runtime.is_eog(d.tokens(rid)[-1])  # the end is a generated token too
    d, rid = _run(runtime, prompt, max_tokens=200, min_tokens=natural + 5)
    tokens = d.tokens(rid)
    assert len(tokens) >= natural + 5
    assert not any(runtime.is_eog(t) for t in tokens[: natural + 5])


def test_penalties_cut_repetition(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    # Measured: greedy continuation of this prompt repeats one token (see test_core).
    prompt = list(range(100, 140))
    d, rid = _run(runtime, prompt, max_tokens=16)
    plain = d.tokens(rid)
    assert len(set(plain)) <= 3, plain
    for sampling in (
        {"repetition_penalty": 1.5},
        {"presence_penalty": 2.0},
        {"frequency_penalty": 2.0},
    ):
        d, rid = _run(runtime, prompt, max_tokens=16, **sampling)
        assert len(set(d.tokens(rid))) > len(set(plain)), sampling


def test_min_p_and_typical_p_narrow_the_choice(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(CHAT.format("Write a sentence about cats."))
    greedy_d, greedy = _run(runtime, prompt, max_tokens=12)

    def seeds(**sampling: object) -> set[tuple[int, ...]]:
        outs = set()
        for seed in range(5):
            d, rid = _run(runtime, prompt, max_tokens=12, temperature=1.5, seed=seed, **sampling)
            outs.add(tuple(d.tokens(rid)))
        return outs

    assert len(seeds()) > 1  # at this temperature seeds differ
    # min_p 1.0 keeps only the likeliest token: every seed gives the greedy text.
    assert seeds(min_p=1.0) == {tuple(greedy_d.tokens(greedy))}
    assert len(seeds(typical_p=0.01)) < len(seeds())


def test_plain_greedy_picks_what_llama_cpps_greedy_stage_picks(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    """Plain greedy skips the chain (numpy's argmax of the row's logits): on every row of a
    real batch, and row after row of a greedy continuation, it picks llama.cpp's token."""
    reference = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(reference, llama_cpp.llama_sampler_init_greedy())
    prompts = [tokenize(CHAT.format(q)) for q in ("Hi.", "Name a fruit.", "Count to five.")]
    samplers = [runtime.new_sampler(p.SamplingParams(temperature=0.0)) for _ in prompts]
    memory = llama_cpp.llama_get_memory(runtime.ctx)
    llama_cpp.llama_memory_clear(memory, True)
    try:
        rows = []
        runtime.batch.clear()
        for seq, prompt in enumerate(prompts):
            rows.append(runtime.batch.add_span(prompt, 0, len(prompt), 0, seq, True, False))
        positions = [len(prompt) for prompt in prompts]
        for _ in range(12):
            assert runtime.decode() == 0
            picked = [s.sample(runtime.ctx, row) for s, row in zip(samplers, rows, strict=True)]
            expected = [llama_cpp.llama_sampler_sample(reference, runtime.ctx, row) for row in rows]
            assert picked == expected
            runtime.batch.clear()
            rows = [runtime.batch.add(t, positions[seq], seq, True) for seq, t in enumerate(picked)]
            positions = [n + 1 for n in positions]
    finally:
        llama_cpp.llama_memory_clear(memory, True)
        llama_cpp.llama_sampler_free(reference)
        for sampler in samplers:
            sampler.free()
