"""Character cards: who speaks a line. TOML files, one card per file or several as [[card]].

A card (docs/NPC.md):

    id = "gate_guard"            # optional; default: the name in lower case, non-alphanumerics -> _
    name = "Captain Brann"       # required
    role = "the night captain of the city gate"
    setting = "A walled trading city in a cold northern valley."
    voice = "Gruff, clipped sentences. Calls strangers 'traveller'."
    examples = ["Move along, traveller.", "Gate's shut till dawn."]
    banned_words = ["okay", "dude"]

`CharacterCard.system_prompt()` renders it as the persona the model is given.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgchat import toml_files
from dgchat.npc.errors import CardError
from dgchat.npc.paths import atomic_write_text, cards_dir
from dgchat.toml_write import toml_table

MAX_NAME = 80
MAX_TEXT = 2000
MAX_EXAMPLES = 32
MAX_BANNED = 256
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")
CARD_KEYS = ("id", "name", "role", "setting", "voice", "examples", "banned_words")


@dataclass(frozen=True)
class CharacterCard:
    name: str
    id: str = ""
    role: str = ""
    setting: str = ""
    voice: str = ""
    examples: tuple[str, ...] = ()
    banned_words: tuple[str, ...] = ()
    source: Path | None = field(default=None, compare=False)  # the file it came from, if any

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", slug(self.name))

    def system_prompt(self) -> str:
        """The persona: this exact text is the system message of every line generated for the card."""
        lines = [f"You are {self.name}, {self.role}." if self.role else f"You are {self.name}."]
        if self.setting:
            lines.append(f"Setting: {self.setting}")
        if self.voice:
            lines.append(f"Voice: {self.voice}")
        if self.examples:
            lines.append("Example lines:")
            lines.extend(f"- {example}" for example in self.examples)
        if self.banned_words:
            lines.append("Never use these words: " + ", ".join(self.banned_words) + ".")
        lines.append(
            f"Speak only as {self.name}: reply with the line of dialogue itself, "
            "without quotes, stage directions or narration."
        )
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "role": self.role,
            "setting": self.setting,
            "voice": self.voice,
            "examples": list(self.examples),
            "banned_words": list(self.banned_words),
        }

    def to_toml(self) -> str:
        return toml_table((k, v) for k, v in self.as_dict().items() if v or k in ("id", "name"))


def slug(name: str) -> str:
    s = re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")
    return s[:80] or "character"


def _text(where: str, key: str, value: Any, *, limit: int = MAX_TEXT, one_line: bool = False) -> str:
    if not isinstance(value, str):
        raise CardError(f"{where}: `{key}` must be a string (got {type(value).__name__})")
    value = value.strip()
    if len(value) > limit:
        raise CardError(f"{where}: `{key}` is {len(value)} characters; the limit is {limit}")
    if one_line and ("\n" in value or "\r" in value):
        raise CardError(f"{where}: `{key}` must be one line")
    return value


def _text_list(where: str, key: str, value: Any, limit: int, *, item_limit: int = MAX_TEXT) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise CardError(f"{where}: `{key}` must be a list of strings (got {type(value).__name__})")
    if len(value) > limit:
        raise CardError(f"{where}: `{key}` has {len(value)} entries; the limit is {limit}")
    out = []
    for i, item in enumerate(value):
        text = _text(where, f"{key}[{i}]", item, limit=item_limit, one_line=True)
        if not text:
            raise CardError(f"{where}: `{key}[{i}]` is empty")
        out.append(text)
    return tuple(out)


def parse_card(data: Mapping[str, Any], where: str = "card", source: Path | None = None) -> CharacterCard:
    """Validate one card given as a mapping (a TOML table, a JSON object from the API)."""
    if not isinstance(data, Mapping):
        raise CardError(f"{where}: a card must be a table/object (got {type(data).__name__})")
    unknown = [k for k in data if k not in CARD_KEYS]
    if unknown:
        raise CardError(f"{where}: unknown key `{unknown[0]}` (a card has {', '.join(CARD_KEYS)})")
    if "name" not in data:
        raise CardError(f"{where}: `name` is required")
    name = _text(where, "name", data["name"], limit=MAX_NAME, one_line=True)
    if not name:
        raise CardError(f"{where}: `name` is empty")
    card_id = _text(where, "id", data.get("id", ""), limit=80, one_line=True)
    if card_id and not _ID.match(card_id):
        raise CardError(f"{where}: `id` {card_id!r} may hold only letters, digits, '_', '-', '.'")
    banned = _text_list(where, "banned_words", data.get("banned_words", []), MAX_BANNED, item_limit=100)
    lowered = [w.lower() for w in banned]
    dup = next((w for i, w in enumerate(lowered) if w in lowered[:i]), None)
    if dup is not None:
        raise CardError(f"{where}: banned word {dup!r} is listed twice")
    return CharacterCard(
        name=name,
        id=card_id,
        role=_text(where, "role", data.get("role", ""), one_line=True),
        setting=_text(where, "setting", data.get("setting", "")),
        voice=_text(where, "voice", data.get("voice", "")),
        examples=_text_list(where, "examples", data.get("examples", []), MAX_EXAMPLES),
        banned_words=banned,
        source=source,
    )


def read_toml(path: Path, error: type[Exception]) -> dict[str, Any]:
    """A card or lines file (dgchat.toml_files: a regular file, bounded size and nesting), its
    problem raised as `error` naming the file, in one line."""
    try:
        return toml_files.read_toml(path)
    except toml_files.TomlFileError as exc:
        raise error(f"{path}: {exc}") from None


def load_card_file(path: str | Path) -> list[CharacterCard]:
    """The cards of one TOML file: a single card at the top level, or a [[card]] array of them."""
    path = Path(path)
    data = read_toml(path, CardError)
    if "card" in data:
        extra = [k for k in data if k != "card"]
        if extra:
            raise CardError(f"{path}: a file of [[card]] tables has no top-level key `{extra[0]}`")
        tables = data["card"]
        if not isinstance(tables, list) or not tables:
            raise CardError(f"{path}: `card` must be an array of tables ([[card]])")
        return [parse_card(t, f"{path} card {i + 1}", path) for i, t in enumerate(tables)]
    if not data:
        raise CardError(f"{path}: no card (give `name = ...` or [[card]] tables)")
    return [parse_card(data, str(path), path)]


def load_cards(paths: Iterable[str | Path] | None = None) -> list[CharacterCard]:
    """Cards from files and folders (every *.toml inside, sorted); default: <data>/npc/cards.
    Ids must be unique across all of them."""
    if paths is None:
        folder = cards_dir()
        paths = [folder] if folder.is_dir() else []
    cards: list[CharacterCard] = []
    for p in paths:
        p = Path(p).expanduser()
        if os.path.isdir(p):  # (not Path.is_dir: it raises on a name too long for the system)
            for f in sorted(p.glob("*.toml")):
                cards.extend(load_card_file(f))
        else:
            cards.extend(load_card_file(p))
    seen: dict[str, CharacterCard] = {}
    for card in cards:
        if card.id in seen:
            raise CardError(f"two cards have the id {card.id!r} ({seen[card.id].source} and {card.source}); "
                            "give one an `id`")
        seen[card.id] = card
    return cards


def find_card(cards: Sequence[CharacterCard], key: str) -> CharacterCard:
    """The card whose id is `key`, else whose name is `key` (case-insensitive)."""
    for card in cards:
        if card.id == key:
            return card
    matches = [c for c in cards if c.name.lower() == key.lower()]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise CardError(f"{len(matches)} cards are named {key!r}; refer to one by its id")
    known = ", ".join(c.id for c in cards[:10]) or "none loaded"
    raise CardError(f"no character card {key!r} (cards: {known})")


def save_card(card: CharacterCard, path: str | Path | None = None) -> Path:
    """Write the card as TOML (atomically); default path <data>/npc/cards/<id>.toml. Returns the path."""
    path = Path(path) if path is not None else cards_dir() / f"{card.id}.toml"
    # round-trip check: what we write must read back as the same card
    parse_card(toml_files.parse_toml(card.to_toml()), str(path))
    atomic_write_text(path, card.to_toml())
    return path
