"""Exports of kept lines: JSON and CSV in one documented schema (lines.schema.json, docs/NPC.md).

Exports hold no timestamps: the same lines give byte-identical files, so a game build can diff them.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from dgchat import __version__
from dgchat.npc.errors import ExportError
from dgchat.npc.generator import LineBatch
from dgchat.npc.paths import atomic_write_text
from dgchat.npc.schema_check import schema_errors

FORMAT = "dgchat-npc-lines"
FORMAT_VERSION = 1
CSV_COLUMNS = ("id", "character", "character_name", "context", "text", "template", "variables", "holes", "seed",
               "attempt", "sampler_seed", "variant", "model", "score", "stop_reason", "settings")
_JSON_COLUMNS = ("variables", "holes", "settings")
_INT_COLUMNS = ("seed", "attempt", "sampler_seed", "variant")
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
# A spreadsheet opening the CSV evaluates a cell that starts with one of these as a formula
# (OWASP "CSV injection"): `=HYPERLINK(...)` from a card or a generated line would run. Such text
# cells get a leading apostrophe, which spreadsheets show as text; a cell already starting with
# apostrophes before one of these gets one more, so read_csv_lines can always remove exactly one.
_FORMULA = re.compile(r"^'*[=+\-@\t\r]")
_TEXT_COLUMNS = ("id", "character", "character_name", "context", "text", "template", "model", "stop_reason")


def neutralise_cell(value: str) -> str:
    """A text cell safe to open in a spreadsheet (see _FORMULA); `restore_cell` undoes it."""
    return "'" + value if _FORMULA.match(value) else value


def restore_cell(value: str) -> str:
    return value[1:] if value.startswith("'") and _FORMULA.match(value[1:]) else value


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The JSON Schema of an export (shipped as dgchat/npc/lines.schema.json)."""
    return json.loads(resources.files("dgchat.npc").joinpath("lines.schema.json").read_text(encoding="utf-8"))


def schema_path() -> Path:
    return Path(str(resources.files("dgchat.npc").joinpath("lines.schema.json")))


def line_records(batches: Iterable[LineBatch], *, kept_only: bool = True) -> list[dict[str, Any]]:
    """One record per kept variant (every variant not rejected when kept_only is False)."""
    records: list[dict[str, Any]] = []
    used: set[str] = set()
    for batch in batches:
        spec = batch.spec
        for v in batch.variants:
            if (v.status != "kept") if kept_only else (v.status == "rejected"):
                continue
            base = _ID_UNSAFE.sub("_", f"{spec.card.id}.{spec.context or 'line'}.{v.seed}")
            line_id, n = base, 1
            while line_id in used:
                n += 1
                line_id = f"{base}-{n}"
            used.add(line_id)
            records.append({
                "id": line_id,
                "character": spec.card.id,
                "character_name": spec.card.name,
                "context": spec.context,
                "text": v.text,
                "template": spec.template,
                "variables": {str(k): str(val) for k, val in spec.variables.items()},
                "holes": [{"text": h.text, "tokens": h.tokens} for h in v.holes],
                "seed": v.seed,
                "attempt": v.attempt,
                "sampler_seed": v.sampler_seed,
                "variant": v.index,
                "model": batch.model.file,
                "score": None if v.score is None else round(v.score, 6),
                "stop_reason": v.stop_reason,
                "settings": v.settings | batch.settings,
            })
    return records


def build_export(batches: Iterable[LineBatch], *, kept_only: bool = True) -> dict[str, Any]:
    batches = list(batches)
    if not batches:
        raise ExportError("nothing to export")
    models = {b.model for b in batches}
    if len(models) > 1:
        raise ExportError("lines made with different models cannot share one export; export them separately")
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "generator": f"dgchat {__version__}",
        "model": batches[0].model.as_dict(),
        "lines": line_records(batches, kept_only=kept_only),
    }


def export_json(document: dict[str, Any]) -> str:
    validate_export(document)
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def export_csv(document: dict[str, Any]) -> str:
    validate_export(document)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for line in document["lines"]:
        row = []
        for col in CSV_COLUMNS:
            value = line[col]
            if col in _JSON_COLUMNS:
                value = json.dumps(value, ensure_ascii=False, sort_keys=True)
            elif value is None:
                value = ""
            elif col in _TEXT_COLUMNS:
                value = neutralise_cell(str(value))
            row.append(value)
        writer.writerow(row)
    return out.getvalue()


def read_csv_lines(text: str) -> list[dict[str, Any]]:
    """CSV rows back as line records (the inverse of export_csv's row encoding)."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if tuple(reader.fieldnames or ()) != CSV_COLUMNS:
        raise ExportError(f"CSV header is {reader.fieldnames}, expected {list(CSV_COLUMNS)}")
    lines = []
    for row in reader:
        line: dict[str, Any] = dict(row)
        for col in _TEXT_COLUMNS:
            line[col] = restore_cell(line[col])
        for col in _JSON_COLUMNS:
            line[col] = json.loads(row[col])
        for col in _INT_COLUMNS:
            line[col] = int(row[col])
        line["score"] = float(row["score"]) if row["score"] else None
        line["template"] = row["template"] or None
        lines.append(line)
    return lines


def validate_export(document: Any) -> None:
    """Raise ExportError naming the first problem when `document` does not match the schema."""
    errors = schema_errors(document, load_schema())
    if errors:
        raise ExportError(f"export does not match the schema: {errors[0]}")
    ids = [line["id"] for line in document["lines"]]
    if len(set(ids)) != len(ids):
        raise ExportError("export does not match the schema: line ids are not unique")


def write_export(path: str | Path, document: dict[str, Any], fmt: str | None = None) -> Path:
    """Write JSON or CSV (by `fmt`, else by the file extension) atomically."""
    path = Path(path)
    fmt = fmt or path.suffix.lower().lstrip(".")
    if fmt == "json":
        text = export_json(document)
    elif fmt == "csv":
        text = export_csv(document)
    else:
        raise ExportError(f"{path}: unknown export format {fmt!r}; use .json or .csv (or --format)")
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        raise ExportError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return path
