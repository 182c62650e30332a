"""Bodies as the agents send them, with parts replaced at random by other JSON (a tool
schema whose ``type`` is an object, a block that is a number, a list where an object goes):
every one is answered with a 2xx or a 4xx naming the field, never a 5xx."""

from __future__ import annotations

import copy
import random
from typing import Any

from aiohttp.test_utils import TestClient

from tests.frontend.anthropic.test_anthropic_handlers import CLAUDE_CODE, replying
from tests.frontend.harness import FakeEngine
from tests.frontend.responses.test_responses_handlers import CODEX

Client = TestClient[Any, Any]
MUTANTS = 120  # bodies per route
ODD_VALUES: list[Any] = [
    None, True, 0, -1, 2.5, 10**20, "", "x", "object", [], [1, "a"], {}, {"type": {}},
    {"type": ["string", {}]}, {"$ref": "#/$defs/x"}, {"type": "integer", "minimum": 0.5},
    {"properties": {"a": 3}}, {"enum": []}, [[[]]], {"a": {"b": {"c": None}}},
]  # fmt: skip


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path] if path else []
    if isinstance(value, dict | list):
        children = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in children:
            found += _paths(child, (*path, key))
    return found


def mutants(body: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """``MUTANTS`` copies of ``body``, each with one to three places replaced."""
    rng, paths, out = random.Random(seed), _paths(body), []
    for _ in range(MUTANTS):
        mutant = copy.deepcopy(body)
        for path in rng.sample(paths, rng.randint(1, 3)):
            holder = mutant
            try:
                for key in path[:-1]:
                    holder = holder[key]
                holder[path[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
            except (KeyError, IndexError, TypeError):
                continue  # an earlier replacement took this place away
        out.append(mutant)
    return out


async def test_no_mutant_of_an_agents_body_is_a_5xx(served: Client, engine: FakeEngine) -> None:
    engine.script = replying("Hi")
    statuses: list[int] = []
    for route, body, seed in (("/v1/messages", CLAUDE_CODE, 1),
                              ("/v1/messages/count_tokens", CLAUDE_CODE, 2),
                              ("/v1/responses", CODEX, 3)):  # fmt: skip
        for mutant in mutants({**body, "stream": False}, seed):
            response = await served.post(route, json=mutant)
            text = await response.text()
            assert response.status < 500, (route, mutant, text)
            statuses.append(response.status)
    # Both kinds of answer came: the replacements made valid bodies and invalid ones.
    assert {s // 100 for s in statuses} == {2, 4}
