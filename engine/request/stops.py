"""Stop strings matched on the raw byte stream of one sequence.

UTF-8 is self-synchronising, so a stop string's bytes occur in the output bytes exactly where
its characters occur in the text; matching bytes avoids decoding in the engine. Bytes that
could still be the start of a stop string are held back until they cannot.
"""

from __future__ import annotations


class StopMatcher:
    """Feed each token's bytes; get back what is safe to show and which stop matched."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = [(s.encode("utf-8"), s) for s in stops if s]
        self._pending = b""
        self.matched: str | None = None  # the stop string that ended the output

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def feed(self, piece: bytes) -> bytes:
        """Add ``piece``; return the bytes now safe to emit. Sets ``matched`` on a match: the
        stop that starts first (of two starting there, the first given)."""
        if not self._stops:
            return piece
        buf = self._pending + piece
        found = [(at, i) for i, (s, _) in enumerate(self._stops) if (at := buf.find(s)) >= 0]
        if found:
            cut, first = min(found)
            self._pending = b""
            self.matched = self._stops[first][1]
            return buf[:cut]
        hold = self._held_suffix(buf)
        self._pending = buf[len(buf) - hold :]
        return buf[: len(buf) - hold]

    def flush(self) -> bytes:
        """At the end of generation nothing can match any more: release what was held."""
        rest, self._pending = self._pending, b""
        return rest

    def _held_suffix(self, buf: bytes) -> int:
        longest = max(len(s) for s, _ in self._stops) - 1
        for k in range(min(len(buf), longest), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s, _ in self._stops):
                return k
        return 0
