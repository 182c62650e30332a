"""The path every generation request takes once its surface has parsed it.

tokenize -> admit (its limits, the board) -> submit -> wait for the engine's first word
(accepted or rejected) -> hand the stream to the surface's ``Reply``. Headers go out only after
that first word, so an engine-side rejection is still a proper 503 and not a stream that ends in
an error. ``/generate`` and the OpenAI routes differ only in how they parse and how they reply.
"""

from __future__ import annotations

import logging

from aiohttp import web

from tinyserve import protocol
from tinyserve.frontend.http.api_errors import ApiError, invalid
from tinyserve.frontend.http.appkeys import CLIENT, CONFIG, LINK, METRICS, TOKENIZER
from tinyserve.frontend.http.backpressure import ClientStalled, drop_connection
from tinyserve.frontend.link.engine_client import EngineUnreachable
from tinyserve.frontend.request import admission
from tinyserve.frontend.request.generation import Generation, check_token_ids
from tinyserve.frontend.request.meters import RequestMeter, count_rejection
from tinyserve.frontend.request.observe import admission_figures, observe, step, trace_context
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.reply_common import (
    Reply,
    engine_unavailable,
    finish_error,
    rejection_error,
)
from tinyserve.frontend.request.streams import Piece, RequestStream
from tinyserve.logs import fields

log = logging.getLogger(__name__)


async def run(
    request: web.Request,
    req: Generation,
    reply: Reply,
    prompt_ids: list[int] | None = None,
    request_id: str = "",
) -> web.StreamResponse:
    """Serve ``req`` (its prompt tokenized here unless ``prompt_ids`` are given); its record
    is what its span, its ``request finished`` log line and its metrics read."""
    record = RequestRecord.of(request, req, request_id)
    meter = RequestMeter(request.app[METRICS], record)
    with observe(request, record, meter.end):
        response = await _run(request, record, reply, prompt_ids, meter)
        record.status = response.status
        return response


async def _run(
    request: web.Request,
    record: RequestRecord,
    reply: Reply,
    prompt_ids: list[int] | None,
    meter: RequestMeter,
) -> web.StreamResponse:
    try:
        prompt_ids = await _prompt_ids(request, record.generation, prompt_ids)
        record.prompt_tokens, record.prompt_ids = len(prompt_ids), prompt_ids
        with step(request, record, "admission"):
            _admit(request, record)
        submit = _submit_message(record, prompt_ids, request.app[CLIENT].frontend_id)
        return await _forward(request, record, submit, reply, meter)
    except ApiError as exc:  # its reply names the request its log line and metrics count
        exc.request_id = record.request_id
        raise


async def _prompt_ids(request: web.Request, req: Generation, given: list[int] | None) -> list[int]:
    """The prompt's token ids: tokenized here, or ``given`` and checked against the
    vocabulary; an empty prompt is a 400."""
    ack = request.app[LINK].ack
    if ack is None:
        raise engine_unavailable()
    if given is None:
        given = await request.app[TOKENIZER].tokenize(req.prompt)
    else:
        check_token_ids(given, ack.n_vocab)
    if not given:  # the models refuse an empty prompt; this keeps a missed case from the engine
        raise invalid("'prompt' tokenizes to 0 tokens", "prompt")
    return given


def _admit(request: web.Request, record: RequestRecord) -> None:
    """Its limits and the board; raises the rejection, if any."""
    link = request.app[LINK]
    limits, load = link.limits, link.load()
    if limits is None or load is None:
        raise engine_unavailable()
    prompt_tokens, max_tokens = record.prompt_tokens, record.generation.max_tokens
    max_prompt = request.app[CONFIG].max_prompt_tokens
    rejection = admission.admit(prompt_tokens, max_tokens, limits, load, max_prompt)
    record.admission = admission_figures(record, limits, load, rejection)
    if rejection is not None:
        count_rejection(request.app[METRICS], rejection.reason)
        raise rejection_error(rejection, record.generation.prompt_field)


def _submit_message(
    record: RequestRecord, prompt_ids: list[int], frontend_id: str
) -> protocol.Submit:
    req = record.generation
    return protocol.Submit(
        request_id=record.request_id,
        frontend_id=frontend_id,
        prompt_ids=prompt_ids,
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


async def _forward(
    request: web.Request,
    record: RequestRecord,
    submit: protocol.Submit,
    reply: Reply,
    meter: RequestMeter,
) -> web.StreamResponse:
    """Send the request, reply from its stream, and make sure it does not outlive the handler."""
    client, link = request.app[CLIENT], request.app[LINK]
    try:
        stream = client.submit(submit)
    except EngineUnreachable as exc:
        raise engine_unavailable() from exc
    link.publish()

    def took(piece: Piece) -> None:  # as the reply takes each piece: the record, then the meter
        record.take(piece)
        meter.took(piece)

    stream.on_piece = took
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
        if not stream.engine_finished:
            client.cancel(record.request_id, reason)
            record.cancel_reason = reason
            meter.cancel_sent()
        client.release(record.request_id)
        if reason == protocol.FINISH_CLIENT_STALLED:
            drop_connection(request)


async def _reply(
    request: web.Request,
    record: RequestRecord,
    stream: RequestStream,
    reply: Reply,
) -> web.StreamResponse:
    """Wait for the engine's first word; an early end is an HTTP error, else the reply runs."""
    early = await stream.acknowledged()
    if early is not None:
        record.finish = early
        error = finish_error(early, request.app[LINK].load(), record.generation.prompt_field)
        if error is not None:
            raise error
    record.replied = True
    with step(request, record, "streaming"):
        return await reply(request, stream, record)
