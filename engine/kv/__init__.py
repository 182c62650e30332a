"""Where each request's KV lives: its slot's cells, the prefix cache in host memory and on disk.
The seed's KV accountant and radix cache (``host_cache.py``, over ``tinyserve_native``'s)."""
