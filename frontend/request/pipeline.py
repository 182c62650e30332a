"""The path every request takes once its surface has parsed and translated it.

A generation (``run``): tokenize -> admit (its limits, the board) -> submit -> wait for the
engine's first word (accepted or rejected) -> hand the stream to the surface's ``Reply``.
Headers go out only after that first word, so an engine-side rejection is still a proper 503
and not a stream that ends in an error. An embedding request (``embed``): its inputs
tokenized by its surface -> admit (the board's embedding queue) -> the engine's one answer ->
the surface's reply. Both have a record, a span, a ``request finished`` line and their
metrics (``observe``). The surfaces differ only in how they parse and translate, and in how
they reply.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from tinyserve import protocol
from tinyserve.frontend.link.board_view import Limits, NodeLoad
from tinyserve.frontend.link.engine_client import EngineUnreachable
from tinyserve.frontend.link.streams import RequestStream
from tinyserve.frontend.models.errors import ENGINE_ERROR, ApiError, invalid
from tinyserve.frontend.request import admission, notices
from tinyserve.frontend.request.generation import Generation, check_token_ids
from tinyserve.frontend.request.observe import (
    admission_figures,
    count_cancel,
    observe,
    step,
    trace_context,
)
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.sse import (
    Answer,
    ClientStalled,
    Reply,
    collect,
    drop_connection,
    write_sse,
)
from tinyserve.frontend.request.state import CLIENT, CONFIG, LINK, METRICS, TOKENIZER
from tinyserve.logs import fields

log = logging.getLogger(__name__)

STAGE = "frontend"  # the admission_rejections_total stage of the refusals made here


async def run(
    request: web.Request,
    req: Generation,
    answer: Answer,
    prompt_ids: list[int] | None = None,
) -> web.StreamResponse:
    """Serve ``req`` (its prompt tokenized here unless ``prompt_ids`` are given) and answer
    it as its surface does: a stream, or the whole reply (``_answering``)."""
    return await run_with(request, req, _answering(answer), prompt_ids)


async def run_with(
    request: web.Request,
    req: Generation,
    reply: Reply,
    prompt_ids: list[int] | None = None,
    request_id: str = "",
) -> web.StreamResponse:
    """Serve ``req``, its accepted stream handed to ``reply`` (a choice of several passes
    its stream on, or keeps its output: ``openai.choices``); its record is what its span, its
    ``request finished`` log line and its metrics read."""
    record = RequestRecord.of(request, req, request.app[METRICS], request_id)
    with observe(request, record):
        try:
            prompt_ids = await tokenized(request, req, prompt_ids)
            record.prompt_tokens, record.prompt_ids = len(prompt_ids), prompt_ids
            with step(request, record, "admission"):
                _admit(request, record)
            response = await _forward(request, record, reply)
        except ApiError as exc:  # its reply names the request its log line and metrics count
            exc.request_id = record.request_id
            raise
        record.status = response.status
        return response


async def tokenized(
    request: web.Request, req: Generation, given: list[int] | None = None
) -> list[int]:
    """The prompt's token ids: tokenized here (a chat prompt in its parts), or ``given`` and
    checked against the vocabulary; an empty prompt is a 400."""
    tokenizer = request.app[TOKENIZER]
    if given is not None:
        check_token_ids(given, admission.serving(request.app[LINK]).n_vocab)
    elif isinstance(req.prompt, str):
        given = await tokenizer.tokenize(req.prompt)
    else:
        given = await tokenizer.tokenize_chat(req.prompt)
    if not given:  # the models refuse an empty prompt; this keeps a missed case from the engine
        raise invalid("'prompt' tokenizes to 0 tokens", "prompt")
    return given


def embedding(priority: int, tenant: str) -> Generation:
    """An embedding request as its record holds it: it generates nothing (``max_tokens`` 0);
    its priority and tenant order it among embedding requests (the engine's policy)."""
    return Generation("", 0, protocol.SamplingParams(), priority=priority, tenant=tenant,
                      prompt_field="input")  # fmt: skip


async def embed(
    request: web.Request,
    work: Generation,
    inputs: Callable[[], Awaitable[list[list[int]]]],
    reply: Callable[[protocol.Embedded], web.Response],
) -> web.Response:
    """Serve an embedding request: ``inputs`` tokenizes it (its surface's 400s), ``reply``
    makes the response of its vectors."""
    record = RequestRecord.of(request, work, request.app[METRICS])
    with observe(request, record):
        try:
            token_ids = await inputs()
            record.prompt_tokens = sum(len(ids) for ids in token_ids)
            with step(request, record, "admission"):
                _admit_embedding(request)
            embedded = await _embedded(request, record, token_ids)
        except ApiError as exc:
            exc.request_id = record.request_id
            raise
        response = reply(embedded)
        response.headers["X-Request-Id"] = record.request_id
        record.status = response.status
        return response


def _admit_embedding(request: web.Request) -> None:
    """The board's word: a 503 when the node's embedding queue is full or the engine drains
    (the engine re-checks: frontends racing each other are refused there)."""
    limits, load = _board(request)
    _refuse(request, admission.admit_embedding(limits, load))


async def _embedded(
    request: web.Request, record: RequestRecord, token_ids: list[list[int]]
) -> protocol.Embedded:
    """The engine's answer; an ending that is not ``stop`` raises its HTTP error."""
    client, work = request.app[CLIENT], record.generation
    embed = protocol.Embed(record.request_id, client.frontend_id, token_ids, record.arrival_ns,
                           work.priority, work.tenant)  # fmt: skip
    try:
        embedded = await client.embed(embed)
    except EngineUnreachable as exc:
        raise admission.no_engine() from exc
    record.finish = protocol.RequestUpdate(
        record.request_id, 0, finish_reason=embedded.finish_reason,
        prompt_tokens=embedded.prompt_tokens, detail=embedded.detail,
    )  # fmt: skip
    if embedded.finish_reason != protocol.FINISH_STOP:
        error = admission.ending_error(record.finish, request.app[LINK].load(), "input")
        raise error or ApiError(500, ENGINE_ERROR, f"embedding ended: {embedded.finish_reason}")
    record.replied = True
    return embedded


def _admit(request: web.Request, record: RequestRecord) -> None:
    """Its limits and the board; raises the refusal, if any."""
    limits, load = _board(request)
    prompt_tokens, config = record.prompt_tokens, request.app[CONFIG]
    _clamp(request, record, limits.n_ctx, config.max_tokens_limit)
    req, max_prompt = record.generation, config.max_prompt_tokens
    refusal = admission.admit(
        prompt_tokens, req.max_tokens, limits, load, max_prompt, req.prompt_field
    )
    record.admission = admission_figures(record, limits, load, refusal)
    _refuse(request, refusal)


def _board(request: web.Request) -> tuple[Limits, NodeLoad]:
    """The engine's limits and the board's load now; a 503 while there is no engine."""
    link = request.app[LINK]
    limits, load = link.limits, link.load()
    if limits is None or load is None:
        raise admission.no_engine()
    return limits, load


def _refuse(request: web.Request, refusal: admission.NeverFits | admission.NotNow | None) -> None:
    """Count and raise the frontend's refusal, if there is one."""
    if refusal is not None:
        request.app[METRICS].admission_rejections_total.labels(STAGE, refusal.label).inc()
        raise refusal


def _clamp(request: web.Request, record: RequestRecord, n_ctx: int, limit: int) -> None:
    """An output length over ``limit`` or the context left is served as what fits, and said
    so when the client named it (``notices``)."""
    req = record.generation
    fitted = admission.fitted_max_tokens(record.prompt_tokens, req.max_tokens, n_ctx, limit)
    if fitted == req.max_tokens:
        return
    record.generation = dataclasses.replace(req, max_tokens=fitted)
    if req.max_tokens_asked:
        notices.note(request, f"max_tokens (clamped to {fitted})")


def _submit(record: RequestRecord, frontend_id: str) -> protocol.Submit:
    req = record.generation
    return protocol.Submit(
        request_id=record.request_id,
        frontend_id=frontend_id,
        prompt_ids=record.prompt_ids,
        sampling=req.sampling,
        max_tokens=req.max_tokens,
        priority=req.priority,
        tenant=req.tenant,
        arrival_ns=record.arrival_ns,
        deadline_ms=req.deadline_ms or 0,
        trace_context=trace_context(record),
        admission=record.admission,
        prompt_logprobs=req.prompt_logprobs,
        fork_of=req.fork_of,
    )


async def _forward(request: web.Request, record: RequestRecord, reply: Reply) -> web.StreamResponse:
    """Send the request, reply from its stream, and make sure it does not outlive the handler."""
    client, link = request.app[CLIENT], request.app[LINK]
    try:
        stream = client.submit(_submit(record, client.frontend_id))
    except EngineUnreachable as exc:
        raise admission.no_engine() from exc
    link.publish()
    stream.on_take = record.take
    reason = protocol.FINISH_CANCELLED
    try:
        return await _reply(request, record, stream, reply)
    except ClientStalled as stalled:
        # Counted as stalled even when the engine had already finished: the client never got
        # the end.
        reason = record.cancel_reason = protocol.FINISH_CLIENT_STALLED
        log.warning("client stopped reading", extra=fields(request_id=record.request_id))
        return stalled.response
    finally:
        # Client gone (handler cancelled) or a failure of ours: the engine must not keep
        # generating for nobody. cancel() never waits, so this cannot hang a cancelled task.
        stream.close()
        if not stream.engine_finished:
            client.cancel(record.request_id, reason)
            record.cancel_reason = reason
            count_cancel(record)
        client.release(record.request_id)
        if reason == protocol.FINISH_CLIENT_STALLED:
            drop_connection(request)


async def _reply(
    request: web.Request, record: RequestRecord, stream: RequestStream, reply: Reply
) -> web.StreamResponse:
    """Wait for the engine's first word; an early end is an HTTP error, else the reply runs."""
    early = await stream.acknowledged()
    if early is not None:
        record.finish = early
        load = request.app[LINK].load()
        error = admission.ending_error(early, load, record.generation.prompt_field)
        if error is not None:
            raise error
    record.replied = True
    with step(request, record, "streaming"):
        return await reply(request, stream, record)


def _answering(answer: Answer) -> Reply:
    """The one place a reply is chosen: the events of a stream when the request asked for
    one, else the whole reply, or the HTTP error its ending is (raised: the error middleware
    answers it in the path's shape)."""

    async def reply(
        request: web.Request, stream: RequestStream, record: RequestRecord
    ) -> web.StreamResponse:
        load = request.app[LINK].load
        if record.generation.stream:
            events = answer.events(record, load)
            return await write_sse(request, record.request_id, stream, events, answer.keepalive)
        whole = await collect(stream)
        refused, field = answer.queue_timeout_refused, record.generation.prompt_field
        error = admission.ending_error(whole, load(), field, queue_timeout_refused=refused)
        if error is not None:
            raise error
        return await answer.whole(record, whole)

    return reply
