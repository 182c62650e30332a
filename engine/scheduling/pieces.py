"""How a tick's prompt rows are cut: into pieces that llama.cpp's CPU attention takes in tiles.

With a KV stream per slot, llama.cpp splits a batch into ubatches of as many rows of each
sequence (``split_equal``): a tick holding three decode rows and prompt pieces of 128 and 61
rows runs as a ubatch of one row of each of the five sequences, one of 60 rows of each of the
two prompts and one of the 68 rows left of the longer. The CPU backend's flash attention takes
a stream's query rows in tiles of ``TILE`` (``GGML_FA_TILE_Q``); a ubatch with fewer rows than
that for each stream goes through them one at a time, and a row then costs 2x what it costs in
a tile at 256 cells of context and 8x at 4,500 (``docs/benchmarks.md``, "Prompt pieces and
llama.cpp's attention tiles"). In the agent sessions such ticks took 5-16 s where the same rows
in whole tiles take about 1.5 s. Hence two rules:

- a prompt is cut into even pieces of at most ``--chunk``: 132 tokens are two pieces of 66, not
  128 and then 4 rows at the full price of 4 decode rows; at ``--chunk 128`` every piece of a
  prompt of 129 tokens or more is then 64 rows or more;
- the pieces of one tick are of one length, so that the ubatch of each length holds every
  prompt's rows of the tick at once and none is left with a remainder below a tile.
"""

from __future__ import annotations

TILE = 64  # GGML_FA_TILE_Q of the vendored llama.cpp's CPU backend


def next_piece(left: int, chunk: int) -> int:
    """The next piece of a prompt with ``left`` tokens still to prefill: the rest cut into as
    few pieces of at most ``chunk`` as will do, as even as can be, the longer ones first."""
    if left <= chunk:
        return left
    pieces = -(-left // chunk)
    return -(-left // pieces)
