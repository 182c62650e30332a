"""Settings that cannot work together are refused at start-up, with one line naming them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from tinyserve import cli
from tinyserve.config import ENGINE, FRONTEND, LLAMA_MAX_SEQ, SERVE, build_config

REFUSED = [
    ({"slots": 300, "max_batch_tokens": 256}, ["--slots 300", "--max-batch-tokens 256"]),
    ({"block_size": 8192, "ctx": 4096}, ["--block-size 8192", "--ctx 4096"]),
    ({"slots": 250, "max_batch_tokens": 512}, ["--slots 250", "--cache-seqs 16", "256"]),
    (
        {"slots": 257, "max_batch_tokens": 512, "prefix_cache": False},
        ["--slots 257", "256"],
    ),
    (
        {"slots": 240, "cache_seqs": 16, "max_batch_tokens": 240},
        ["--slots 240", "--cache-seqs 16", "+ 1 for --host-cache-mb", "256"],
    ),
    ({"cache_dir": "/tmp/x", "host_cache_mb": 0}, ["--cache-dir", "--host-cache-mb"]),
    ({"cache_dir": "/tmp/x", "kv_layout": "slots"}, ["--cache-dir", "--kv-layout unified"]),
    ({"kv_layout": "slots", "ctx": 4096, "slots": 6}, ["--kv-layout slots", "--ctx 4096", "256"]),
]


@pytest.mark.parametrize(("settings", "named"), REFUSED)
@pytest.mark.parametrize("role", [ENGINE, SERVE, None])
def test_settings_that_cannot_work_are_refused(
    settings: dict[str, Any], named: list[str], role: str | None
) -> None:
    with pytest.raises(SystemExit) as refused:
        build_config(settings, environ={}, role=role)
    message = str(refused.value.code)
    assert "\n" not in message
    assert all(name in message for name in named), message


def test_settings_at_the_limits_are_taken() -> None:
    at_limits = {"slots": 240, "cache_seqs": 15, "max_batch_tokens": 240, "block_size": 256}
    config = build_config({**at_limits, "ctx": 256}, environ={}, role=ENGINE)
    assert config.n_seq_max == LLAMA_MAX_SEQ  # the host tier's scratch sequence is the 256th
    no_host = {**at_limits, "cache_seqs": 16, "host_cache_mb": 0, "ctx": 256}
    assert build_config(no_host, environ={}, role=ENGINE).n_seq_max == LLAMA_MAX_SEQ
    build_config({"slots": 256, "prefix_cache": False, "max_batch_tokens": 256}, environ={})


def test_with_a_stream_per_slot_there_are_no_cache_sequences() -> None:
    """``--kv-layout slots``: one llama.cpp sequence id per slot, however the cache is set."""
    config = build_config({"kv_layout": "slots", "slots": 16}, environ={}, role=ENGINE)
    assert config.n_seq_max == 16 and config.prefix_cache
    assert not config.shared_cache and not config.host_cache


def test_the_environment_is_checked_too() -> None:
    env = {"TINYSERVE_SLOTS": "300"}
    with pytest.raises(SystemExit, match="--slots 300"):
        build_config({}, environ=env, role=ENGINE)


def test_a_frontend_is_not_refused_for_engine_settings_it_does_not_use() -> None:
    env = {"TINYSERVE_SLOTS": "300", "TINYSERVE_MAX_BATCH_TOKENS": "256"}
    assert build_config({}, environ=env, role=FRONTEND).slots == 300


@pytest.mark.parametrize("command", ["engine", "serve"])
def test_every_command_with_the_flags_refuses_them_before_starting(
    command: str, tmp_path: Path
) -> None:
    argv = [command, "--runtime-dir", str(tmp_path), "--slots", "300", "--max-batch-tokens", "256"]
    with pytest.raises(SystemExit) as refused:
        cli.main(argv)
    assert "--slots 300" in str(refused.value.code)
    assert not list(tmp_path.iterdir())  # nothing was started or created


def test_a_chunk_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main(["engine", "--chunk", "0"])
    assert refused.value.code == 2
    assert "--chunk: must be > 0" in capsys.readouterr().err


def test_the_sequence_limit_is_llama_cpps() -> None:
    assert llama_cpp.llama_max_parallel_sequences() == LLAMA_MAX_SEQ


@pytest.mark.parametrize(
    ("weights", "words"),
    [
        ("a=inf", "from 0.001 to 1000"),
        ("a=1e400", "from 0.001 to 1000"),
        ("a=nan", "from 0.001 to 1000"),
        ("a=0", "from 0.001 to 1000"),
        ("a=2,a=3", "'a' is weighted twice"),
        ("team a=2", "as requests give a tenant"),
        ("=2", "as requests give a tenant"),
        ("a", "as requests give a tenant"),
    ],
)
def test_tenant_weights_that_requests_could_not_match_or_wfq_could_not_use_are_refused(
    weights: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main(["engine", "--tenant-weights", weights])
    assert refused.value.code == 2
    assert words in capsys.readouterr().err


def test_tenant_weights_are_normalised_for_the_children() -> None:
    config = build_config({"tenant_weights": " a = 3 , team.b_1-x=0.5 "}, environ={})
    assert config.tenant_weight_map == {"a": 3.0, "team.b_1-x": 0.5}
