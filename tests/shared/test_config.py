"""Settings that cannot work together are refused at start-up, with one line naming them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from tinyserve import cli
from tinyserve.config import build_config, parse_args
from tinyserve.options import ENGINE, FRONTEND, LLAMA_MAX_SEQ, SERVE

REFUSED = [
    ({"slots": 300, "max_batch_tokens": 256}, ["--slots 300", "--max-batch-tokens 256"]),
    ({"block_size": 8192, "ctx_per_slot": 4096}, ["--block-size 8192", "--ctx-per-slot 4096"]),
    ({"slots": 257, "max_batch_tokens": 512}, ["--slots 257", "256"]),
    ({"cache_dir": "/tmp/x", "host_cache_mb": 0}, ["--cache-dir", "--host-cache-mb"]),
    ({"cache_dir": "/tmp/x", "prefix_cache": False}, ["--cache-dir", "--prefix-cache"]),
    ({"speculate": "draft"}, ["--speculate draft", "--draft-model"]),
    ({"draft_model": "/m.gguf", "speculate": "ngram"}, ["--draft-model", "ngram"]),
    ({"draft_model": "/m.gguf", "speculate": "off"}, ["--draft-model", "off"]),
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
    at_limits = {"slots": 256, "max_batch_tokens": 256, "block_size": 256, "ctx_per_slot": 256}
    assert build_config(at_limits, environ={}, role=ENGINE).slots == LLAMA_MAX_SEQ


def test_gpu_settings_are_parsed_and_handed_on_to_the_engine() -> None:
    config = cli_config(["--gpu-layers", "all", "--tensor-split", "3, 1", "--split-mode", "row"])
    assert (config.gpu_layers, config.tensor_split, config.split_mode) == (-1, "3,1", "row")
    again = cli_config(config.flags_for(ENGINE))
    assert (again.gpu_layers, again.tensor_split) == (-1, "3,1")
    assert cli_config(["--gpu-layers", "12"]).gpu_layers == 12


@pytest.mark.parametrize("argv", [["--gpu-layers", "many"], ["--tensor-split", "3,x"]])
def test_gpu_settings_that_say_nothing_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        cli_config(argv)


def cli_config(argv: list[str]) -> Any:
    return parse_args(ENGINE, argv)


def test_a_draft_model_given_is_the_one_that_guesses() -> None:
    assert cli_config([]).speculate == "ngram"
    config = cli_config(["--draft-model", "/m.gguf"])
    assert (config.speculate, config.draft_model) == ("draft", "/m.gguf")
    assert cli_config(config.flags_for(ENGINE)).speculate == "draft"
    env = {"TINYSERVE_DRAFT_MODEL": "/m.gguf"}
    assert build_config({}, environ=env, role=ENGINE).speculate == "draft"


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


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["serve", "--ctx", "4096"], "--ctx was removed: use --ctx-per-slot"),
        (["engine", "--kv-layout", "slots"], "--kv-layout was removed: use --ctx-per-slot"),
        (["engine", "--cache-seqs", "2"], "--cache-seqs was removed: use --host-cache-mb"),
        # a prefix of a flag is not taken for it
        (["engine", "--ctx-per", "512"], "unrecognized arguments: --ctx-per 512"),
    ],
)
def test_removed_and_abbreviated_flags_are_usage_errors(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main(argv)
    assert refused.value.code == 2
    assert said in capsys.readouterr().err


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
