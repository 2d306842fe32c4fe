"""Errors a user can cause with NPC files and requests (one-line messages, shown as `dgchat: error: ...`)."""

from __future__ import annotations

from dgchat.model_backend.errors import DgchatError


class NpcError(DgchatError):
    """Base of the NPC errors."""


class CardError(NpcError):
    """A character card is missing, not TOML, or has a bad field."""


class TemplateError(NpcError):
    """A line template does not parse, or cannot be put on a canvas."""


class MissingVariableError(TemplateError):
    """A template uses a {name} slot that no variable fills."""


class LinesFileError(NpcError):
    """A lines file (lines.toml) is missing, not TOML, or has a bad entry."""


class ExportError(NpcError):
    """An export cannot be written or does not match the schema."""
