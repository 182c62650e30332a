"""Errors shared by the processes, in the two tiers the engine distinguishes.

``RequestError`` ends one request (``finish_reason: "error"``) and the engine keeps serving;
``EngineFatalError`` means the engine itself cannot go on.
"""

from __future__ import annotations


class TinyServeError(Exception):
    """Base of this project's own exceptions."""


class ModelNotFoundError(TinyServeError):
    """The model file is missing or unreadable; the message names the path."""


class RequestError(TinyServeError):
    """One request failed; others are unaffected."""


class EngineFatalError(TinyServeError):
    """The engine cannot continue (model failed to load, llama.cpp returned a fatal error)."""
