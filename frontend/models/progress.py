"""The prefill progress a stream reports when its request asks (``return_progress``), in
llama-server's shape: ``prompt_progress`` with ``total``, ``cache``, ``processed`` and
``time_ms``."""

from __future__ import annotations

from pydantic import Field

from tinyserve.frontend.models.common import Reply

RETURN_PROGRESS_TEXT = (
    "with stream: report the prompt's prefill as it goes (prompt_progress events before the "
    "first token, as llama-server's return_progress)"
)


class PromptProgress(Reply):
    total: int = Field(description="prompt tokens")
    cache: int = Field(description="of them served from the prefix cache")
    processed: int = Field(description="of them in the KV cache so far, cached ones included")
    time_ms: float = Field(description="since the request arrived (its queue wait included)")
