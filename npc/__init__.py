"""NPC lines: character cards, line templates with holes, batched variants, exports.

No UI here: the `dgchat npc` command, the `dgchat serve` API and the app's NPC workshop screen all
drive these functions and classes. See docs/NPC.md for the file formats and the API.
"""

from __future__ import annotations

from dgchat.npc.cards import CharacterCard, find_card, load_cards, parse_card, save_card
from dgchat.npc.errors import NpcError
from dgchat.npc.export import build_export, export_csv, export_json, validate_export, write_export
from dgchat.npc.generator import LENGTH_PRESETS, LineBatch, LineSpec, LineVariant, NpcGenerator, NpcProgress
from dgchat.npc.lines_file import load_lines_file
from dgchat.npc.templates import LineTemplate, parse_template

__all__ = [
    "LENGTH_PRESETS",
    "CharacterCard",
    "LineBatch",
    "LineSpec",
    "LineTemplate",
    "LineVariant",
    "NpcError",
    "NpcGenerator",
    "NpcProgress",
    "build_export",
    "export_csv",
    "export_json",
    "find_card",
    "load_cards",
    "load_lines_file",
    "parse_card",
    "parse_template",
    "save_card",
    "validate_export",
    "write_export",
]
