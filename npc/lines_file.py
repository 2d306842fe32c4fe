"""lines.toml: what `dgchat npc` generates (docs/NPC.md).

    [defaults]                 # optional: applies to every [[line]] (a line's own keys win)
    count = 5
    length = "short"
    temperature = 0.8

    [variables]                # optional: game variables for every template
    player = "Aria"

    [[line]]
    character = "gate_guard"   # a card id (or name)
    context = "gate_night"     # context tag, copied to the export
    situation = "The player walks up to the closed gate after dark."
    template = "Halt, {player}! None may pass the {___} after dark."
    variables = { player = "Aria" }
    count = 3
    seed = 7

Precedence: a line's keys > the command line's (--count, --seed, --var) > [defaults] / [variables]
> built-in defaults (count 1, seed 0, length "short").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.params import DiffusionParams
from dgchat.npc.cards import CharacterCard, find_card, read_toml
from dgchat.npc.errors import LinesFileError
from dgchat.npc.generator import LineSpec
from dgchat.npc.templates import parse_template

# the sampler settings a line may set; their types and ranges are DiffusionParams.FIELDS'
SAMPLER_KEYS = ("temperature", "top_p", "top_k", "steps", "algorithm", "alg_temp", "block_length")
LINE_KEYS = {"character", "context", "situation", "template", "variables", "length", "count", "seed", *SAMPLER_KEYS}
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class LineEntry:
    character: str
    where: str  # "lines.toml line 3", for messages
    values: Mapping[str, Any] = field(default_factory=dict)  # the entry's own keys (merged at to_spec)


@dataclass(frozen=True)
class LinesFile:
    path: Path
    defaults: Mapping[str, Any]
    variables: Mapping[str, str]
    entries: tuple[LineEntry, ...]

    def specs(self, cards: Sequence[CharacterCard], *, count: int | None = None, seed: int | None = None,
              variables: Mapping[str, str] | None = None) -> list[LineSpec]:
        """One LineSpec per entry; `count`, `seed` and `variables` come from the command line."""
        cli = {k: v for k, v in (("count", count), ("seed", seed)) if v is not None}
        out = []
        for entry in self.entries:
            merged: dict[str, Any] = {**self.defaults, **cli, **entry.values}
            game_vars = {**self.variables, **(variables or {}), **entry.values.get("variables", {})}
            try:
                card = find_card(cards, entry.character)
                sampler = {k: merged[k] for k in SAMPLER_KEYS if k in merged}
                params = DiffusionParams(**sampler)
                params.validate()
                spec = LineSpec(
                    card=card,
                    context=merged.get("context", ""),
                    situation=merged.get("situation", ""),
                    template=merged.get("template"),
                    variables=game_vars,
                    length=merged.get("length", "short"),
                    count=merged.get("count", 1),
                    seed=merged.get("seed", 0),
                    params=params,
                )
                spec.validate()
                if spec.template is not None:
                    parse_template(spec.template).fill(game_vars)  # report missing variables before generating
            except DgchatError as exc:
                raise LinesFileError(f"{entry.where}: {exc}") from None
            out.append(spec)
        return out


def _check_values(where: str, table: Mapping[str, Any], allowed: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in allowed:
            raise LinesFileError(f"{where}: unknown key `{key}` (allowed: {', '.join(sorted(allowed))})")
        if key in SAMPLER_KEYS:
            spec = DiffusionParams.FIELDS[key]
            if not spec.has_type(value):
                raise LinesFileError(f"{where}: `{key}` has the wrong type ({type(value).__name__}; "
                                     f"it takes {spec.what})")
            if spec.kind is float:
                value = float(value)
        elif key in ("character", "context", "situation", "template"):
            if not isinstance(value, str):
                raise LinesFileError(f"{where}: `{key}` must be a string")
        elif key in ("count", "seed"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise LinesFileError(f"{where}: `{key}` must be an integer")
        elif key == "length":
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise LinesFileError(f"{where}: `length` must be a number of tokens or a preset name")
        elif key == "variables":
            value = _variables(f"{where} variables", value)
        out[key] = value
    return out


def _variables(where: str, table: Any) -> dict[str, str]:
    if not isinstance(table, Mapping):
        raise LinesFileError(f"{where}: must be a table of name = value")
    out = {}
    for name, value in table.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float, str)):
            value = str(value)
        else:
            raise LinesFileError(f"{where}: `{name}` must be a string or a number (got {type(value).__name__})")
        out[str(name)] = value
    return out


def load_lines_file(path: str | Path) -> LinesFile:
    path = Path(path)
    data = read_toml(path, LinesFileError)
    extra = [k for k in data if k not in ("defaults", "variables", "line")]
    if extra:
        raise LinesFileError(f"{path}: unknown top-level key `{extra[0]}` (allowed: defaults, variables, [[line]])")
    defaults_table = data.get("defaults", {})
    if not isinstance(defaults_table, Mapping):
        raise LinesFileError(f"{path}: [defaults] must be a table")
    defaults = _check_values(f"{path} [defaults]", defaults_table, LINE_KEYS - {"variables"})
    variables = _variables(f"{path} [variables]", data.get("variables", {}))
    lines = data.get("line")
    if not isinstance(lines, list) or not lines:
        raise LinesFileError(f"{path}: no [[line]] entries")
    if len(lines) > MAX_ENTRIES:
        raise LinesFileError(f"{path}: {len(lines)} entries; the limit is {MAX_ENTRIES}")
    entries = []
    for i, table in enumerate(lines):
        where = f"{path} [[line]] {i + 1}"
        if not isinstance(table, Mapping):
            raise LinesFileError(f"{where}: must be a table")
        values = _check_values(where, table, LINE_KEYS)
        character = values.pop("character", defaults.get("character"))
        if not character:
            raise LinesFileError(f"{where}: `character` is required (a card id or name)")
        entries.append(LineEntry(character, where, values))
    return LinesFile(path, defaults, variables, tuple(entries))
