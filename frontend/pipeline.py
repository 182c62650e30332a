"""The path every generation request takes once its surface has parsed it.

tokenize -> check it fits -> admit (board) -> submit -> wait for the engine's first word
(accepted or rejected) -> hand the stream to the surface's ``Reply``. Headers go out only after
that first word, so an engine-side rejection is still a proper 503 and not a stream that ends in
an error. ``/generate`` and the OpenAI routes differ only in how they parse and how they reply.
"""

from __future__ import annotations

import logging

from aiohttp import web

from tinyserve import capacity, protocol
from tinyserve.frontend import admission
from tinyserve.frontend.api_errors import ApiError
from tinyserve.frontend.backpressure import ClientStalled, drop_connection
from tinyserve.frontend.engine_client import EngineUnreachable
from tinyserve.frontend.generation import Generation, check_prompt_fits, check_token_ids
from tinyserve.frontend.keys import CLIENT, CONFIG, LINK, TOKENIZER
from tinyserve.frontend.limits import check_prompt_limit
from tinyserve.frontend.meters import METER, METRICS, RequestMeter, count_rejection
from tinyserve.frontend.observe import Observation, observe
from tinyserve.frontend.replies import (
    Reply,
    ReplyContext,
    engine_unavailable,
    finish_error,
    rejection_error,
)
from tinyserve.logs import fields

log = logging.getLogger(__name__)


async def run(
    request: web.Request,
    req: Generation,
    reply: Reply,
    prompt_ids: list[int] | None = None,
) -> web.StreamResponse:
    """Serve ``req`` (its prompt tokenized here unless ``prompt_ids`` are given); its span,
    its ``request finished`` log line and its metrics' outcome come from ``observe``."""
    meter = request[METER] = RequestMeter(request.app[METRICS])
    with observe(request, req, meter.end) as obs:
        response = await _run(request, req, reply, prompt_ids, obs)
        obs.status = response.status
        return response


async def _run(
    request: web.Request,
    req: Generation,
    reply: Reply,
    prompt_ids: list[int] | None,
    obs: Observation,
) -> web.StreamResponse:
    app = request.app
    ack = app[LINK].ack
    if ack is None:
        raise engine_unavailable()
    if prompt_ids is None:
        prompt_ids = await app[TOKENIZER].tokenize(req.prompt)
    else:
        check_token_ids(prompt_ids, ack.n_vocab)
    check_prompt_limit(len(prompt_ids), app[CONFIG].max_prompt_tokens)
    check_prompt_fits(len(prompt_ids), req.max_tokens, ack.n_ctx)
    obs.prompt_tokens = len(prompt_ids)
    with obs.step(request, "admission"):
        blocks = _admit(request, len(prompt_ids), req.max_tokens, obs)
    submit = _submit_message(req, prompt_ids, app[CLIENT].frontend_id, obs)
    try:
        return await _forward(request, req, submit, blocks, reply, obs)
    except ApiError as exc:
        exc.request_id = submit.request_id
        raise


def _admit(request: web.Request, prompt_tokens: int, max_tokens: int, obs: Observation) -> int:
    """Check the board; returns the request's worst-case KV blocks or raises the rejection."""
    link = request.app[LINK]
    limits, load = link.limits, link.load()
    if limits is None or load is None:
        raise engine_unavailable()
    rejection = admission.admit(prompt_tokens, max_tokens, limits, load)
    blocks = capacity.blocks_needed(prompt_tokens + max_tokens, limits.block_size)
    obs.admitted(limits, load, blocks, rejection)
    if rejection is not None:
        count_rejection(request.app[METRICS], rejection.reason)
        raise rejection_error(rejection)
    return blocks


def _submit_message(
    req: Generation, prompt_ids: list[int], frontend_id: str, obs: Observation
) -> protocol.Submit:
    return protocol.Submit(
        request_id=obs.request_id,
        frontend_id=frontend_id,
        prompt_ids=prompt_ids,
        sampling=req.sampling,
        max_tokens=req.max_tokens,
        priority=req.priority,
        tenant=req.tenant,
        arrival_ns=obs.arrival_ns,
        trace_context=obs.trace_context,
        admission=obs.admission,
    )


async def _forward(
    request: web.Request,
    req: Generation,
    submit: protocol.Submit,
    blocks: int,
    reply: Reply,
    obs: Observation,
) -> web.StreamResponse:
    """Send the request, reply from its stream, and make sure it does not outlive the handler."""
    client, link = request.app[CLIENT], request.app[LINK]
    try:
        stream = client.submit(submit, blocks)
    except EngineUnreachable as exc:
        raise engine_unavailable() from exc
    obs.stream = stream
    link.publish()
    stream.on_piece = request[METER].piece  # first token and gaps, as the reply takes them
    reason = protocol.FINISH_CANCELLED
    try:
        early = await stream.acknowledged()
        error = finish_error(early, link.load()) if early is not None else None
        if error is not None:
            raise error
        ctx = ReplyContext(
            submit.request_id, len(submit.prompt_ids), req.timeline, link.load, req.stream
        )
        with obs.step(request, "streaming"):
            return await reply(request, stream, ctx)
    except ClientStalled as stalled:
        reason = protocol.FINISH_CLIENT_STALLED
        log.warning("client stopped reading", extra=fields(request_id=submit.request_id))
        return stalled.response
    finally:
        # Client gone (handler cancelled) or a failure of ours: the engine must not keep
        # generating for nobody. cancel() never waits, so this cannot hang a cancelled task.
        if not stream.engine_finished:
            client.cancel(submit.request_id, reason)
            request[METER].cancel_sent(reason)
        client.release(submit.request_id)
        if reason == protocol.FINISH_CLIENT_STALLED:
            drop_connection(request)
