"""Errors raised by the converter. All of them are user-facing one-liners."""

from __future__ import annotations

from dgchat.model_backend.errors import DgchatError


class ConvertError(DgchatError):
    """The source cannot be converted (bad input, unsupported model, no disk space...)."""
