"""Checkpoint entries: a Hugging Face checkpoint fetched file by file, then converted and quantized here.

A catalog entry with `files = [...]` (dgchat.hub.catalog) names a checkpoint (config.json,
tokenizer files, safetensors weights) instead of a GGUF. `ModelManager.pull` runs it in three
phases, each with its own progress (`Progress.phase`):

1. download: "resolving" (one HEAD per file: its commit, size and hash), then "downloading" (bytes of
   the whole checkpoint, the current file in `Progress.name`) and "verifying" (each finished file's
   hash). Every file goes through `dgchat.hub.download.Downloader`, so each one resumes with a Range
   request and is checked against the hub's LFS sha256 (weights), its git sha1 (small files) or the
   catalog's pin; a mismatch deletes that file (`VerificationError`) and a retry downloads it again.
   All files come from one commit: the first HEAD's, recorded in the manifest and asked for by name
   afterwards (also by a resumed pull), so a repo updated between two files cannot mix versions.
2. convert: `dgchat.convert.convert(folder, out, quantize=QUANT, ...)`: "converting" (bytes of the
   unquantized GGUF written), then "quantizing" (tensor i of n, llama.cpp's quantizer).
3. the result's sha256 ("verifying"), then the manager validates and registers it.

Files (all under the models folder):

    .partial/<name>.checkpoint/              the checkpoint while it downloads and until it is converted
    .partial/<name>.checkpoint/.partial/     each file's resumable download (.part + .part.json)
    .partial/<name>.checkpoint.json          the manifest: repo, revision, commit, sizes, verified files
    .partial/<name>.checkpoint.lock          held while a process works on the checkpoint
    <repo name>-<QUANT>.gguf                 the result
    checkpoints/<repo name>[-<commit>]/      a checkpoint the user kept (--keep-checkpoint)

Resume: a killed or cancelled download continues each file where it stopped; files the manifest
lists as verified (and still on disk at their size) are not asked for again. Once every file is
verified, a pull converts without any network request, so a conversion that was killed or failed
starts again from the kept download; temporaries a killed conversion left in the models folder are
removed first. After a verified conversion (the converter's own check, then the manager's header
validation) the checkpoint is deleted, or moved to checkpoints/ when the user keeps it.

Disk: before the first byte the remaining download + the unquantized intermediate (about the
weights' size: the converter keeps their float type, then llama.cpp quantizes) + the quantized
result (the catalog's estimate) + a margin must be free, else `DiskFullError` and nothing is
written. The checkpoint is on disk until the conversion ends, so all three exist at once.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgchat.convert.api import convert
from dgchat.convert.errors import ConvertError
from dgchat.convert.quantize import estimate_bytes
from dgchat.convert.writer import PARTIAL_PREFIX
from dgchat.hub import paths
from dgchat.hub.catalog import CatalogEntry
from dgchat.hub.download import (
    SPACE_MARGIN,
    Downloader,
    PartialDownload,
    Progress,
    ProgressCallback,
    partial_paths,
    progress_text,
)
from dgchat.hub.errors import (
    DiskFullError,
    DownloadCancelled,
    DownloadError,
    HubError,
    NotFoundOnHubError,
    VerificationError,
)
from dgchat.hub.remote import RemoteFile, resolve_remote
from dgchat.hub.util import FileLock, atomic_write_json, format_bytes, sha256_file

MANIFEST_VERSION = 1
KEPT_DIRNAME = "checkpoints"
# the converter's own headroom (convert/writer.py _SPACE_MARGIN; a test holds the two): the check
# before the download must not pass where the converter's, after it, would refuse
CONVERT_SPACE_MARGIN = 64 * 1024**2


def result_estimate(entry: CatalogEntry, weight_bytes: int) -> int:
    """The quantized GGUF's size for the disk check: the catalog's estimate, or the converter's own
    (dgchat.convert.quantize.estimate_bytes, over bf16 weights: 2 bytes each) when that is larger."""
    assert entry.quant is not None
    return max(entry.size, estimate_bytes(weight_bytes // 2, 0, entry.quant))


def checkpoint_dir(models_dir: Path, entry: CatalogEntry) -> Path:
    return paths.partial_dir(Path(models_dir)) / entry.download_name


def manifest_path(models_dir: Path, entry: CatalogEntry) -> Path:
    return paths.partial_dir(Path(models_dir)) / f"{entry.download_name}.json"


def lock_path(models_dir: Path, entry: CatalogEntry) -> Path:
    return paths.partial_dir(Path(models_dir)) / f"{entry.download_name}.lock"


def kept_root(models_dir: Path) -> Path:
    return Path(models_dir) / KEPT_DIRNAME


@dataclass(frozen=True)
class CheckpointResult:
    """What a checkpoint pull fetched, checked and kept."""

    files: dict[str, dict[str, Any]]  # file -> {"sha256", "size", "verified_by"}
    commit: str | None
    size: int  # bytes of the checkpoint
    resumed_from: int  # bytes already on disk when this pull started
    skipped: tuple[str, ...] = ()  # optional files the hub does not have
    kept: Path | None = None  # where the checkpoint was kept; None: deleted after the conversion
    quantized: str | None = None
    converted_by_family: str | None = None  # the converter's family for the checkpoint

    @property
    def verified_by(self) -> str:
        ways = sorted({str(info.get("verified_by")) for info in self.files.values()})
        return ", ".join(ways)


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        return None
    for key, typ in (("files", dict), ("sizes", dict), ("absent", list)):
        if not isinstance(data.get(key), typ):
            return None
    return data


def _verified_on_disk(folder: Path, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The manifest's verified files that are still in the folder at their recorded size."""
    out = {}
    for name, info in manifest["files"].items():
        if not isinstance(info, dict) or not isinstance(info.get("size"), int):
            continue
        try:
            if (folder / name).stat().st_size == info["size"]:
                out[name] = info
        except OSError:
            continue
    return out


def _part_size(dest: Path) -> int:
    try:
        return partial_paths(dest)[0].stat().st_size
    except OSError:
        return 0


def checkpoint_partial(models_dir: Path, entry: CatalogEntry) -> PartialDownload | None:
    """A checkpoint download that was started and not converted yet (for the model list): bytes on
    disk (verified files and partial ones) of the checkpoint's size."""
    folder = checkpoint_dir(models_dir, entry)
    manifest = _read_manifest(manifest_path(models_dir, entry))
    if manifest is None:
        return None
    verified = _verified_on_disk(folder, manifest) if folder.is_dir() else {}
    wanted = [f for f in (*entry.files, *entry.optional_files) if f not in manifest["absent"]]
    done = sum(int(verified[f]["size"]) if f in verified else _part_size(folder / f) for f in wanted)
    if done == 0:  # resolved, nothing fetched (a refusal for disk space, say): nothing to resume
        return None
    sizes = manifest["sizes"]
    known = all(isinstance(sizes.get(f), int) for f in wanted)
    total = sum(int(sizes[f]) for f in wanted) if known else entry.checkpoint_size
    return PartialDownload(filename=entry.download_name, path=folder, done=done, total=total, repo=entry.repo,
                           repo_filename=None, revision=manifest.get("revision"), commit=manifest.get("commit"))


def checkpoint_downloaded(models_dir: Path, entry: CatalogEntry) -> bool:
    """Every file verified and on disk: the next pull converts without downloading."""
    manifest = _read_manifest(manifest_path(models_dir, entry))
    if manifest is None:
        return False
    verified = _verified_on_disk(checkpoint_dir(models_dir, entry), manifest)
    return all(f in verified for f in (*entry.files, *entry.optional_files) if f not in manifest["absent"])


def discard_checkpoint(models_dir: Path, entry: CatalogEntry) -> bool:
    """Delete a checkpoint download (not while a process works on it). True if there was one."""
    folder, manifest = checkpoint_dir(models_dir, entry), manifest_path(models_dir, entry)
    if not folder.exists() and not manifest.exists():
        return False
    lock = FileLock(lock_path(models_dir, entry))
    lock.path.parent.mkdir(parents=True, exist_ok=True)
    if not lock.acquire(blocking=False):
        raise HubError(f"{entry.name} is being downloaded or converted right now; cancel that first")
    try:
        shutil.rmtree(folder, ignore_errors=True)
        manifest.unlink(missing_ok=True)
        return True
    finally:
        lock.release(unlink=True)


@dataclass
class _Remaining:
    remote: RemoteFile
    have: int  # bytes of its .part file when the pull started


@dataclass
class CheckpointPull:
    """One checkpoint pull: `with CheckpointPull(...) as job: gguf = job.fetch_and_convert(); ...;
    job.finish()`. The lock is held from entering to leaving, so the manager registers the result
    before another process can touch the checkpoint."""

    entry: CatalogEntry
    models_dir: Path
    token: str | bool | None = None
    endpoint: str | None = None
    progress: ProgressCallback | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    retries: int = 5
    retry_delay: float = 1.0
    timeout: float = 30.0
    keep: bool = False
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.models_dir = Path(self.models_dir)
        self.folder = checkpoint_dir(self.models_dir, self.entry)
        self.manifest_file = manifest_path(self.models_dir, self.entry)
        self.target = self.models_dir / self.entry.installed_name
        self._lock = FileLock(lock_path(self.models_dir, self.entry))
        self.manifest: dict[str, Any] = {}
        self.resumed_from = 0
        self.total = 0
        self.sha256: str | None = None
        self.family: str | None = None

    # -- the lock -----------------------------------------------------------------------------------

    def __enter__(self) -> CheckpointPull:
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        if not self._lock.acquire(blocking=False):
            raise HubError(f"{self.entry.name} is already being downloaded or converted (by this app or another "
                           "dgchat)")
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release(unlink=True)

    # -- reporting ----------------------------------------------------------------------------------

    def _report(self, phase: str, done: int, total: int | None, *, name: str = "", speed: float | None = None,
                eta: float | None = None, message: str = "") -> None:
        if self.progress is not None:
            self.progress(Progress(phase=phase, name=name or self.entry.installed_name, done=done, total=total,
                                   speed=speed, eta=eta, resumed_from=self.resumed_from, message=message))

    def _check_cancel(self, done: int) -> None:
        if self.cancel.is_set():
            raise DownloadCancelled(
                f"download of {self.entry.title} paused at {progress_text(done, self.total)}; pull it again to resume",
                resumable=True, bytes_done=done, bytes_total=self.total or None)

    # -- the job ------------------------------------------------------------------------------------

    def fetch_and_convert(self) -> Path:
        """Download what is missing (verified file by file), then convert and quantize into the models
        folder. Returns the GGUF (validated by the converter, not registered yet)."""
        entry = self.entry
        self._load_manifest()
        verified = _verified_on_disk(self.folder, self.manifest)
        self.manifest["files"] = verified
        wanted = [f for f in (*entry.files, *entry.optional_files) if f not in self.manifest["absent"]]
        todo = [f for f in wanted if f not in verified]
        remaining: dict[str, _Remaining] = {}
        if todo:
            remaining = self._resolve(todo)
            wanted = [f for f in wanted if f not in self.manifest["absent"]]
        sizes = self.manifest["sizes"]
        self.total = sum(int(verified[f]["size"]) if f in verified else int(sizes.get(f) or 0) for f in wanted)
        self.resumed_from = sum(int(verified[f]["size"]) for f in verified) + sum(r.have for r in remaining.values())
        self._remove_stale_conversions()
        self._check_space(remaining, wanted)
        if remaining:
            self._download(remaining, wanted)
        elif todo == [] and verified:
            self.notes.append("the verified download from an earlier pull was reused (no network)")
        return self._convert()

    def _load_manifest(self) -> None:
        entry = self.entry
        data = _read_manifest(self.manifest_file)
        fresh = {"version": MANIFEST_VERSION, "entry": entry.name, "repo": entry.repo, "revision": entry.revision,
                 "commit": None, "sizes": {}, "absent": [], "files": {}}
        if data is not None and (data.get("repo"), data.get("revision")) != (entry.repo, entry.revision):
            self.notes.append(f"an earlier download of {data.get('repo')}@{data.get('revision')} was discarded: the "
                              f"catalog now names {entry.repo}@{entry.revision}")
            shutil.rmtree(self.folder, ignore_errors=True)
            data = None
        if data is None and self.folder.exists():  # files without a manifest cannot be trusted
            shutil.rmtree(self.folder, ignore_errors=True)
        self.manifest = data if data is not None else fresh
        self.folder.mkdir(parents=True, exist_ok=True)

    def _save_manifest(self) -> None:
        atomic_write_json(self.manifest_file, self.manifest)

    def _resolve(self, todo: list[str]) -> dict[str, _Remaining]:
        """One HEAD per file still to fetch, all at one commit. Optional files the hub does not have
        are recorded as absent."""
        entry = self.entry
        out: dict[str, _Remaining] = {}
        ordered = [f for f in todo if f in entry.files] + [f for f in todo if f not in entry.files]
        for i, name in enumerate(ordered):
            self._check_cancel(0)
            self._report("resolving", i, len(ordered), name=name)
            revision = self.manifest.get("commit") or entry.revision
            try:
                remote = resolve_remote(entry.repo or "", name, revision=revision, token=self.token,
                                        endpoint=self.endpoint, timeout=min(self.timeout, 20.0))
            except NotFoundOnHubError:
                if name in entry.files or self.manifest.get("commit") is None:  # the repo or revision is missing
                    raise
                self.manifest["absent"].append(name)
                self.notes.append(f"{name} is not in {entry.repo}: the checkpoint has none (optional)")
                continue
            if self.manifest.get("commit") is None:
                self.manifest["commit"] = remote.commit
            self.manifest["sizes"][name] = remote.size
            out[name] = _Remaining(remote, _part_size(self.folder / name))
        self._report("resolving", len(ordered), len(ordered), name=entry.repo or "")
        self._save_manifest()
        return out

    def _remove_stale_conversions(self) -> None:
        """Temporaries of a conversion into the same file that was killed (its `finally` never ran).
        Safe under the lock: only this pull converts into `target`."""
        marker = f"{PARTIAL_PREFIX}{self.target.name}-"
        removed = 0
        try:
            candidates = list(self.models_dir.iterdir())
        except OSError:
            return
        for path in candidates:
            if path.name.startswith(PARTIAL_PREFIX) and marker in path.name and path.is_file():
                try:
                    removed += path.stat().st_size
                    path.unlink()
                except OSError:
                    pass
        if removed:
            self.notes.append(f"removed {format_bytes(removed)} left by a conversion that was stopped")

    def _check_space(self, remaining: dict[str, _Remaining], wanted: list[str]) -> None:
        entry = self.entry
        sizes = self.manifest["sizes"]
        to_download = sum(max(int(r.remote.size or 0) - r.have, 0) for r in remaining.values())
        weights = sum(int(sizes.get(f) or self.manifest["files"].get(f, {}).get("size") or 0)
                      for f in wanted if f.endswith(".safetensors"))
        result = result_estimate(entry, weights)
        margin = max(SPACE_MARGIN, CONVERT_SPACE_MARGIN)
        need = to_download + weights + result + margin
        try:
            free = shutil.disk_usage(self.models_dir).free
        except OSError:
            return
        if free >= need:
            return
        have = self.resumed_from
        parts = ([f"{format_bytes(to_download)} to download"] if to_download else []) + [
            f"{format_bytes(weights)} for the unquantized GGUF the conversion writes first",
            f"≈{format_bytes(result)} for the {entry.quant} result",
            f"{format_bytes(margin)} margin"]
        kept = f"; the {format_bytes(have)} downloaded so far are kept" if have else ""
        raise DiskFullError(
            f"not enough disk space for {entry.title}: needs {format_bytes(need)} ({' + '.join(parts)}), "
            f"{format_bytes(free)} free in {self.models_dir}{kept}",
            needed=need, free=free, resumable=have > 0, bytes_done=have, bytes_total=self.total or None)

    def _download(self, remaining: dict[str, _Remaining], wanted: list[str]) -> None:
        entry = self.entry
        verified = self.manifest["files"]
        # the small files first (a wrong config or tokenizer shows in seconds), the weights last
        for name in sorted(wanted, key=lambda f: f.endswith(".safetensors")):
            if name in verified or name not in remaining:
                continue
            base = sum(int(v["size"]) for v in verified.values())
            self._check_cancel(base + remaining[name].have)

            def on_progress(p: Progress, base: int = base, name: str = name) -> None:
                if p.phase == "downloading":
                    done = base + p.done
                    eta = (self.total - done) / p.speed if p.speed else None
                    self._report("downloading", done, self.total, name=name, speed=p.speed, eta=eta,
                                 message=p.message)
                elif p.phase == "verifying":
                    self._report("verifying", p.done, p.total, name=name)

            job = Downloader(entry.repo or "", name, self.folder / name, revision=self.manifest["commit"] or
                             entry.revision, token=self.token, endpoint=self.endpoint,
                             sha256=entry.file_sha256.get(name), progress=on_progress, cancel=self.cancel,
                             retries=self.retries, retry_delay=self.retry_delay, timeout=self.timeout,
                             remote=remaining[name].remote)
            try:
                res = job.run()
            except VerificationError as exc:
                raise VerificationError(f"{entry.repo}: {exc}") from None
            except DownloadError as exc:
                # the file's bytes are the checkpoint's: a UI shows what the whole download keeps
                on_disk = base + _part_size(self.folder / name)
                exc.bytes_done, exc.bytes_total = on_disk, self.total or None
                exc.resumable = exc.resumable or on_disk > 0
                raise
            self.notes.extend(n for n in job.notes if n not in self.notes)
            verified[name] = {"sha256": res.sha256, "size": res.size, "verified_by": res.verified_by}
            self._save_manifest()
        done = sum(int(v["size"]) for v in verified.values())
        self._report("downloading", done, self.total, name=entry.repo or "")

    def _convert(self) -> Path:
        entry = self.entry
        ckpt = format_bytes(self.total)

        def on_write(done: int, total: int, _tensor: str) -> None:
            if self.cancel.is_set():  # raising here makes the converter delete its temporary files
                raise DownloadCancelled(
                    f"conversion of {entry.title} paused; the verified download ({ckpt}) is kept, pull again to "
                    "convert it (no download)", resumable=True)
            self._report("converting", done, total)

        def on_quantize(i: int, n: int, _tensor: str) -> None:
            # called from llama.cpp's log hook in its worker thread: must never raise into it (a
            # quantization cannot be interrupted; a cancel takes effect once it ends)
            try:
                self._report("quantizing", i, n)
            except Exception:  # noqa: BLE001 - a UI callback failing must not reach ctypes
                pass

        self._report("converting", 0, None)
        try:
            result = convert(self.folder, self.target, quantize=entry.quant, progress=on_write,
                             quantize_progress=on_quantize)
        except ConvertError as exc:
            raise ConvertError(f"{entry.title}: {exc}; the verified download ({ckpt}) is kept: pull again to "
                               "convert it (no download)") from None
        self.family = result.family
        size = self.target.stat().st_size
        self._report("verifying", 0, size)
        self.sha256 = sha256_file(self.target, progress=lambda d, t: self._report("verifying", d, t))
        return self.target

    def finish(self) -> CheckpointResult:
        """The conversion is verified and registered: delete the checkpoint, or keep it (moved out of
        .partial into checkpoints/)."""
        kept: Path | None = None
        nested = paths.partial_dir(self.folder)
        shutil.rmtree(nested, ignore_errors=True)  # empty once every file is in place
        if self.keep:
            kept = self._keep()
        else:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.manifest_file.unlink(missing_ok=True)
        return CheckpointResult(
            files=dict(self.manifest["files"]), commit=self.manifest.get("commit"), size=self.total,
            resumed_from=self.resumed_from, skipped=tuple(self.manifest["absent"]), kept=kept,
            quantized=self.entry.quant, converted_by_family=self.family)

    def _keep(self) -> Path:
        root = kept_root(self.models_dir)
        root.mkdir(parents=True, exist_ok=True)
        base = (self.entry.repo or self.entry.name).rsplit("/", 1)[-1]
        commit = (self.manifest.get("commit") or "")[:12]
        dest = root / base
        if dest.exists():  # another commit (or another kept copy) is there: this one gets its commit's name
            dest = root / f"{base}-{commit or 'latest'}"
        if dest.exists():  # the same commit is kept there already: this copy adds nothing
            shutil.rmtree(self.folder, ignore_errors=True)
            self.notes.append(f"the checkpoint is kept already in {dest}")
            return dest
        os.replace(self.folder, dest)
        return dest


__all__ = [
    "CheckpointPull", "CheckpointResult", "checkpoint_dir", "checkpoint_downloaded", "checkpoint_partial",
    "discard_checkpoint", "kept_root", "manifest_path",
]
