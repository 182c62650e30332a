"""The path every generation request takes once its surface has parsed and translated it.

tokenize -> admit (its limits, the board) -> submit -> wait for the engine's first word
(accepted or rejected) -> hand the stream to the surface's ``Reply``. Headers go out only after
that first word, so an engine-side rejection is still a proper 503 and not a stream that ends in
an error. The surfaces differ only in how they parse and translate, and in how they reply.
"""

from __future__ import annotations

import dataclasses
import logging

from aiohttp import web

from tinyserve import protocol
from tinyserve.frontend.link.engine_client import EngineUnreachable
from tinyserve.frontend.link.streams import RequestStream
from tinyserve.frontend.models.errors import ApiError, invalid
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
from tinyserve.frontend.request.sse import ClientStalled, Reply, drop_connection
from tinyserve.frontend.request.state import CLIENT, CONFIG, LINK, METRICS, TOKENIZER
from tinyserve.logs import fields

log = logging.getLogger(__name__)

STAGE = "frontend"  # the admission_rejections_total stage of the refusals made here


async def run(
    request: web.Request,
    req: Generation,
    reply: Reply,
    prompt_ids: list[int] | None = None,
    request_id: str = "",
) -> web.StreamResponse:
    """Serve ``req`` (its prompt tokenized here unless ``prompt_ids`` are given); its record
    is what its span, its ``request finished`` log line and its metrics read."""
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


def _admit(request: web.Request, record: RequestRecord) -> None:
    """Its limits and the board; raises the refusal, if any."""
    link = request.app[LINK]
    limits, load = link.limits, link.load()
    if limits is None or load is None:
        raise admission.no_engine()
    prompt_tokens, config = record.prompt_tokens, request.app[CONFIG]
    _clamp(request, record, limits.n_ctx, config.max_tokens_limit)
    req, max_prompt = record.generation, config.max_prompt_tokens
    refusal = admission.admit(
        prompt_tokens, req.max_tokens, limits, load, max_prompt, req.prompt_field
    )
    record.admission = admission_figures(record, limits, load, refusal)
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
