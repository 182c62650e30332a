"""pydantic v2 or msgspec for the HTTP API's models: the measurement behind the choice.

The same chat completions request model is declared in both libraries (strict types, unknown
fields refused, the same bounds), and each is timed parsing + validating a typical request
(one system and one user message, a few sampling fields) and a large one (200 messages of
~500 characters, ~100 KiB). Two paths per library: straight from the bytes (the library's own
JSON parser), and the stdlib parser with a duplicate-key hook first (the API refuses duplicate
keys, and neither library's parser does) followed by validation of the Python objects.
Import cost (time and RSS of a fresh interpreter that imports the library and declares the
model) is measured in subprocesses, best of five.

    .venv/bin/pip install msgspec   # not a dependency of the project
    .venv/bin/python bench/model_library.py [--runs 2000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

PYDANTIC_MODEL = """
from typing import Annotated, Literal
from pydantic import BaseModel, ConfigDict, Field

class Base(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

class TextPart(Base):
    type: Literal["text"]
    text: str

class Message(Base):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = None

class ChatRequest(Base):
    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1, le=4096)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
"""

MSGSPEC_MODEL = """
from typing import Annotated, Literal
import msgspec
from msgspec import Meta

class TextPart(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str

class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = None

class ChatRequest(msgspec.Struct, forbid_unknown_fields=True):
    model: Annotated[str, Meta(min_length=1)]
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_tokens: Annotated[int, Meta(ge=1, le=4096)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    seed: Annotated[int, Meta(ge=0, le=2**32 - 1)] | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
"""


def typical() -> bytes:
    messages = [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": "What is the capital of Germany, and why is it there?"},
    ]
    body = {"model": "m", "messages": messages, "max_tokens": 64, "temperature": 0.7,
            "top_p": 0.9, "seed": 7, "stop": ["\n\n"], "stream": True}  # fmt: skip
    return json.dumps(body).encode()


def large() -> bytes:
    turn = "lorem ipsum dolor sit amet " * 18  # ~490 characters
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": f"{i} {turn}"} for i in range(200)]
    return json.dumps({"model": "m", "messages": messages, "max_tokens": 64}).encode()


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError("duplicate key")
    return dict(pairs)


def stdlib_load(body: bytes) -> Any:
    return json.loads(body, object_pairs_hook=_unique)


def per_call_us(fn: Callable[[], object], runs: int) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(runs):
            fn()
        best = min(best, (time.perf_counter() - started) / runs * 1e6)
    return best


def declare(source: str) -> Any:
    # dont_inherit: this module's "from __future__ import annotations" must not turn the
    # model's annotations into strings that the libraries would resolve in the wrong scope.
    scope: dict[str, Any] = {}
    exec(compile(source, "model", "exec", dont_inherit=True), scope)
    return scope["ChatRequest"]


def parse_costs(runs: int) -> dict[str, dict[str, float]]:
    import msgspec

    pyd, msg = declare(PYDANTIC_MODEL), declare(MSGSPEC_MODEL)
    decoder = msgspec.json.Decoder(msg)
    costs: dict[str, dict[str, float]] = {}
    for name, body in (("typical", typical()), ("large", large())):
        n = runs if name == "typical" else max(runs // 50, 20)
        costs[name] = {
            "stdlib json + dup hook only": per_call_us(lambda b=body: stdlib_load(b), n),
            "pydantic from bytes": per_call_us(lambda b=body: pyd.model_validate_json(b), n),
            "pydantic after stdlib": per_call_us(
                lambda b=body: pyd.model_validate(stdlib_load(b)), n
            ),
            "msgspec from bytes": per_call_us(lambda b=body: decoder.decode(b), n),
            "msgspec after stdlib": per_call_us(
                lambda b=body: msgspec.convert(stdlib_load(b), msg), n
            ),
        }
    return costs


def import_cost(model_source: str) -> tuple[float, float]:
    """Seconds to import the library and declare the model, and the RSS it added (MiB)."""
    script = textwrap.dedent(
        """
        import time, resource
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
        before, started = rss(), time.perf_counter()
        exec(compile(SOURCE, "model", "exec"), {})
        print(time.perf_counter() - started, (rss() - before) / 2**20)
        """
    ).replace("SOURCE", repr(model_source))
    best = (float("inf"), float("inf"))
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True)
        seconds, mib = (float(x) for x in out.stdout.split())
        best = (min(best[0], seconds), min(best[1], mib))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()
    print(f"request sizes: typical {len(typical())} B, large {len(large())} B")
    for name, rows in parse_costs(args.runs).items():
        print(f"\nparse + validate, {name} request (us per request, best of 3)")
        for label, us in rows.items():
            print(f"  {label:30s} {us:9.1f}")
    print("\nimport + declare the model (fresh interpreter, best of 5)")
    for label, source in (("pydantic", PYDANTIC_MODEL), ("msgspec", MSGSPEC_MODEL)):
        seconds, mib = import_cost(source)
        print(f"  {label:10s} {seconds * 1000:7.1f} ms  {mib:6.1f} MiB RSS")


if __name__ == "__main__":
    main()
