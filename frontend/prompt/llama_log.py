"""What llama.cpp says, routed: its log lines go to our logging (debug), and while a grammar
is built they are captured with its stderr, where it tells why a grammar does not build."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import llama_cpp

log = logging.getLogger(__name__)

# llama.cpp's log lines while a capture runs; None otherwise.
_captured: list[str] | None = None


def _route(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", "replace")
    if _captured is not None:
        _captured.append(message)
    elif message.strip():
        log.debug("llama.cpp: %s", message.rstrip())


# llama.cpp keeps a pointer to the callback: the object must outlive every call into it.
_CALLBACK = llama_cpp.llama_log_callback(_route)


def route_llama_log() -> None:
    """Send llama.cpp's log lines here from now on (before a model load: llama-cpp-python's
    own callback prints them to stderr)."""
    llama_cpp.llama_log_set(_CALLBACK, ctypes.c_void_p(0))


@contextmanager
def captured() -> Iterator[Callable[[], str]]:
    """Collect what llama.cpp says in the block, on file descriptor 2 (C ``fprintf``) and
    through its log callback. The handlers of Python's logging are held for the block (well
    under a millisecond), so no log line of another thread lands in the capture instead of
    the real stderr."""
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.acquire()
    global _captured
    chunks: list[str] = []
    _captured = chunks
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as capture:
            sys.stderr.flush()
            os.dup2(capture.fileno(), 2)
            try:
                yield lambda: "".join(chunks)
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                capture.seek(0)
                chunks.append(capture.read().decode("utf-8", "replace"))
    finally:
        _captured = None
        os.close(saved)
        for handler in handlers:
            handler.release()


# What llama.cpp writes when a grammar does not build: a parse error (with the grammar's text
# after it), a missing root rule, left recursion.
_GRAMMAR_ERRORS = (
    re.compile(r"error parsing grammar: (.+)"),
    re.compile(r"(grammar does not contain a .root. symbol)"),
    re.compile(r"(left recursion detected for nonterminal at index \d+)"),
)


def grammar_error(said: str) -> str:
    """Why a grammar did not build, from what llama.cpp said meanwhile."""
    for pattern in _GRAMMAR_ERRORS:
        found = pattern.search(said)
        if found:
            return found.group(1).strip()
    return "llama.cpp could not build it"
