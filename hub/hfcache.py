"""GGUF files already in the Hugging Face cache, found without any network call.

`huggingface_hub.scan_cache_dir()` walks the cache layout (models--owner--name/{blobs,snapshots,
refs}); a blob of an LFS file is named by its sha256, which lets dgchat verify a cached file
without asking the hub. A cached file is used in place (dgchat never deletes it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dgchat.hub import paths

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class CachedGguf:
    repo: str
    filename: str  # path inside the repo
    commit: str
    path: Path  # the snapshot path (usually a symlink into blobs/)
    blob_path: Path
    size: int
    refs: tuple[str, ...]  # branches/tags that point at this commit ("main")
    sha256: str | None  # the blob's name, when it is an LFS sha256
    git_sha1: str | None = None  # the blob's name, when it is a git-stored file's sha1 (its ETag)

    @property
    def label(self) -> str:
        return f"{self.repo}/{self.filename}"


def scan_hf_cache(cache_dir: Path | None = None) -> list[CachedGguf]:
    """Every .gguf file of a model repo in the cache (newest commit first within a repo)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    folder = Path(cache_dir) if cache_dir is not None else paths.hf_cache_dir()
    if not folder.is_dir():
        return []
    try:
        info = scan_cache_dir(folder)
    except (CacheNotFound, OSError):
        return []
    found: list[CachedGguf] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            for f in sorted(rev.files, key=lambda f: f.file_name):
                rel = Path(f.file_path).relative_to(rev.snapshot_path).as_posix()
                if not rel.lower().endswith(".gguf") or not Path(f.blob_path).exists():
                    continue
                blob_name = Path(f.blob_path).name
                found.append(CachedGguf(
                    repo=repo.repo_id, filename=rel, commit=rev.commit_hash, path=Path(f.file_path),
                    blob_path=Path(f.blob_path), size=int(f.size_on_disk), refs=tuple(sorted(rev.refs)),
                    sha256=blob_name if _SHA256.match(blob_name) else None,
                    git_sha1=blob_name if _SHA1.match(blob_name) else None,
                ))
    return found


def find_in_hf_cache(repo: str, filename: str, revision: str = "main", cache_dir: Path | None = None,
                     scanned: list[CachedGguf] | None = None) -> CachedGguf | None:
    """The cached copy of repo/filename: the one `revision` points at, else the newest cached one."""
    items = scanned if scanned is not None else scan_hf_cache(cache_dir)
    matches = [c for c in items if c.repo == repo and c.filename == filename]
    for c in matches:
        if revision in c.refs or c.commit == revision:
            return c
    return matches[0] if matches else None
