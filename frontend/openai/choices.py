"""Several choices in one OpenAI reply: a list of prompts (completions), ``n`` > 1 (both
routes), and ``echo`` (completions).

Every choice is an engine request of its own, run through the same pipeline as a single one
(``pipeline.run``: its own record, span, log line and metrics) and collected whole; the reply
is one JSON body with a choice per (prompt, i) at ``index = prompt * n + i``, usage summed (a
prompt's tokens counted once, however many choices it has). The n choices of one prompt share
its prefill: the first is submitted first and the others name it (``fork_of``), so the engine
copies its KV (``engine/kv/forks.py``); with a seed, choice ``index`` samples with
``seed + index``. The first failure (a rejection, an error) is the reply, and the other
choices are cancelled.

With ``stream`` (not with ``echo``), the choices' updates go out as they come, each chunk one
choice's delta at its ``index`` (``openai_stream.StreamEvents``), once every choice was
accepted (so a rejection is still an HTTP error); the usage chunk, when asked, sums them all.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tinyserve.frontend.chat.logprobs import token_logprobs
from tinyserve.frontend.link.streams import Inbox, RequestStream
from tinyserve.frontend.models.usage import TokenCounts
from tinyserve.frontend.openai.openai_replies import Usage
from tinyserve.frontend.openai.openai_reply import Echo, OpenAIReply, collect_or_error
from tinyserve.frontend.openai.openai_stream import StreamEvents
from tinyserve.frontend.request import pipeline
from tinyserve.frontend.request.generation import Generation
from tinyserve.frontend.request.record import RequestRecord, new_request_id
from tinyserve.frontend.request.sse import Reply, write_sse
from tinyserve.frontend.request.state import LINK, TOKENIZER
from tinyserve.protocol import RequestUpdate


@dataclass(frozen=True)
class Prompt:
    """One prompt of the call: its token ids, and its text as ``echo`` returns it."""

    ids: list[int]
    text: str


@dataclass(frozen=True)
class Choice:
    """One engine request of the call."""

    index: int
    prompt: int  # its prompt's position in the call
    generation: Generation
    request_id: str


@dataclass
class Result:
    """A choice served to its end: its whole output and its record."""

    whole: RequestUpdate
    record: RequestRecord


def plan(generation: Generation, n_prompts: int, n: int) -> list[Choice]:
    """The call's choices, in reply order; the first of each prompt prefills it for the rest,
    and only it asks for the prompt's logprobs (the others share them)."""
    seed = generation.sampling.seed
    choices: list[Choice] = []
    for prompt in range(n_prompts):
        leader = new_request_id()
        for i in range(n):
            index = prompt * n + i
            sampling = generation.sampling
            if seed is not None:
                sampling = dataclasses.replace(sampling, seed=seed + index)
            own = dataclasses.replace(
                generation,
                sampling=sampling,
                fork_of=leader if i else "",
                prompt_logprobs=generation.prompt_logprobs if i == 0 else -1,
            )
            choices.append(Choice(index, prompt, own, leader if i == 0 else new_request_id()))
    return choices


class Fanin(Inbox):
    """The updates of every choice of one call, in the order they came (``sse.Updates``)."""

    def __init__(self) -> None:
        super().__init__()
        self._updates: collections.deque[RequestUpdate] = collections.deque()

    def put(self, update: RequestUpdate) -> None:
        self._updates.append(update)
        self._wake()

    async def next(self, quiet_s: float = 0.0) -> RequestUpdate | None:
        if not await self._wait(quiet_s):
            return None
        self._taken()
        return self._updates.popleft()

    def _ready(self) -> bool:
        return bool(self._updates)


class _Forward:
    """A ``Reply`` that passes a choice's updates on to the call's one stream as they come."""

    def __init__(self, fanin: Fanin) -> None:
        self.fanin = fanin
        self.record: RequestRecord | None = None
        self.accepted = asyncio.Event()

    async def __call__(
        self, request: web.Request, stream: RequestStream, record: RequestRecord
    ) -> web.StreamResponse:
        self.record = record
        self.accepted.set()
        while True:
            update = await stream.next()
            assert update is not None  # no keep-alive asked for
            self.fanin.put(update)
            if update.finish_reason is not None:
                return web.Response()  # for the record's status: the stream is written once


class _Collect:
    """A ``Reply`` that keeps a choice's whole output instead of answering; a finish that is
    an error is answered as the single-choice reply would, and kept."""

    def __init__(self) -> None:
        self.result: Result | None = None
        self.error: web.Response | None = None

    async def __call__(
        self, request: web.Request, stream: RequestStream, record: RequestRecord
    ) -> web.StreamResponse:
        whole = await collect_or_error(stream, record, request.app[LINK].load())
        if isinstance(whole, web.Response):
            self.error = whole
            return whole
        self.result = Result(whole, record)
        return web.Response()  # for the record's status: the call's reply is written once


async def serve(
    request: web.Request, choices: list[Choice], prompts: list[Prompt]
) -> list[Result] | web.Response:
    """Run every choice at once; their results in order, or the first failure's reply."""
    collectors = [_Collect() for _ in choices]
    async with _running(request, choices, prompts, collectors) as tasks:
        await _until_all_or_a_failure(tasks, collectors)
    for task, collector in zip(tasks, collectors, strict=True):
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]  # an ApiError: the call's reply
        if collector.error is not None:
            return collector.error
    return [c.result for c in collectors if c.result is not None]


@contextlib.asynccontextmanager
async def _running(
    request: web.Request, choices: list[Choice], prompts: list[Prompt], replies: Sequence[Reply]
) -> AsyncIterator[list[asyncio.Task[web.StreamResponse]]]:
    """Every choice through the pipeline, a task each; none outlives the block (ended,
    failed, or the client left: the rest are cancelled, and so are their engine requests)."""
    # Tasks start in order and each submits before its first await, so a prompt's first
    # choice reaches the engine before the choices that copy its prefill.
    tasks = [
        asyncio.create_task(
            pipeline.run_with(
                request, c.generation, reply, prompts[c.prompt].ids, request_id=c.request_id
            )
        )
        for c, reply in zip(choices, replies, strict=True)
    ]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_reply(
    request: web.Request, reply: OpenAIReply, choices: list[Choice], prompts: list[Prompt]
) -> web.StreamResponse:
    """The choices as one event stream, once every one of them was accepted."""
    fanin = Fanin()
    forwards = [_Forward(fanin) for _ in choices]
    async with _running(request, choices, prompts, forwards) as tasks:
        await _until_accepted(tasks, forwards)
        records = [f.record for f in forwards if f.record is not None]
        prompt_tokens = sum(len(p.ids) for p in prompts)
        events = StreamEvents(reply, records, request.app[LINK].load, prompt_tokens)
        return await write_sse(request, records[0].request_id, fanin, events)


async def _until_accepted(
    tasks: list[asyncio.Task[web.StreamResponse]], forwards: list[_Forward]
) -> None:
    """Until every choice's stream started; a choice that failed before raises its error."""
    accepted = asyncio.ensure_future(asyncio.gather(*(f.accepted.wait() for f in forwards)))
    pending: set[asyncio.Future[Any]] = {accepted, *tasks}
    try:
        while not accepted.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {accepted}:
                error = task.exception()
                if error is not None:
                    raise error
    finally:
        accepted.cancel()


async def _until_all_or_a_failure(
    tasks: list[asyncio.Task[web.StreamResponse]], collectors: list[_Collect]
) -> None:
    pending: set[asyncio.Task[web.StreamResponse]] = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        failed = any(not t.cancelled() and t.exception() is not None for t in done)
        if failed or any(c.error is not None for c in collectors):
            return


def _headers(served: list[Result]) -> dict[str, str]:
    """The first choice's id, as a single reply has it, and every choice's, in order: each
    has its own timeline (``GET /v1/requests/{id}``)."""
    ids = [r.record.request_id for r in served]
    return {"X-Request-Id": ids[0], "X-Choice-Request-Ids": ",".join(ids)}


def usage(results: list[Result], prompts: list[Prompt]) -> Usage:
    """Summed over the choices; each prompt's tokens once (its choices shared its prefill)."""
    counts = [r.record.counts(r.whole) for r in results]
    return Usage.of(TokenCounts.summed(counts, sum(len(p.ids) for p in prompts)))


async def json_reply(
    request: web.Request,
    reply: OpenAIReply,
    choices: list[Choice],
    prompts: list[Prompt],
    echo: bool = False,
) -> web.Response:
    """The choices in one JSON body once all were served, or the first failure's reply."""
    served = await serve(request, choices, prompts)
    if isinstance(served, web.Response):
        return served
    echoes: dict[int, Echo] = {}
    body_choices = []
    for choice, result in zip(choices, served, strict=True):
        if echo and choice.prompt not in echoes:
            assert not choice.generation.fork_of  # a prompt's first choice leads it (``plan``)
            prompt = prompts[choice.prompt]
            echoes[choice.prompt] = await _echo(request, reply, prompt, result.whole)
        body_choices.append(
            await reply.choice(choice.index, result.whole, echoes.get(choice.prompt))
        )
    total = usage(served, prompts)
    return reply.respond(served[0].record, body_choices, total, _headers(served))


async def _echo(
    request: web.Request, reply: OpenAIReply, prompt: Prompt, leader: RequestUpdate
) -> Echo:
    """What ``echo`` puts before each choice of ``prompt``; the prompt's logprobs came with its
    first choice, ``leader``."""
    if reply.logprobs < 0:
        return Echo(prompt.text)
    tokenizer = request.app[TOKENIZER]
    scored = await token_logprobs(tokenizer, prompt.ids[1:], leader.prompt_logprobs)
    [first] = await tokenizer.token_pieces(prompt.ids[:1])
    return Echo(prompt.text, first, tuple(scored))
