"""``POST /v1/embeddings``: the inputs are checked and tokenized here, embedded by the engine in
batches of their own beside generation (``engine/embeddings/embedder.py``), and sent back in
OpenAI's shape. No prefix cache and no slot: an input's cost is one prefill, and a request that
cannot be queued now is a 503 with Retry-After, as a generation's."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from aiohttp import web

from tinyserve import protocol
from tinyserve.frontend.embeddings.embeddings_bodies import (
    MAX_INPUTS,
    Embedding,
    EmbeddingsReply,
    EmbeddingsRequest,
    EmbeddingsUsage,
)
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    MODEL_NOT_FOUND,
    ApiError,
    invalid,
)
from tinyserve.frontend.models.parse import read_body
from tinyserve.frontend.request import admission, pipeline
from tinyserve.frontend.request.generation import check_token_ids
from tinyserve.frontend.request.state import CONFIG, EMBED_TOKENIZER, LINK
from tinyserve.model import model_name

FLOAT32 = np.dtype("<f4")  # the engine's vectors: little-endian float32


async def embeddings(request: web.Request) -> web.Response:
    """One L2-normalised vector per input, in the inputs' order. The body is this surface's;
    the request then goes the way every request goes (``pipeline.embed``): its record, span,
    ``request finished`` line and metrics, admission from the board, the engine's answer."""
    app = request.app
    config = app[CONFIG]
    req = await read_body(request, EmbeddingsRequest, config)
    ack = admission.serving(app[LINK])
    served = [ack.model_name]
    if config.embedding_model:
        served.append(model_name(config.embedding_model, None))
    if req.model is not None and req.model not in served:
        message = f"model {req.model!r} does not exist; /v1/embeddings serves {served[-1]!r}"
        raise ApiError(404, MODEL_NOT_FOUND, message, param="model")
    if req.dimensions is not None and req.dimensions != ack.embedding_size:
        message = (
            f"'dimensions' must be {ack.embedding_size} (the model's embedding size): "
            "vectors are not shortened"
        )
        raise invalid(message, "dimensions")

    def reply(embedded: protocol.Embedded) -> web.Response:
        data = [
            Embedding(index=i, embedding=_encoded(vector, req.encoding_format))
            for i, vector in enumerate(embedded.vectors)
        ]
        tokens = embedded.prompt_tokens
        usage = EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens)
        return json_response(EmbeddingsReply(data=data, model=req.model or served[-1], usage=usage))

    work = pipeline.embedding(req.priority, req.tenant)
    return await pipeline.embed(request, work, lambda: _token_ids(request, req), reply)


async def _token_ids(request: web.Request, req: EmbeddingsRequest) -> list[list[int]]:
    """Each input's token ids, or a 400 naming the input at fault: ``input`` when there is one,
    ``input[i]`` in a list of them."""
    given = req.input
    one = isinstance(given, str) or (bool(given) and isinstance(given[0], int))
    items: list[Any] = [given] if one else list(given)
    if not items:
        raise invalid("'input' must have at least 1 item", "input")
    if len(items) > MAX_INPUTS:
        raise invalid(f"'input' must have at most {MAX_INPUTS} items", "input")

    def param(i: int) -> str:
        return "input" if one else f"input[{i}]"

    tokenizer = request.app[EMBED_TOKENIZER]
    if isinstance(items[0], str):
        for i, text in enumerate(items):
            if not text:
                raise invalid(f"{param(i)!r} must not be empty", param(i))
        inputs = await tokenizer.tokenize_inputs(items)
    else:
        inputs = items
        for i, ids in enumerate(inputs):
            if not ids:
                raise invalid(f"{param(i)!r} must have at least 1 item", param(i))
            check_token_ids(ids, tokenizer.n_vocab, param(i))
    limit = request.app[CONFIG].embedding_max_tokens
    for i, ids in enumerate(inputs):
        if len(ids) > limit:
            message = (
                f"{param(i)!r} is {len(ids)} tokens, over this server's limit of {limit} "
                "(--embedding-max-tokens)"
            )
            raise ApiError(400, CONTEXT_LENGTH_EXCEEDED, message, param=param(i))
    return inputs


def _encoded(vector: bytes, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector).decode("ascii")
    return np.frombuffer(vector, FLOAT32).tolist()  # type: ignore[no-any-return]
