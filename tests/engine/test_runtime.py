"""How the runtime loads the weights: repacked into llama.cpp's extra buffer types or not."""

from __future__ import annotations

import logging
from pathlib import Path

import llama_cpp
import pytest

from tinyserve.config import parse_args
from tinyserve.engine.runtime import weights as weights_module
from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec
from tinyserve.engine.runtime.weights import (
    FLASH_ATTN_OFF,
    FLASH_ATTN_ON,
    GpuSpec,
    cpu_has_amx,
    flash_attention,
    model_params,
    repack_weights,
)
from tinyserve.options import GPU_LAYERS_ALL

from .conftest import core_config

SAPPHIRE = "processor\t: 0\nflags\t\t: fpu sse avx512f amx_bf16 amx_tile amx_int8\n"
ZEN = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


def test_amx_is_read_from_the_flags_line(tmp_path: Path) -> None:
    assert cpu_has_amx(write(tmp_path, SAPPHIRE))
    assert not cpu_has_amx(write(tmp_path, ZEN))
    # Only a whole flag on the flags line counts.
    assert not cpu_has_amx(write(tmp_path, "model name\t: amx_tile\nflags\t\t: fpu\n"))
    assert not cpu_has_amx(write(tmp_path, "flags\t\t: fpu amx_tile_x\n"))
    assert not cpu_has_amx(tmp_path / "missing")


@pytest.mark.parametrize("has_amx", [True, False])
def test_on_and_off_are_obeyed_whatever_the_cpu(
    monkeypatch: pytest.MonkeyPatch, has_amx: bool
) -> None:
    monkeypatch.setattr(weights_module, "cpu_has_amx", lambda: has_amx)
    assert repack_weights("on") is True
    assert repack_weights("off") is False


def test_auto_repacks_unless_the_cpu_has_amx_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(weights_module, "cpu_has_amx", lambda: False)
    assert repack_weights("auto") is True
    assert not caplog.records
    monkeypatch.setattr(weights_module, "cpu_has_amx", lambda: True)
    with caplog.at_level(logging.WARNING):
        assert repack_weights("auto") is False
    [line] = caplog.records
    assert line.getMessage().startswith("weight repacking off: this CPU has AMX")


def test_model_params_carry_the_choice() -> None:
    assert model_params(True).use_extra_bufts is True
    assert model_params(False).use_extra_bufts is False
    assert model_params(False).n_gpu_layers == 0


def test_the_flag_reaches_the_runtime_spec() -> None:
    assert RuntimeSpec.from_config(core_config()).repack == "auto"
    assert RuntimeSpec.from_config(parse_args("engine", ["--repack", "off"])).repack == "off"
    with pytest.raises(SystemExit):
        parse_args("engine", ["--repack", "sometimes"])


def test_flash_attention_is_off_on_the_cpu_with_f16_cells_and_on_where_it_is_needed() -> None:
    cpu, auto = GpuSpec(), llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
    assert flash_attention("auto", "f16", cpu) == FLASH_ATTN_OFF
    assert flash_attention("auto", "q8_0", cpu) == FLASH_ATTN_ON  # a quantized V needs it
    assert flash_attention("auto", "f16", GpuSpec(layers=GPU_LAYERS_ALL)) == auto  # llama.cpp's
    assert flash_attention("on", "f16", cpu) == FLASH_ATTN_ON
    assert flash_attention("off", "f16", GpuSpec(layers=4)) == FLASH_ATTN_OFF


def test_a_quantized_kv_type_with_flash_attention_off_is_refused_at_start() -> None:
    with pytest.raises(SystemExit, match="--kv-type q4_0 needs flash attention"):
        parse_args("engine", ["--kv-type", "q4_0", "--flash-attn", "off"])
    assert parse_args("engine", ["--kv-type", "q8_0"]).flash_attn == "auto"
    assert RuntimeSpec.from_config(parse_args("engine", ["--flash-attn", "on"])).flash_attn == "on"


def test_the_context_attends_as_auto_chose(runtime: LlamaRuntime) -> None:
    # The shared runtime is the default config's: every layer on the CPU, f16 cells.
    assert runtime.kv_types["flash_attn"] == 0


def test_a_batch_of_many_tokens_decodes_with_the_weights_as_auto_loads_them(
    runtime: LlamaRuntime,
) -> None:
    # The crash that auto avoids came on the first batch of more than one token.
    runtime.clear()  # what engine cores before left in their slots' cells
    batch = runtime.batch
    batch.clear()
    for position, token in enumerate(range(1000, 1040)):
        batch.add(token, position, 0, position == 39)
    assert runtime.decode() == 0
    runtime.forget(0)
