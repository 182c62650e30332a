"""One frozen configuration per process: CLI flags > ``TINYSERVE_*`` environment > defaults.

Every option is declared once in ``OPTIONS`` (``options.py``); argparse flags, environment
variable names and the ``Config`` fields are all derived from that table. This is the only
module that reads ``os.environ``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinyserve.options import (
    ENGINE,
    ENV_PREFIX,
    LLAMA_MAX_SEQ,
    OPTIONS,
    SERVE,
    Option,
    parse_bool,
    weight_map,
)


@dataclass(frozen=True)
class Config:
    """Resolved settings of one process. Never mutated after start-up."""

    model: str | None
    model_name: str | None
    model_alias: tuple[str, ...]
    runtime_dir: str
    log_level: str
    log_format: str
    slots: int
    ctx_per_slot: int
    chunk: int
    max_batch_tokens: int
    speculate: str
    speculate_tokens: int
    draft_model: str | None
    block_size: int
    threads: int
    kv_type: str
    flash_attn: str
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
    embedding_tick_tokens: int
    embedding_share: float
    embedding_part_decodes: float
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
        return weight_map(self.tenant_weights)

    @property
    def shared_cache(self) -> bool:
        """Whether finished prefixes go to the prefix cache in host memory
        (``engine/kv/host_cache.py``); without it a free slot still keeps its last request's."""
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
        if opt.parse is parse_bool:
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
    if (
        values["draft_model"]
        and given.get("speculate") is None
        and ENV_PREFIX + "SPECULATE" not in env
    ):
        values["speculate"] = "draft"  # a draft model given is a draft model used
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
    if role is not None and role not in (ENGINE, SERVE):
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
    if c.speculate == "draft" and not c.draft_model:
        return "--speculate draft needs --draft-model: the model that writes the guesses"
    if c.draft_model and c.speculate != "draft":
        return f"--draft-model is used only with --speculate draft, not {c.speculate}"
    if c.kv_type != "f16" and c.flash_attn == "off":
        return (
            f"--kv-type {c.kv_type} needs flash attention (llama.cpp keeps a quantized V only "
            "with it): --flash-attn auto or on"
        )
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
    """How often to ping the watchdog systemd asked for (``WATCHDOG_USEC``), or None: a
    quarter of its timeout. A loop pings between two pieces of work, so the longest gap is
    this plus the longest piece; systemd's suggested half would leave a piece only the other
    half, a quarter leaves it three."""
    usec = os.environ.get("WATCHDOG_USEC")
    # A WATCHDOG_PID of another process (``tinyserve serve`` run by systemd passes its
    # environment on to its children) means the watchdog is not ours to ping.
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 4e6 if usec and usec.isdigit() and int(usec) > 0 else None
