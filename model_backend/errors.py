"""Errors a user can cause. Each carries a one-line message that names the problem."""

from __future__ import annotations


class DgchatError(Exception):
    """Base for every error dgchat reports to the user instead of a traceback."""


class ModelFileError(DgchatError):
    """The model file is missing, truncated, not GGUF, or otherwise unusable."""


class UnsupportedModelError(DgchatError):
    """The file is a valid GGUF but not a model dgchat can run as a diffusion LM."""


class ContextOverflowError(DgchatError):
    """The prompt (plus the canvas) does not fit in the model's context."""


class InvalidParameterError(DgchatError):
    """A sampler or generation parameter is out of range or inconsistent."""


class EngineError(DgchatError):
    """llama.cpp refused or failed an operation."""


class GenerationCancelled(DgchatError):
    """The user cancelled a generation (Esc, Ctrl-C)."""


def error_text(exc: BaseException) -> str:
    """One line for the user: our own errors say what went wrong in their message; anything else
    (a bug, an OS error) is named by its type so a report can find it."""
    return str(exc) if isinstance(exc, DgchatError) else f"{type(exc).__name__}: {exc}"
