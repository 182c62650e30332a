"""Guesses from a draft model: a smaller model of the same vocabulary (``--draft-model``,
llama-server's ``-md``) writes each guessing sequence's next tokens, greedily.

The draft has a context of its own on the engine's slots, a stream of cells per slot, and
keeps in each slot the tokens it last read there. A tick's guesses: every guessing sequence's
text (prompt and output) that its slot's cells do not hold yet is read in (all sequences in
one ``llama_decode``, in batches of the context's size), where the cells part from the text
they are dropped first; then the draft picks a token after the text and after each token
it picked, one ``llama_decode`` per guessed position for all sequences at once, until each
has the tokens it asked for (or an end of generation). The target checks the guesses as it
checks prompt-lookup ones (``Runner._verify``), so a draft model changes how fast a reply comes,
never what it says. The cells of guesses the target did not take are dropped on the next
tick, when the text no longer matches them.

A draft that fails to decode guesses nothing that tick and starts from empty cells: a
guess is an optimisation, never a reason to end a request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tinyserve.engine.kv.resident import common_start
from tinyserve.engine.model.runner import time_rows
from tinyserve.engine.runtime.runtime import LlamaRuntime
from tinyserve.errors import EngineFatalError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Ask:
    """A sequence's ask for this tick: ``k`` guesses after ``text`` (its prompt and output,
    the last token included), in the draft's cells of ``slot``."""

    slot: int
    text: list[int]
    k: int


class DraftModel:
    """The draft model's context and what each slot's cells hold."""

    def __init__(self, draft: LlamaRuntime, target: LlamaRuntime) -> None:
        problem = target.vocab_mismatch(draft)
        if problem:
            raise EngineFatalError(
                f"--draft-model {draft.spec.model_path.name} cannot guess for "
                f"{target.spec.model_path.name}: {problem}"
            )
        if draft.n_ctx_seq < target.n_ctx_seq:
            raise EngineFatalError(
                f"--draft-model {draft.spec.model_path.name} holds {draft.n_ctx_seq} tokens per "
                f"slot, the served model {target.n_ctx_seq}"
            )
        draft.clear()
        self.runtime = draft
        self.held: dict[int, list[int]] = {}  # by slot: the tokens its cells hold

    def guesses(self, asks: list[Ask]) -> dict[int, list[int]]:
        """Each slot's guesses (at most its ``k``), by slot; none for any when a decode fails."""
        asks = [ask for ask in asks if ask.k > 0 and ask.text]
        if not asks:
            return {}
        try:
            picks = self._read(asks)
            guesses = {slot: [token] for slot, token in picks.items()}
            self._extend(asks, guesses)
        except _DraftFailed as failed:
            log.warning("the draft model guesses nothing this tick: %s", failed)
            self.runtime.clear()
            self.held.clear()
            return {}
        return guesses

    def time_rows(self, rows: int) -> float:
        """Seconds a draft decode of ``rows`` rows with logits takes (in slot 0, whose cells
        are dropped first and after), or -1 when it fails: what the draft's picks cost."""
        self.runtime.forget(0)
        self.held.pop(0, None)
        return time_rows(self.runtime, 0, 0, 0, rows)

    def _read(self, asks: list[Ask]) -> dict[int, int]:
        """Read each text into its slot's cells; the draft's pick after each text, by slot."""
        todo: dict[int, tuple[int, list[int]]] = {}  # slot: (next position, text)
        for ask in asks:
            held = self.held.setdefault(ask.slot, [])
            # the last token is read again in any case: the first guess needs its logits
            keep = min(common_start(held, ask.text), len(ask.text) - 1)
            self.runtime.forget(ask.slot, keep)
            del held[keep:]
            todo[ask.slot] = (keep, ask.text)
        builder, picks = self.runtime.batch, dict[int, int]()
        while todo:
            builder.clear()
            last_rows: dict[int, int] = {}
            for slot, (start, text) in list(todo.items()):
                n = min(len(text) - start, builder.free)
                if n <= 0:
                    break
                row = builder.add_span(text, start, n, start, slot, start + n == len(text))
                if start + n == len(text):
                    last_rows[slot] = row
                    del todo[slot]
                else:
                    todo[slot] = (start + n, text)
                self.held[slot].extend(text[start : start + n])
            self._decode()
            if last_rows:
                tokens = self.runtime.argmax(list(last_rows.values()))
                picks.update(zip(last_rows, tokens, strict=True))
        return picks

    def _extend(self, asks: list[Ask], guesses: dict[int, list[int]]) -> None:
        """Pick after each picked token until every slot has its ``k`` (or picked an end)."""
        builder = self.runtime.batch
        k = {ask.slot: ask.k for ask in asks}
        while True:
            going = [
                slot
                for slot, guess in guesses.items()
                if len(guess) < k[slot] and not self.runtime.is_eog(guess[-1])
            ]
            if not going:
                return
            builder.clear()
            rows = []
            for slot in going:
                held = self.held[slot]
                rows.append(builder.add(guesses[slot][-1], len(held), slot, True))
                held.append(guesses[slot][-1])
            self._decode()
            for slot, token in zip(going, self.runtime.argmax(rows), strict=True):
                guesses[slot].append(token)

    def _decode(self) -> None:
        status = self.runtime.decode()
        if status != 0:
            raise _DraftFailed(f"llama_decode returned {status}")


class _DraftFailed(Exception):
    pass
