"""Path completion for an Input: the rest of the first folder or file that starts with what is typed.

Textual shows a suggestion dimmed after the cursor; → (or End) accepts it. Folders complete with a
trailing "/" so the next → goes on inside them; files are offered only when their name ends with
one of `suffixes` (".gguf" for models), or any file when `suffixes` is empty.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from textual.suggester import Suggester

MAX_ENTRIES = 2000  # a folder with more entries than this is not searched further (a huge mount)


def looks_like_path(text: str) -> bool:
    """Whether `text` is a path (~/…, /…, ./…, ../…) rather than words to filter a list by."""
    return text.startswith(("/", "~", "./", "../")) or text in (".", "..")


def split_typed_path(text: str) -> tuple[Path, str]:
    """The folder a typed path points into and the start of a name in it ("~/mo" -> (~, "mo"))."""
    expanded = os.path.expanduser(text)
    if text.endswith("/") or text in ("~", ".", ".."):
        return Path(expanded), ""
    path = Path(expanded)
    return path.parent, path.name


def folder_entries(folder: Path, prefix: str, suffixes: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(name, is_folder) of the entries of `folder` whose name starts with `prefix` (case-insensitive),
    folders first; hidden ones only when the prefix starts with ".". Raises OSError."""
    folders: list[str] = []
    files: list[str] = []
    want = prefix.lower()
    with os.scandir(folder) as scan:
        for count, entry in enumerate(scan):
            if count >= MAX_ENTRIES:
                break
            name = entry.name
            if name.startswith(".") and not prefix.startswith("."):
                continue
            if not name.lower().startswith(want):
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                continue
            if is_dir:
                folders.append(name)
            elif not suffixes or name.lower().endswith(suffixes):
                files.append(name)
    return [(n, True) for n in sorted(folders, key=str.lower)] + [(n, False) for n in sorted(files, key=str.lower)]


class PathSuggester(Suggester):
    """Suggests the completion of a typed path (folders, and files ending with `suffixes`)."""

    def __init__(self, suffixes: Iterable[str] = ()) -> None:
        super().__init__(use_cache=False, case_sensitive=True)  # the disk changes; names are case-sensitive
        self.suffixes = tuple(s.lower() for s in suffixes)

    async def get_suggestion(self, value: str) -> str | None:
        if not looks_like_path(value) or value.endswith("/"):
            return None
        folder, prefix = split_typed_path(value)
        if not prefix:
            return None
        try:
            entries = folder_entries(folder, prefix, self.suffixes)
        except OSError:
            return None
        # prefer an exact-case match so that the suggestion continues what was typed letter for letter
        for name, is_dir in entries:
            if name.startswith(prefix):
                return value + name[len(prefix):] + ("/" if is_dir else "")
        return None
