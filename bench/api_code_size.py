"""How many lines the HTTP API's validation, schema and reply code takes (issue 19).

A code line is a line holding a token of code: blank lines, comments and docstrings (the
first string of a module, class or function, found with ``ast``) do not count; a string that
spans lines counts each of its lines. Three file sets, each read at its own commit with
``git show`` (or, for ``now`` without ``--now``, from the working tree):

- ``checkers`` at c00c728, the last commit before the models: the hand-written field
  checkers, parsers and tables (validation, openai_schema, openai_messages), the schema
  dicts and the document builder (openapi_schemas, openapi), the reply builders (replies,
  openai_replies) and the timeline route with its schema dict (timelines).
- ``models`` at fd3a3ae, the models as first finished: ``frontend/models/``, the document
  builder, the reply builders, the timeline route, and the resolved request (generation).
- ``now``: the same kinds of code in today's tree, where they moved to; ``*`` marks files of
  features added since fd3a3ae (tool calls, response_format, the tokenizer routes, several
  choices in one reply). Left out everywhere, as in the first count: route handlers, the
  logprob formatting, the chat template, the grammar code (``structured/``).

``--reply`` counts the reply side instead (issue 45; ``REPLY_SETS``).

    .venv/bin/python bench/api_code_size.py [--now COMMIT] [--files] [--reply]
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
F = "frontend/"
M = "frontend/models/"

CHECKERS = (
    F + "validation.py", F + "openai_schema.py", F + "openai_messages.py",
    F + "openapi_schemas.py", F + "openapi.py", F + "replies.py", F + "openai_replies.py",
    F + "timelines.py",
)  # fmt: skip
MODELS = (
    M + "chat.py", M + "common.py", M + "errors.py", M + "fields.py", M + "native.py",
    M + "openai_replies.py", M + "openai_requests.py", M + "parse.py",
    F + "openapi.py", F + "replies.py", F + "openai_replies.py", F + "timelines.py",
    F + "generation.py",
)  # fmt: skip
NEW_FEATURES = (
    M + "response_format.py", F + "tokenize/tokenize_bodies.py", M + "tools.py",
    F + "openai/choices.py",
)  # fmt: skip
NOW = (
    M + "chat.py", M + "conversation.py", M + "common.py", M + "errors.py", M + "fields.py",
    F + "native/native_bodies.py",
    F + "openai/openai_replies.py", F + "openai/openai_requests.py", M + "parse.py",
    F + "http/openapi_document.py", F + "request/sse.py", F + "native/native_reply.py",
    F + "openai/openai_reply.py", F + "native/request_timeline.py", F + "request/generation.py",
    *NEW_FEATURES,
)  # fmt: skip
SETS = {"checkers": ("c00c728", CHECKERS), "models": ("fd3a3ae", MODELS)}
# --reply (issue 45): the reply side of the surfaces that speak in conversations, the chat
# reply's reading and each surface's encoders, streamed and whole, with the several-choice
# runner and the logprobs; at 4dcd609, the tree issue 45 was filed against, and now, where
# its shared pieces went to chat/. The reply parser (structured/) is counted on its own.
REPLY_BEFORE = (
    F + "anthropic/anthropic_reply.py", F + "openai/chat_output.py", F + "openai/choices.py",
    F + "openai/openai_logprobs.py", F + "openai/openai_reply.py", F + "openai/openai_stream.py",
    F + "responses/responses_reply.py",
)  # fmt: skip
REPLY_NOW = (
    F + "anthropic/anthropic_reply.py", F + "chat/chat_output.py", F + "chat/ending.py",
    F + "chat/logprobs.py", F + "chat/reply_ids.py", F + "openai/choices.py",
    F + "openai/openai_logprobs.py", F + "openai/openai_reply.py", F + "openai/openai_stream.py",
    F + "responses/responses_reply.py",
)  # fmt: skip
PARSER = (F + "structured/reply_parser.py",)
REPLY_SETS = {
    "reply": ("4dcd609", REPLY_BEFORE), "parser": ("4dcd609", PARSER),
    "reply now": (None, REPLY_NOW), "parser now": (None, PARSER),
}  # fmt: skip

_NOT_CODE = frozenset({
    tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
    tokenize.ENDMARKER, tokenize.ENCODING,
})  # fmt: skip
_HAS_DOCSTRING = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def code_lines(source: str) -> int:
    """How many lines of ``source`` hold code (not blank, comment or docstring)."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, _HAS_DOCSTRING) and ast.get_docstring(node, clean=False) is not None:
            first = node.body[0]
            docstrings.update(range(first.lineno, (first.end_lineno or 0) + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def source_at(commit: str | None, path: str) -> str:
    """``path`` as ``commit`` has it; the working tree's copy when ``commit`` is None."""
    if commit is None:
        return (ROOT / path).read_text(encoding="utf-8")
    out = subprocess.run(
        ["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout


def count(commit: str | None, paths: tuple[str, ...]) -> dict[str, int]:
    """Code lines of each of ``paths`` at ``commit``."""
    return {path: code_lines(source_at(commit, path)) for path in paths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--now", help="count the 'now' set at this commit, not the working tree")
    parser.add_argument("--files", action="store_true", help="also print each file's count")
    parser.add_argument("--reply", action="store_true", help="the reply side (issue 45)")
    args = parser.parse_args()
    sets = REPLY_SETS if args.reply else {**SETS, "now": (args.now, NOW)}
    for name, (commit, paths) in sets.items():
        counts = count(commit, paths)
        where = commit or "working tree"
        new = sum(n for path, n in counts.items() if path in NEW_FEATURES)
        extra = f" (files of new features: {new})" if new and not args.reply else ""
        print(f"{name:10s} {where:13s} {sum(counts.values()):6,d} code lines{extra}")
        if args.files:
            for path, n in counts.items():
                print(f"    {n:5d} {'*' if path in NEW_FEATURES else ' '} {path}")


if __name__ == "__main__":
    main()
