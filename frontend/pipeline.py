"""The path every generation request takes once its surface has parsed it.

tokenize -> check it fits -> admit (board) -> submit -> wait for the engine's first word
(accepted or rejected) -> hand the stream to the surface's ``Reply``. Headers go out only after
that first word, so an engine-side rejection is still a proper 503 and not a stream that ends in
an error. ``/generate`` and the OpenAI routes differ only in how they parse and how they reply.
"""

from __future__ import annotations

import time
import uuid

from aiohttp import web

from tinyserve import protocol
from tinyserve.frontend import admission
from tinyserve.frontend.api_errors import ApiError
from tinyserve.frontend.engine_client import EngineUnreachable
from tinyserve.frontend.keys import CLIENT, LINK, TOKENIZER
from tinyserve.frontend.replies import (
    Reply,
    ReplyContext,
    engine_unavailable,
    finish_error,
    rejection_error,
)
from tinyserve.frontend.validation import (
    GenerateRequest,
    check_prompt_fits,
    check_token_ids,
)


async def run(
    request: web.Request,
    req: GenerateRequest,
    reply: Reply,
    prompt_ids: list[int] | None = None,
) -> web.StreamResponse:
    """Serve ``req`` (its prompt tokenized here unless ``prompt_ids`` are given)."""
    app = request.app
    ack = app[LINK].ack
    if ack is None:
        raise engine_unavailable()
    if prompt_ids is None:
        prompt_ids = await app[TOKENIZER].tokenize(req.prompt)
    else:
        check_token_ids(prompt_ids, ack.n_vocab)
    check_prompt_fits(len(prompt_ids), req.max_tokens, ack.n_ctx)
    blocks = _admit(request, len(prompt_ids), req.max_tokens)
    submit = _submit_message(req, prompt_ids, app[CLIENT].frontend_id)
    try:
        return await _forward(request, req, submit, blocks, reply)
    except ApiError as exc:
        exc.request_id = submit.request_id
        raise


def _admit(request: web.Request, prompt_tokens: int, max_tokens: int) -> int:
    """Check the board; returns the request's worst-case KV blocks or raises the rejection."""
    link = request.app[LINK]
    limits, load = link.limits, link.load()
    if limits is None or load is None:
        raise engine_unavailable()
    rejection = admission.admit(prompt_tokens, max_tokens, limits, load)
    if rejection is not None:
        raise rejection_error(rejection)
    return admission.blocks_needed(prompt_tokens + max_tokens, limits.block_size)


def _submit_message(
    req: GenerateRequest, prompt_ids: list[int], frontend_id: str
) -> protocol.Submit:
    sampling = protocol.SamplingParams(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        ignore_eos=req.ignore_eos,
        seed=req.seed,
        stop=req.stop,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logprobs=req.logprobs,
    )
    return protocol.Submit(
        request_id=uuid.uuid4().hex,
        frontend_id=frontend_id,
        prompt_ids=prompt_ids,
        sampling=sampling,
        max_tokens=req.max_tokens,
        priority=req.priority,
        tenant=req.tenant,
        arrival_ns=time.monotonic_ns(),
        want_timeline=req.timeline,
    )


async def _forward(
    request: web.Request,
    req: GenerateRequest,
    submit: protocol.Submit,
    blocks: int,
    reply: Reply,
) -> web.StreamResponse:
    """Send the request, reply from its stream, and make sure it does not outlive the handler."""
    client, link = request.app[CLIENT], request.app[LINK]
    try:
        stream = client.submit(submit, blocks)
    except EngineUnreachable as exc:
        raise engine_unavailable() from exc
    link.publish()
    try:
        early = await stream.acknowledged()
        error = finish_error(early, link.load()) if early is not None else None
        if error is not None:
            raise error
        ctx = ReplyContext(
            submit.request_id, len(submit.prompt_ids), req.timeline, link.load, req.stream
        )
        return await reply(request, stream, ctx)
    finally:
        # Client gone (handler cancelled) or a failure of ours: the engine must not keep
        # generating for nobody. cancel() never waits, so this cannot hang a cancelled task.
        if not stream.engine_finished:
            client.cancel(submit.request_id)
        client.release(submit.request_id)
