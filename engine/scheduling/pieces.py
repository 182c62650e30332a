"""How a tick's prompt rows are cut: into pieces that llama.cpp's CPU attention takes in tiles.

With a KV stream per slot, llama.cpp splits a batch into ubatches of as many rows of each
sequence (``split_equal``): a tick holding three decode rows and prompt pieces of 128 and 61
rows runs as a ubatch of one row of each of the five sequences, one of 60 rows of each of the
two prompts and one of the 68 rows left of the longer. The CPU backend's flash attention takes
a stream's query rows in tiles of ``TILE`` (``GGML_FA_TILE_Q``), a tile costing the same however
few of its rows are filled; a ubatch with fewer rows than a tile for each stream goes through
them one at a time, and a row then costs 2x what it costs in a tile at 256 cells of context and
8x at 4,500 (``docs/benchmarks.md``, "Prompt pieces and llama.cpp's attention tiles"). In the
agent sessions such ticks took 5-16 s where the same rows in whole tiles take about 1.5 s.
Hence two rules:

- a prompt is cut into pieces of ``--chunk``, and where that would leave a last piece of
  ``SMALL`` to ``TILE`` rows, the last two pieces are cut so that the last is ``TILE + 1`` (the
  piece's first row goes in the ubatch of one row of each sequence when others decode): 160
  tokens at ``--chunk 128`` are pieces of 95 and 65, three tiles, not 128 and 32 rows one at a
  time. A last piece under ``SMALL`` rows costs less alone than the tile it would add;
- the pieces of one tick are of one length, so that the ubatch of each length holds every
  prompt's rows of the tick at once and none is left with a remainder below a tile.
"""

from __future__ import annotations

TILE = 64  # GGML_FA_TILE_Q of the vendored llama.cpp's CPU backend
# A last piece this short costs less one row at a time than one more tile: at 4,500 cells a
# row alone costs about an eighth of a tile (77 ms against 550 ms, bench/attention_tiles.py).
SMALL = TILE // 8


def next_piece(left: int, chunk: int) -> int:
    """The next piece of a prompt with ``left`` tokens still to prefill: ``chunk`` tokens, the
    rest when it fits in one, or what leaves a last piece of ``TILE + 1`` instead of one of
    ``SMALL`` to ``TILE`` tokens."""
    if left <= chunk:
        return left
    rest, last = left - chunk, TILE + 1
    if SMALL <= rest < last and left - last >= last:
        return left - last
    return chunk
