"""Where NPC files live: cards under <data dir>/npc/cards (the app's data folder, dgchat.paths).

Writes go through dgchat.paths' atomic writers (re-exported here for the npc modules)."""

from __future__ import annotations

from pathlib import Path

from dgchat.paths import APP_NAME, atomic_write_bytes, atomic_write_text, data_dir  # noqa: F401 - re-exported


def cards_dir() -> Path:
    return data_dir() / "npc" / "cards"
