"""Stop strings matched on the raw byte stream of one sequence.

UTF-8 is self-synchronising, so a stop string's bytes occur in the output bytes exactly where
its characters occur in the text; matching bytes avoids decoding in the engine. Bytes that
could still be the start of a stop string are held back until they cannot.
"""

from __future__ import annotations


class StopMatcher:
    """Feed each token's bytes; get back what is safe to show and whether a stop matched."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s.encode("utf-8") for s in stops if s]
        self._pending = b""
        self.stopped = False

    def feed(self, piece: bytes) -> bytes:
        """Add ``piece``; return the bytes now safe to emit. Sets ``stopped`` on a match."""
        if not self._stops:
            return piece
        buf = self._pending + piece
        cut = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._pending = b""
            self.stopped = True
            return buf[:cut]
        hold = self._held_suffix(buf)
        self._pending = buf[len(buf) - hold :]
        return buf[: len(buf) - hold]

    def flush(self) -> bytes:
        """At the end of generation nothing can match any more: release what was held."""
        rest, self._pending = self._pending, b""
        return rest

    def _held_suffix(self, buf: bytes) -> int:
        longest = max(len(s) for s in self._stops) - 1
        for k in range(min(len(buf), longest), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0
