"""TinyServe's native core, compiled with Cython.

``kv_blocks`` (logical KV block accounting), ``batch_builder`` (rows into a ``llama_batch``),
``board`` (the shared-memory board) and ``radix`` (block-aligned prefix tree). Each module has
a ``.pyi`` stub that types its public surface for Python callers.
"""
