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
