"""The model manager: what the wizard, the Models screen and `dgchat models` call.

    mgr = ModelManager()                       # default folders (dgchat.hub.paths), shipped catalog
    hw = detect_hardware(mgr.models_dir)
    rows = mgr.listing(hw)                     # catalog + installed + HF cache, with fit badges
    rec = mgr.recommend(hw)                    # the entry to preselect
    res = mgr.pull(rec.entry.name, progress=cb, cancel=event)   # download (resumable) + convert
    mgr.remove(name); mgr.import_model(path); mgr.verify(name); mgr.model_path(name)

Network: only `pull` (when the file is neither installed nor in the Hugging Face cache) and
`dgchat.hub.tokens.store_token` talk to the hub; everything else reads local files.
The listing's rows (`ModelRow`) are built in dgchat.hub.listing.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dgchat import assets
from dgchat.convert.api import convert
from dgchat.hub import paths
from dgchat.hub.catalog import Catalog, CatalogEntry, load_catalog
from dgchat.hub.checkpoint import CheckpointPull, CheckpointResult, discard_checkpoint
from dgchat.hub.download import (
    DownloadResult,
    Progress,
    ProgressCallback,
    discard_partial,
    download_file,
)
from dgchat.hub.errors import DownloadCancelled, RegistryError, VerificationError
from dgchat.hub.fit import Recommendation, arch_from_header
from dgchat.hub.fit import recommend as _recommend
from dgchat.hub.hardware import Hardware
from dgchat.hub.hfcache import CachedGguf, find_in_hf_cache
from dgchat.hub.listing import STATUSES, ModelRow, list_models, model_shape, resolved  # the first two: re-exported
from dgchat.hub.machine_profile import MachineProfile
from dgchat.hub.registry import InstalledModel, Registry
from dgchat.hub.speed import DEFAULT_LIMIT_S
from dgchat.hub.util import atomic_write_json, hash_file, sha256_file
from dgchat.model_backend.errors import DgchatError, ModelFileError, UnsupportedModelError
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.model_info import inspect_header


@dataclass(frozen=True)
class PullResult:
    path: Path  # the file to run
    action: str  # "downloaded" | "from HF cache" | "already installed" | "bundled"
    model: InstalledModel | None  # None for the bundled model
    download: DownloadResult | None = None
    notes: tuple[str, ...] = ()
    checkpoint: CheckpointResult | None = None  # a checkpoint entry: its files, commit, where it was kept


@dataclass(frozen=True)
class RemoveResult:
    name: str
    deleted: tuple[Path, ...]  # files dgchat owned and removed
    kept: tuple[Path, ...]  # files it does not own (imported originals, the HF cache), left alone
    partial_removed: bool


@dataclass(frozen=True)
class VerifyResult:
    name: str
    path: Path
    sha256: str
    size: int


@dataclass
class _Reporter:
    name: str
    progress: ProgressCallback | None
    notes: list[str] = field(default_factory=list)

    def __call__(self, phase: str, done: int, total: int | None, message: str = "") -> None:
        if self.progress is not None:
            self.progress(Progress(phase=phase, name=self.name, done=done, total=total, message=message))


def slugify(text: str) -> str:
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")
    return (s or "model")[:80]


class ModelManager:
    def __init__(self, *, models_dir: Path | None = None, catalog: Catalog | None = None,
                 registry: Registry | Path | None = None, hf_cache_dir: Path | None = None,
                 endpoint: str | None = None) -> None:
        self.models_dir = Path(models_dir) if models_dir is not None else paths.models_dir()
        self.catalog = catalog if catalog is not None else load_catalog()
        self.registry = registry if isinstance(registry, Registry) else Registry(registry)
        self.hf_cache_dir = hf_cache_dir
        self.endpoint = endpoint

    # -- reading ------------------------------------------------------------------------------------

    def installed(self) -> list[InstalledModel]:
        return self.registry.all()

    def model_path(self, name: str) -> Path:
        """The file to open for an installed model or the bundled one (what the app loads)."""
        entry = self.catalog.find(name)
        if entry is not None and entry.bundled:
            return self._bundled_path()
        model = self.registry.find(name)
        if model is None and entry is not None:
            model = next((m for m in self.registry.all() if m.catalog == entry.name), None)
        if model is None:
            raise RegistryError(f"{name!r} is not installed; `dgchat models pull {name}` first"
                                if entry is not None else f"no installed model named {name!r}")
        if not model.path.exists():
            raise ModelFileError(f"{model.name}: its file {model.path} is gone; `dgchat models rm {model.name}` "
                                 f"then pull or import it again")
        return model.path

    def _bundled_path(self) -> Path:
        path = assets.bundled_model_path()
        if path is None:
            raise ModelFileError("this installation has no bundled model")
        return path

    def listing(self, hw: Hardware | None = None, *, include_hf_cache: bool = True,
                profile: MachineProfile | None = None, limit_s: float = DEFAULT_LIMIT_S) -> list[ModelRow]:
        """Catalog entries (in catalog order), then other installed models, then runnable GGUFs in the HF cache.
        With a machine profile (dgchat.hub.machine_profile) every model that fits gets a speed prediction
        (`ModelRow.speed`) and the recommendation goes by it (`limit_s`: seconds a 256-token answer may take)."""
        return list_models(self.catalog, self.registry, self.models_dir, self.hf_cache_dir, hw,
                           include_hf_cache=include_hf_cache, profile=profile, limit_s=limit_s)

    # the shape a speed prediction starts from (dgchat.hub.listing.model_shape), kept here by its old
    # name: tests and benches ask the manager for it
    _shape = staticmethod(model_shape)

    def recommend(self, hw: Hardware, *, profile: MachineProfile | None = None,
                  limit_s: float = DEFAULT_LIMIT_S) -> Recommendation:
        rows = self.listing(hw, profile=profile, limit_s=limit_s)
        on_disk = {r.name for r in rows if r.entry is not None and r.status in ("installed", "bundled", "in HF cache")}
        sizes = {r.name: r.size for r in rows if r.entry is not None and r.size_exact}
        speeds = {r.name: r.speed for r in rows if r.speed is not None} if profile is not None else None
        return _recommend(self.catalog, hw, on_disk=on_disk, sizes=sizes, speeds=speeds)

    # -- pull ---------------------------------------------------------------------------------------

    def pull(self, name: str, *, token: str | bool | None = None, progress: ProgressCallback | None = None,
             cancel: threading.Event | None = None, use_hf_cache: bool = True, retries: int = 5,
             retry_delay: float = 1.0, timeout: float = 30.0, keep_checkpoint: bool = False) -> PullResult:
        """Install catalog entry `name`: already installed -> nothing; in the HF cache -> verified and used
        in place (no network); else downloaded (resuming a partial download) and verified; then
        converted when the entry needs it; registered last, so a failure never lists a half model.
        A checkpoint entry (files = [...]) is downloaded file by file, converted and quantized
        (dgchat.hub.checkpoint); `keep_checkpoint` keeps its files in <models>/checkpoints/ afterwards.
        Raises the errors of dgchat.hub.download.download_file, CatalogError for an unknown name, and
        the converter's ConvertError."""
        entry = self.catalog.get(name)
        cancel = cancel or threading.Event()
        if entry.bundled:
            return PullResult(path=self._bundled_path(), action="bundled", model=None)
        existing = next((m for m in self.registry.all() if m.catalog == entry.name or m.name == entry.name), None)
        if existing is not None:
            if existing.path.exists():
                return PullResult(path=existing.path, action="already installed", model=existing)
            self.registry.remove(existing.name)  # its file is gone: install afresh
        if entry.checkpoint:
            return self._pull_checkpoint(entry, token=token, progress=progress, cancel=cancel, retries=retries,
                                         retry_delay=retry_delay, timeout=timeout, keep=keep_checkpoint)
        report = _Reporter(entry.installed_name, progress)
        if not entry.pinned:
            report.notes.append("the catalog pins no sha256 and commit for this model: the file is checked "
                                "against the hash the hub reports for it")
        if use_hf_cache:
            cached = find_in_hf_cache(entry.repo or "", entry.filename or "", entry.revision,
                                      cache_dir=self.hf_cache_dir)
            if cached is not None:
                result = self._from_hf_cache(entry, cached, report, cancel)
                if result is not None:
                    return result
        self.models_dir.mkdir(parents=True, exist_ok=True)
        source = self.models_dir / entry.download_name
        marker = paths.partial_dir(self.models_dir) / f"{entry.download_name}.verified.json"
        download: DownloadResult | None = None
        src_info = _read_marker(marker, source) if entry.convert else None
        if src_info is None:
            download = download_file(
                entry.repo or "", entry.filename or "", source, revision=entry.revision, token=token,
                endpoint=self.endpoint, sha256=entry.sha256, progress=progress, cancel=cancel, retries=retries,
                retry_delay=retry_delay, timeout=timeout, reserve_copies=1 if entry.convert else 0)
            src_info = {"sha256": download.sha256, "size": download.size, "commit": download.remote.commit,
                        "verified_by": download.verified_by}
            report.notes.extend(download.notes)
            if entry.convert:
                atomic_write_json(marker, src_info)
        else:
            report.notes.append("the verified download from an earlier pull was reused")
        if entry.convert:
            target = self.models_dir / entry.installed_name
            self._convert(source, target, report, cancel)
            converted_from = {"path": str(source), "sha256": src_info["sha256"], "size": src_info["size"],
                              "repo": entry.repo, "filename": entry.filename}
            report("verifying", 0, None)
            final_sha = sha256_file(target, cancel=None, progress=lambda d, t: report("verifying", d, t))
            path, owned_sha = target, final_sha
            verified_by = f"converted from a file checked by {src_info['verified_by']}"
        else:
            path, owned_sha, verified_by, converted_from = source, src_info["sha256"], src_info["verified_by"], None
        model = self._register_file(
            path, name=entry.name, source="download", owned=True, sha256=owned_sha, entry=entry,
            commit=src_info.get("commit"), verified_by=verified_by, converted_from=converted_from, delete_bad=True)
        if entry.convert:  # registered: the upstream-layout file (llama.cpp cannot load it) has served its turn
            source.unlink(missing_ok=True)
            marker.unlink(missing_ok=True)
        report("done", model.size, model.size)
        return PullResult(path=path, action="downloaded", model=model, download=download, notes=tuple(report.notes))

    def _pull_checkpoint(self, entry: CatalogEntry, *, token: str | bool | None, progress: ProgressCallback | None,
                         cancel: threading.Event, retries: int, retry_delay: float, timeout: float,
                         keep: bool) -> PullResult:
        """Download (resumable, verified per file), convert and quantize, register, then delete or keep
        the checkpoint; all under the checkpoint's lock (dgchat.hub.checkpoint)."""
        self.models_dir.mkdir(parents=True, exist_ok=True)
        notes: list[str] = []
        if not entry.pinned:
            notes.append("the catalog pins no commit and sha256s for this checkpoint: each file is checked against "
                         "the hash the hub reports for it")
        job = CheckpointPull(entry, self.models_dir, token=token, endpoint=self.endpoint, progress=progress,
                             cancel=cancel, retries=retries, retry_delay=retry_delay, timeout=timeout, keep=keep)
        with job:
            path = job.fetch_and_convert()
            files = job.manifest["files"]
            ways = ", ".join(sorted({str(f.get("verified_by")) for f in files.values()}))
            commit = job.manifest.get("commit")
            converted_from = {
                "path": f"{entry.repo}@{commit or entry.revision}", "repo": entry.repo, "revision": entry.revision,
                "commit": commit, "size": job.total, "quantized": entry.quant,
                "files": {n: {"sha256": f["sha256"], "size": f["size"]} for n, f in files.items()},
            }
            model = self._register_file(
                path, name=entry.name, source="download", owned=True, sha256=job.sha256 or sha256_file(path),
                entry=entry, commit=commit,
                verified_by=f"converted and quantized to {entry.quant} from a checkpoint whose {len(files)} files "
                            f"were checked by {ways}", converted_from=converted_from, delete_bad=True)
            result = job.finish()
            if result.kept is not None:
                model = self.registry.add(replace(model, converted_from={**converted_from, "path": str(result.kept)}),
                                          replace=True)
        notes.extend(job.notes)
        if result.kept is not None:
            notes.append(f"the checkpoint is kept in {result.kept}")
        if progress is not None:
            progress(Progress(phase="done", name=entry.installed_name, done=model.size, total=model.size))
        return PullResult(path=path, action="downloaded", model=model, download=None, notes=tuple(notes),
                          checkpoint=result)

    def _from_hf_cache(self, entry: CatalogEntry, cached: CachedGguf, report: _Reporter,
                       cancel: threading.Event) -> PullResult | None:
        expected = entry.sha256 or cached.sha256
        git_sha1 = cached.git_sha1 if expected is None else None  # a git-stored file's blob is named by it
        report("verifying", 0, cached.size, "found in the Hugging Face cache")
        digest, blob_sha1 = hash_file(cached.path, git_blob=git_sha1 is not None, cancel=cancel,
                                      progress=lambda d, t: report("verifying", d, t))
        if (expected is not None and digest != expected) or (git_sha1 is not None and blob_sha1 != git_sha1):
            want = expected or git_sha1 or ""
            report.notes.append(f"the copy in the Hugging Face cache ({cached.path}) is corrupt "
                                f"(expected {want[:12]}...); downloading instead")
            return None
        how = ("catalog sha256" if entry.sha256 else "HF cache blob sha256" if cached.sha256 else
               "HF cache blob git sha1" if git_sha1 else "size only")
        if entry.convert:
            self.models_dir.mkdir(parents=True, exist_ok=True)
            target = self.models_dir / entry.installed_name
            self._convert(cached.path, target, report, cancel)
            final_sha = sha256_file(target, progress=lambda d, t: report("verifying", d, t))
            model = self._register_file(
                target, name=entry.name, source="download", owned=True, sha256=final_sha, entry=entry,
                commit=cached.commit, verified_by=f"converted from an HF-cache file checked by {how}",
                converted_from={"path": str(cached.path), "sha256": digest, "size": cached.size, "repo": entry.repo,
                                "filename": entry.filename}, delete_bad=True)
            return PullResult(path=target, action="from HF cache", model=model, notes=tuple(report.notes))
        model = self._register_file(
            cached.path, name=entry.name, source="hf-cache", owned=False, sha256=digest, entry=entry,
            commit=cached.commit, verified_by=how, converted_from=None, delete_bad=False)
        report("done", model.size, model.size)
        return PullResult(path=cached.path, action="from HF cache", model=model, notes=tuple(report.notes))

    def _convert(self, source: Path, target: Path, report: _Reporter, cancel: threading.Event) -> None:
        def on_progress(done: int, total: int, _tensor: str) -> None:
            if cancel.is_set():  # raising here makes the converter delete its temporary file
                raise DownloadCancelled(f"conversion of {source.name} cancelled; the download is kept, pull again "
                                        "to convert", resumable=True)
            report("converting", done, total)

        report("converting", 0, None)
        convert(source, target, progress=on_progress)

    def _register_file(self, path: Path, *, name: str, source: str, owned: bool, sha256: str,
                       entry: CatalogEntry | None, commit: str | None, verified_by: str | None,
                       converted_from: dict[str, Any] | None, delete_bad: bool) -> InstalledModel:
        """Check that `path` is a model dgchat runs, then add it to the registry."""
        try:
            header = read_gguf_header(path)
            info = inspect_header(header)
        except DgchatError as exc:
            if delete_bad:
                path.unlink(missing_ok=True)
                raise type(exc)(f"{exc}; the downloaded file was deleted") from None
            raise
        if entry is not None:
            arch, ctx = entry.arch.as_dict(), info.context_length or entry.context
        else:
            a, _ = arch_from_header(header)
            arch, ctx = a.as_dict(), info.context_length
        model = InstalledModel(
            name=name, path=path, source=source, owned=owned, size=path.stat().st_size, sha256=sha256,
            catalog=entry.name if entry else None, repo=entry.repo if entry else None,
            filename=entry.filename if entry else None, revision=entry.revision if entry else None, commit=commit,
            verified_by=verified_by, converted_from=converted_from, architecture=info.architecture,
            context_length=ctx or None, arch=arch,
        )
        return self.registry.add(model, replace=True)

    # -- rm / import / verify -----------------------------------------------------------------------

    def remove(self, name: str, *, delete_files: bool = True) -> RemoveResult:
        """Forget an installed model; delete its file when dgchat owns it (never an imported original or a
        file in the HF cache). Also drops a partial download of a catalog entry of that name."""
        entry = self.catalog.find(name)
        if entry is not None and entry.bundled:
            raise RegistryError(f"{entry.name} ships with dgchat and cannot be removed")
        model = self.registry.find(name)
        if model is None and entry is not None:
            model = next((m for m in self.registry.all() if m.catalog == entry.name), None)
        partial_removed = False
        if entry is not None and entry.checkpoint:
            partial_removed = discard_checkpoint(self.models_dir, entry)
        elif entry is not None:
            partial_removed = discard_partial(self.models_dir / entry.download_name)
            marker = paths.partial_dir(self.models_dir) / f"{entry.download_name}.verified.json"
            if marker.exists():
                (self.models_dir / entry.download_name).unlink(missing_ok=True)
                marker.unlink(missing_ok=True)
                partial_removed = True
        if model is None:
            if partial_removed:
                return RemoveResult(name=entry.name if entry else name, deleted=(), kept=(), partial_removed=True)
            raise RegistryError(f"no installed model named {name!r}")
        deleted: list[Path] = []
        kept: list[Path] = []
        if model.owned and delete_files and self._inside_models_dir(model.path):
            if model.path.exists():
                model.path.unlink()
                deleted.append(model.path)
        else:
            kept.append(model.path)
        self.registry.remove(model.name)
        return RemoveResult(name=model.name, deleted=tuple(deleted), kept=tuple(kept), partial_removed=partial_removed)

    def _inside_models_dir(self, path: Path) -> bool:
        try:
            return resolved(path).is_relative_to(resolved(self.models_dir))
        except OSError:
            return False

    def import_model(self, path: Path, *, name: str | None = None, convert: bool = False,
                     progress: ProgressCallback | None = None, cancel: threading.Event | None = None) -> InstalledModel:
        """Register a local GGUF after validating it (read_gguf_header + inspect_header). The file stays where
        it is and is never deleted by dgchat; with convert=True (upstream diffusion-gemma layout) a
        converted copy is written into the models folder and owned."""
        path = Path(path).expanduser().absolute()
        cancel = cancel or threading.Event()
        header = read_gguf_header(path)
        layout_needs_convert = header.architecture == "diffusion-gemma"
        if layout_needs_convert and not convert:
            raise UnsupportedModelError(
                f"{path.name} is in the upstream diffusion-gemma layout; import it with --convert (writes a "
                f"converted copy into {self.models_dir})")
        if not layout_needs_convert:
            inspect_header(header)  # raises UnsupportedModelError with the reason
        stem = path.name[:-5] if path.name.lower().endswith(".gguf") else path.name
        model_name = slugify(name if name else stem)
        if name is not None and model_name != name.strip().lower():
            raise RegistryError(f"{name!r} is not a valid model name (use lower-case letters, digits, . _ -)")
        if self.catalog.find(model_name) is not None:
            raise RegistryError(f"{model_name!r} is a catalog model's name; pass another with --name")
        if self.registry.find(model_name) is not None:
            raise RegistryError(f"a model named {model_name!r} is already installed; pass another with --name")
        already = self.registry.by_path(path)
        if already is not None:
            raise RegistryError(f"{path} is already installed as {already.name!r}")
        report = _Reporter(path.name, progress)
        report("verifying", 0, header.file_size)
        digest = sha256_file(path, cancel=cancel, progress=lambda d, t: report("verifying", d, t))
        if layout_needs_convert:
            self.models_dir.mkdir(parents=True, exist_ok=True)
            target = self.models_dir / f"{stem}.dgchat.gguf"
            if target.exists():
                raise RegistryError(f"{target} already exists; remove it or import under another --name")
            self._convert(path, target, report, cancel)
            final = sha256_file(target, progress=lambda d, t: report("verifying", d, t))
            model = self._register_file(
                target, name=model_name, source="import", owned=True, sha256=final, entry=None, commit=None,
                verified_by=None, converted_from={"path": str(path), "sha256": digest, "size": header.file_size},
                delete_bad=True)
        else:
            model = self._register_file(path, name=model_name, source="import", owned=False, sha256=digest,
                                        entry=None, commit=None, verified_by=None, converted_from=None,
                                        delete_bad=False)
        report("done", model.size, model.size)
        return model

    def verify(self, name: str, *, progress: ProgressCallback | None = None,
               cancel: threading.Event | None = None) -> VerifyResult:
        """Re-hash an installed model's file against the sha256 recorded when it was installed."""
        model = self.registry.find(name)
        if model is None:
            entry = self.catalog.find(name)
            if entry is not None:
                model = next((m for m in self.registry.all() if m.catalog == entry.name), None)
        if model is None:
            raise RegistryError(f"no installed model named {name!r}")
        if not model.path.exists():
            raise ModelFileError(f"{model.name}: its file {model.path} is gone")
        report = _Reporter(model.path.name, progress)
        digest = sha256_file(model.path, cancel=cancel, progress=lambda d, t: report("verifying", d, t))
        if digest != model.sha256:
            raise VerificationError(
                f"{model.name}: {model.path.name} has changed or is corrupt (sha256 {digest[:12]}..., installed as "
                f"{model.sha256[:12]}...); `dgchat models rm {model.name}` and install it again")
        report("done", model.size, model.size)
        return VerifyResult(name=model.name, path=model.path, sha256=digest, size=model.path.stat().st_size)


def _read_marker(marker: Path, source: Path) -> dict[str, Any] | None:
    """The record of an earlier verified (not yet converted) download, if the file is still there."""
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not source.exists() or source.stat().st_size != info.get("size"):
        return None
    return info


__all__ = ["ModelManager", "ModelRow", "PullResult", "RemoveResult", "STATUSES", "VerifyResult", "slugify"]
