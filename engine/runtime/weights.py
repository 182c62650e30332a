"""Loading a model's weights: where llama.cpp puts them (CPU, GPUs), how it lays them out, and
which of its attention kernels runs over them."""

from __future__ import annotations

import ctypes
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from tinyserve.config import Config
from tinyserve.errors import EngineFatalError, ModelNotFoundError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSpec:
    """Where llama.cpp puts the weights (and with them the KV cache of their layers)."""

    layers: int = 0  # offloaded layers; GPU_LAYERS_ALL: all of them
    main_gpu: int = 0
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()

    @classmethod
    def from_config(cls, config: Config) -> GpuSpec:
        shares = tuple(float(x) for x in config.tensor_split.split(",") if x)
        return cls(config.gpu_layers, config.main_gpu, config.split_mode, shares)


_SPLIT_MODES = {
    "none": llama_cpp.LLAMA_SPLIT_MODE_NONE,
    "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
    "row": llama_cpp.LLAMA_SPLIT_MODE_ROW,
}


def model_params(
    repack: bool, gpu: GpuSpec = GpuSpec(), shares: ctypes.Array[ctypes.c_float] | None = None
) -> llama_cpp.llama_model_params:
    """How llama.cpp loads the weights: ``gpu.layers`` of them on the GPU (a negative count
    is all), split by ``shares`` (``gpu.tensor_split`` as llama.cpp's array, which the caller
    keeps alive through the load), repacked into its extra CPU buffer types (AMX,
    CPU_REPACK) only when ``repack``."""
    params: llama_cpp.llama_model_params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = gpu.layers
    params.main_gpu = gpu.main_gpu
    params.split_mode = _SPLIT_MODES[gpu.split_mode]
    if shares is not None:
        params.tensor_split = shares
    params.use_extra_bufts = repack
    return params


def check_gpu(gpu: GpuSpec) -> None:
    """Refuse GPU settings this build of llama.cpp cannot honour, with one line saying why."""
    if gpu.layers and not llama_cpp.llama_supports_gpu_offload():
        raise EngineFatalError(
            "--gpu-layers needs a llama-cpp-python built with a GPU backend; this one runs on "
            "the CPU only (docs/deploy.md: building it for CUDA)"
        )
    devices = llama_cpp.llama_max_devices()
    if len(gpu.tensor_split) > devices:
        raise EngineFatalError(
            f"--tensor-split names {len(gpu.tensor_split)} GPUs; at most {devices}"
        )


def repack_weights(mode: str) -> bool:
    """Whether to repack: ``on``/``off`` as given; ``auto`` repacks unless the CPU has AMX.
    NOTE: with the weights repacked for AMX, the vendored llama.cpp's AMX matmul segfaults on
    the first batch of more than one token (seen on this project's Xeon VMs with amx_tile;
    llama.cpp issue 20824 reports the same crash, unfixed), which would end the engine."""
    if mode != "auto":
        return mode == "on"
    if not cpu_has_amx():
        return True
    log.warning("weight repacking off: this CPU has AMX, whose kernels crash here (--repack on)")
    return False


FLASH_ATTN_ON = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
FLASH_ATTN_OFF = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED


def flash_attention(mode: str, kv_type: str, gpu: GpuSpec) -> int:
    """llama.cpp's ``flash_attn_type``: enabled or disabled for ``on``/``off``; for ``auto``,
    disabled where every layer runs on the CPU with f16 cells. There the vendored CPU kernel goes
    through a KV stream's rows one at a time below a tile of 64, each row slower than the
    plain matmuls' (a decode row at 4,500 cells 105 ms against 43 ms; bench/attention_tiles.py),
    and a server's ticks are mostly such rows. A quantized ``kv_type`` needs it (llama.cpp keeps
    a quantized V only with it), and on a GPU it is llama.cpp's own choice (``-fa auto``)."""
    if mode != "auto":
        return FLASH_ATTN_ON if mode == "on" else FLASH_ATTN_OFF
    if kv_type != "f16":
        return FLASH_ATTN_ON
    return llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO if gpu.layers else FLASH_ATTN_OFF


def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    return re.search(r"^flags\s*:.*\bamx_tile\b", text, re.MULTILINE) is not None


def load_model(path: Path, repack: bool, gpu: GpuSpec) -> llama_cpp.llama_model_p:
    """The weights of the GGUF at ``path``; ``ModelNotFoundError`` if llama.cpp cannot load it."""
    shares = None
    if gpu.tensor_split:
        shares = (ctypes.c_float * llama_cpp.llama_max_devices())(*gpu.tensor_split)
    model: llama_cpp.llama_model_p = llama_cpp.llama_model_load_from_file(
        str(path).encode(), model_params(repack, gpu, shares)
    )
    if not model:
        raise ModelNotFoundError(f"llama.cpp could not load model file: {path}")
    return model
