"""The workshop's shelf of character cards: every card file in <data>/npc/cards, read one file at a
time so that one broken file is reported (file and problem) without hiding the other cards, and
cards written back where they came from (a file of several [[card]] tables keeps its other cards).
Validation is dgchat.npc's own (parse_card); this module only adds the bookkeeping of files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dgchat.npc.cards import CharacterCard, load_card_file, parse_card, save_card
from dgchat.npc.errors import CardError
from dgchat.npc.paths import atomic_write_text, cards_dir
from dgchat.toml_files import parse_toml


@dataclass
class CardShelf:
    cards: list[CharacterCard] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line per file that could not be used


def load_shelf(folder: Path | None = None) -> CardShelf:
    folder = folder or cards_dir()
    shelf = CardShelf()
    if not folder.is_dir():
        return shelf
    seen: dict[str, CharacterCard] = {}
    for path in sorted(folder.glob("*.toml")):
        try:
            cards = load_card_file(path)
        except CardError as exc:
            shelf.errors.append(str(exc).replace(str(folder) + "/", ""))
            continue
        for card in cards:
            if card.id in seen:
                shelf.errors.append(f"{path.name}: the id {card.id!r} is taken by {seen[card.id].source.name} "
                                    "(give one of them another `id`)")
                continue
            seen[card.id] = card
            shelf.cards.append(card)
    return shelf


def card_from_form(form: Mapping[str, Any], where: str = "card") -> CharacterCard:
    """A card from the editor's fields (lists as lists of lines); CardError names the problem."""
    data: dict[str, Any] = {}
    for key, value in form.items():
        if isinstance(value, str) and not value.strip() and key != "name":
            continue  # an empty optional field is simply absent
        data[key] = value
    return parse_card(data, where)


def _multi_card_toml(cards: Sequence[CharacterCard]) -> str:
    return "\n".join("[[card]]\n" + card.to_toml() for card in cards)


def _check_round_trip(text: str, path: Path) -> None:
    data = parse_toml(text)
    for i, table in enumerate(data.get("card", [data])):
        parse_card(table, f"{path} card {i + 1}")


def store_card(card: CharacterCard, original: CharacterCard | None, others: Sequence[CharacterCard]) -> CharacterCard:
    """Write `card` (new when `original` is None, else replacing it) and return it with its source.

    A new card goes to <data>/npc/cards/<id>.toml; an edited one back into its own file, where the
    other cards of a [[card]] file are kept as they were. Ids stay unique across the shelf."""
    taken = {c.id for c in others if original is None or c.id != original.id}
    if card.id in taken:
        raise CardError(f"the id {card.id!r} is already used by another card; give this one another id")
    if original is None or original.source is None:
        path = cards_dir() / f"{card.id}.toml"
        if path.exists():
            raise CardError(f"{path.name} already exists in the cards folder; give this card another id")
        return replace(card, source=save_card(card, path))
    path = original.source
    try:
        siblings = load_card_file(path)
    except CardError:
        siblings = [original]  # the file changed under us: write this card alone
    if len(siblings) <= 1:
        return replace(card, source=save_card(card, path))
    cards = [card if c.id == original.id else c for c in siblings]
    text = _multi_card_toml(cards)
    _check_round_trip(text, path)
    atomic_write_text(path, text)
    return replace(card, source=path)


def remove_card(card: CharacterCard) -> None:
    """Delete a card: its file, or its table in a file of several cards."""
    path = card.source
    if path is None:
        return
    try:
        siblings = load_card_file(path)
    except CardError:
        siblings = [card]
    rest = [c for c in siblings if c.id != card.id]
    if not rest:
        path.unlink(missing_ok=True)
        return
    text = _multi_card_toml(rest)
    _check_round_trip(text, path)
    atomic_write_text(path, text)
