"""The model list: `ModelRow`, one line of it, and how `ModelManager.listing` builds the rows.

The rows are catalog entries (in catalog order), then other installed models, then runnable GGUFs
in the Hugging Face cache; each with its status, size, memory fit and, given a machine profile, a
speed prediction. Only local files are read here (the registry, the models folder, the HF cache).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dgchat import assets
from dgchat.hub.catalog import Catalog, CatalogEntry
from dgchat.hub.checkpoint import checkpoint_downloaded, checkpoint_partial
from dgchat.hub.download import PartialDownload, list_partials
from dgchat.hub.fit import (
    TOO_SLOW,
    FitEstimate,
    SpeedVerdict,
    arch_from_dict,
    arch_from_header,
    estimate,
    estimate_entry,
    recommend,
    speed_verdict,
)
from dgchat.hub.hardware import Hardware
from dgchat.hub.hfcache import CachedGguf, find_in_hf_cache, scan_hf_cache
from dgchat.hub.machine_profile import MachineProfile
from dgchat.hub.registry import InstalledModel, Registry
from dgchat.hub.speed import (
    ModelShape,
    shape_from_entry,
    shape_from_header,
    typical_figures,
)
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.model_info import inspect_header

STATUSES = ("installed", "bundled", "in HF cache", "partial", "available", "missing")


@dataclass(frozen=True)
class ModelRow:
    """One line of a model list. `name` is what pull/rm/verify take (HF-cache rows: import their path)."""

    name: str
    title: str
    description: str
    status: str  # one of STATUSES
    size: int
    size_exact: bool
    entry: CatalogEntry | None = None
    installed: InstalledModel | None = None
    hf_cache: CachedGguf | None = None
    partial: PartialDownload | None = None
    fit: FitEstimate | None = None  # None without hardware, or when the file cannot be read
    recommended: bool = False
    path: Path | None = None  # a file that runs now (installed, bundled, in the HF cache)
    needs_convert: bool = False
    notes: tuple[str, ...] = ()
    speed: SpeedVerdict | None = None  # with a machine profile, for a model that fits

    @property
    def badge(self) -> str | None:
        """The memory fit, or "too slow here" for a model that fits but answers slower than the limit."""
        if self.fit is None:
            return None
        if self.speed is not None and self.speed.too_slow and self.fit.fits:
            return TOO_SLOW
        return self.fit.badge

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "title": self.title, "description": self.description, "status": self.status,
            "size": self.size, "size_exact": self.size_exact, "catalog": self.entry is not None,
            "repo": self.entry.repo if self.entry else (self.hf_cache.repo if self.hf_cache else None),
            "filename": self.entry.filename if self.entry else (self.hf_cache.filename if self.hf_cache else None),
            "path": str(self.path) if self.path else None,
            "fit": self.fit.badge if self.fit else None, "need": self.fit.need if self.fit else None,
            "fit_reason": self.fit.reason if self.fit else None, "recommended": self.recommended,
            "placement": self.fit.placement.as_json() if self.fit and self.fit.placement else None,
            "partial": ({"done": self.partial.done, "total": self.partial.total} if self.partial else None),
            "needs_convert": self.needs_convert, "notes": list(self.notes), "badge": self.badge,
            "predicted": self.speed.prediction.as_dict() if self.speed else None,
            "predicted_after_rebuild": (self.speed.after_rebuild.as_dict()
                                        if self.speed and self.speed.after_rebuild else None),
            "speed": self.speed.text() if self.speed else None,
            "download_size": self.entry.download_size if self.entry is not None and not self.entry.bundled else None,
            "disk_need": self.fit.disk_need if self.fit else None,
            "checkpoint": ({"files": list(self.entry.files), "optional_files": list(self.entry.optional_files),
                            "size": self.entry.checkpoint_size, "quant": self.entry.quant,
                            "revision": self.entry.revision}
                           if self.entry is not None and self.entry.checkpoint else None),
        }


def list_models(catalog: Catalog, registry: Registry, models_dir: Path, hf_cache_dir: Path | None,
                hw: Hardware | None, *, include_hf_cache: bool, profile: MachineProfile | None,
                limit_s: float) -> list[ModelRow]:
    """The rows of `ModelManager.listing` (which documents them), from the manager's catalog,
    registry and folders."""
    installed = registry.all()
    by_catalog = {m.catalog: m for m in installed if m.catalog}
    cached = scan_hf_cache(hf_cache_dir) if include_hf_cache else []
    partials = {p.filename: p for p in list_partials(models_dir)}
    rows: list[ModelRow] = []
    on_disk: set[str] = set()
    sizes: dict[str, int] = {}
    claimed_cache: set[Path] = set()
    for entry in catalog:
        inst = by_catalog.get(entry.name)
        hf = None if entry.bundled or entry.checkpoint else find_in_hf_cache(
            entry.repo or "", entry.filename or "", entry.revision, scanned=cached)
        if hf is not None:
            claimed_cache.add(hf.path)
        notes: list[str] = []
        path = None
        size, exact = entry.size, entry.size_exact
        partial = None
        if entry.bundled:
            bp = assets.bundled_model_path()
            status = "bundled" if bp is not None else "missing"
            if bp is not None:
                path, size, exact = bp, bp.stat().st_size, True
            else:
                notes.append("this installation has no bundled model file")
        elif inst is not None and inst.path.exists():
            status, path, size, exact = "installed", inst.path, inst.size, True
        elif inst is not None:
            status = "missing"
            notes.append(f"registered, but {inst.path} is gone")
        elif hf is not None:
            status, size, exact = "in HF cache", hf.size, True
            path = None if entry.convert else hf.path
            notes.append("found in the Hugging Face cache: pull uses it without downloading"
                         + (" (and converts it)" if entry.convert else ""))
        elif entry.checkpoint:
            partial = checkpoint_partial(models_dir, entry)
            status = "partial" if partial is not None else "available"
            if partial is not None and checkpoint_downloaded(models_dir, entry):
                notes.append("downloaded and verified; the conversion did not finish: pulling again converts "
                             "it without downloading")
        else:
            partial = partials.get(entry.download_name)
            status = "partial" if partial is not None else "available"
            if partial is not None and partial.total:
                size, exact = partial.total, True
        if status in ("installed", "bundled", "in HF cache"):
            on_disk.add(entry.name)
            sizes[entry.name] = size
        fit = estimate_entry(entry, hw, size=size, on_disk=entry.name in on_disk) if hw is not None else None
        rows.append(ModelRow(
            name=entry.name, title=entry.title, description=entry.description, status=status, size=size,
            size_exact=exact, entry=entry, installed=inst, hf_cache=hf, partial=partial, fit=fit, path=path,
            needs_convert=(entry.convert or entry.checkpoint) and status != "installed", notes=tuple(notes),
            speed=speed_of(entry, path, fit, hw, profile, limit_s),
        ))
    if hw is not None:
        speeds = {r.name: r.speed for r in rows if r.speed is not None} if profile is not None else None
        rec = recommend(catalog, hw, on_disk=on_disk, sizes=sizes, speeds=speeds)
        rows = [r if r.entry is not rec.entry else with_changes(r, recommended=True) for r in rows]
    catalog_names = {e.name for e in catalog}
    registered_paths = {resolved(m.path) for m in installed}
    for m in installed:
        if m.catalog in catalog_names:
            continue
        arch = arch_from_dict(m.arch)
        fit = (estimate(m.size, arch, min(m.context_length or 4096, 4096), hw, on_disk=True)
               if hw is not None and arch is not None else None)
        path = m.path if m.path.exists() else None
        rows.append(ModelRow(
            name=m.name, title=m.name, description=f"imported from {m.converted_from['path']}"
            if m.converted_from else f"{m.source}: {m.path}", status="installed" if m.path.exists() else "missing",
            size=m.size, size_exact=True, installed=m, fit=fit, path=path,
            speed=speed_of(None, path, fit, hw, profile, limit_s),
        ))
    for c in cached:
        if c.path in claimed_cache or resolved(c.path) in registered_paths:
            continue
        row = cache_row(c, hw)
        if row is not None:
            rows.append(with_changes(row, speed=speed_of(None, row.path, row.fit, hw, profile, limit_s)))
    return rows


def model_shape(entry: CatalogEntry | None, path: Path | None) -> ModelShape | None:
    """The model's shape: from its file where it is on disk (exact), else from the catalog; what
    the catalog measured of the model in practice (typical steps, tokens a step or a canvas) either way."""
    figures = typical_figures(entry)
    try:
        if path is not None:
            header = read_gguf_header(path)
            info = inspect_header(header)  # block diffusion too: its block, steps and threshold
            return shape_from_header(header, family=info.family, kv_memory=info.has_kv_memory,
                                     sampler=info.defaults, **figures)
        if entry is not None:
            return shape_from_entry(entry)
    except (DgchatError, ValueError):
        return None
    return None


def speed_of(entry: CatalogEntry | None, path: Path | None, fit: FitEstimate | None, hw: Hardware | None,
           profile: MachineProfile | None, limit_s: float) -> SpeedVerdict | None:
    if profile is None or hw is None or fit is None or not fit.fits:
        return None
    shape = model_shape(entry, path)
    arch = entry.arch if entry is not None else None  # the engine's plan for a GPU after a rebuild
    return speed_verdict(shape, fit, hw, profile, limit_s, arch) if shape is not None else None


def cache_row(c: CachedGguf, hw: Hardware | None) -> ModelRow | None:
    try:
        header = read_gguf_header(c.path)
    except DgchatError:
        return None
    needs_convert = header.architecture == "diffusion-gemma"
    if not needs_convert:
        try:
            inspect_header(header)
        except DgchatError:
            return None  # not a model dgchat runs (a causal LLM, ...): not offered
    arch, ctx = arch_from_header(header)
    fit = estimate(c.size, arch, ctx, hw, on_disk=True, convert=needs_convert) if hw is not None else None
    hint = (f"dgchat models import --convert {c.path}" if needs_convert else f"dgchat models import {c.path}")
    return ModelRow(
        name=c.label, title=c.label, description=f"in the Hugging Face cache; add it with `{hint}`",
        status="in HF cache", size=c.size, size_exact=True, hf_cache=c, fit=fit,
        path=None if needs_convert else c.path, needs_convert=needs_convert,
    )


def with_changes(row: ModelRow, **changes: Any) -> ModelRow:
    return replace(row, **changes)


def resolved(path: Path) -> Path:
    """The absolute real path; the absolute path as given where resolving fails (a broken link, a loop)."""
    try:
        return Path(path).expanduser().resolve()
    except OSError:
        return Path(path).expanduser().absolute()


__all__ = ["STATUSES", "ModelRow", "cache_row", "list_models", "model_shape", "resolved", "speed_of", "with_changes"]
