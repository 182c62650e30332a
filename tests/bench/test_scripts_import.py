"""Every script in bench/ still imports: a test helper or a module it names that has moved
would otherwise go unnoticed until someone runs the benchmark (bench/chunking_noise.py imported
a test file removed weeks before). Imports only; no script's ``main`` runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# Run with another environment's interpreter, as its docstring says: it needs packages that
# TinyServe does not depend on.
ELSEWHERE = {"gguf_tokenizer"}

# One fresh interpreter for all of them: bench/ goes first on its path (the scripts import
# each other by bare name, and some names, such as ``profile``, are also the standard
# library's), which must not leak into the test process.
CHECK = """
import importlib, sys, traceback
sys.path[:0] = [sys.argv[1], sys.argv[2]]
for name in sys.argv[3:]:
    try:
        importlib.import_module(name)
    except Exception:
        print(f"{name}: {traceback.format_exc(limit=1).strip().splitlines()[-1]}")
"""


def test_every_bench_script_imports() -> None:
    scripts = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in ELSEWHERE)
    assert "vs_llama_server" in scripts and "chunking_noise" in scripts
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(BENCH), str(ROOT), *scripts],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == "", f"bench scripts that do not import:\n{out.stdout}"
