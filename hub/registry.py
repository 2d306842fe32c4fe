"""The local registry of installed models: one JSON file in the data dir (dgchat.hub.paths).

A model is listed here only once its file is complete, verified and (when needed) converted, so a
half-downloaded model never appears. `owned` says whether dgchat created the file (a download or a
conversion into the models folder: `rm` deletes it) or merely points at it (an imported file or a
file in the Hugging Face cache: `rm` forgets it and leaves the file alone).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields, replace as dc_replace
from pathlib import Path
from typing import Any

from dgchat.hub import paths
from dgchat.hub.errors import RegistryError
from dgchat.hub.util import FileLock, atomic_write_json

VERSION = 1
SOURCES = ("download", "hf-cache", "import")


@dataclass(frozen=True)
class InstalledModel:
    name: str
    path: Path
    source: str  # "download" | "hf-cache" | "import"
    owned: bool  # dgchat created the file and may delete it
    size: int
    sha256: str
    catalog: str | None = None  # the catalog entry it came from
    repo: str | None = None
    filename: str | None = None  # path inside the repo
    revision: str | None = None
    commit: str | None = None
    verified_by: str | None = None  # how the download was checked ("hub LFS etag", ...)
    converted_from: dict[str, Any] | None = None  # {"path", "sha256", "size", "repo", "filename"}
    architecture: str | None = None
    context_length: int | None = None
    arch: dict[str, Any] = field(default_factory=dict)  # ArchInfo fields, for the fit estimate
    added: float = 0.0  # unix time

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InstalledModel:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["path"] = Path(kw["path"])
        return cls(**kw)


class Registry:
    """Read-modify-write under a lock file, written atomically (temp file + os.replace)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else paths.registry_path()
        self._lock = FileLock(self.path.with_name(self.path.name + ".lock"))

    def _read(self) -> list[InstalledModel]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise RegistryError(f"{self.path}: cannot be read: {exc}") from None
        except ValueError as exc:
            raise RegistryError(f"{self.path}: not valid JSON ({exc}); fix or delete it") from None
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("models"), list):
            raise RegistryError(f"{self.path}: not a dgchat model registry (version {VERSION})")
        out = []
        for item in data["models"]:
            try:
                out.append(InstalledModel.from_dict(item))
            except (TypeError, KeyError) as exc:
                raise RegistryError(f"{self.path}: a malformed entry ({exc}); fix or delete it") from None
        return out

    def _write(self, models: list[InstalledModel]) -> None:
        atomic_write_json(self.path, {"version": VERSION, "models": [m.as_dict() for m in models]})

    def all(self) -> list[InstalledModel]:
        return self._read()

    def find(self, name: str) -> InstalledModel | None:
        key = name.strip().lower()
        return next((m for m in self._read() if m.name == key), None)

    def get(self, name: str) -> InstalledModel:
        model = self.find(name)
        if model is None:
            names = ", ".join(m.name for m in self._read()) or "none"
            raise RegistryError(f"no installed model named {name!r} (installed: {names})")
        return model

    def by_path(self, path: Path) -> InstalledModel | None:
        target = _key(path)
        return next((m for m in self._read() if _key(m.path) == target), None)

    def add(self, model: InstalledModel, *, replace: bool = False) -> InstalledModel:
        if not model.added:
            model = dc_replace(model, added=time.time())
        with self._lock:
            models = self._read()
            clash = [m for m in models if m.name == model.name]
            if clash and not replace:
                raise RegistryError(f"a model named {model.name!r} is already installed ({clash[0].path})")
            models = [m for m in models if m.name != model.name] + [model]
            self._write(models)
        return model

    def remove(self, name: str) -> InstalledModel:
        with self._lock:
            models = self._read()
            hit = next((m for m in models if m.name == name.strip().lower()), None)
            if hit is None:
                raise RegistryError(f"no installed model named {name!r}")
            self._write([m for m in models if m is not hit])
        return hit


def _key(path: Path) -> str:
    try:
        return str(Path(path).expanduser().resolve())
    except OSError:
        return str(Path(path).expanduser().absolute())
