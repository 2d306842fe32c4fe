"""Checkpoint entries end to end (dgchat.hub.checkpoint): a tiny real checkpoint on the local stand-in
hub, downloaded file by file (resumable, verified), converted and quantized by the real converter and
llama.cpp's quantizer, registered; resumed after a cancel, a SIGKILL mid-download and a SIGKILL
mid-conversion; a corrupt file refused and fetched again; the disk check counting the checkpoint,
the unquantized intermediate and the result."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dgchat.hub import checkpoint as hub_checkpoint
from dgchat.hub import download as dl
from dgchat.hub.catalog import load_catalog
from dgchat.hub.errors import DiskFullError, DownloadCancelled, HubError, NotFoundOnHubError, VerificationError
from dgchat.hub.hardware import Hardware
from dgchat.hub.manager import ModelManager
from dgchat.model_backend.gguf_file import read_gguf_header
from fixtures import checkpoint_hub as ck

pytest.importorskip("tokenizers")

GIB = 1024**3
HW = Hardware(cpu_cores=4, ram_total=16 * GIB, ram_available=None, disk_free=100 * GIB, models_dir=Path("/m"),
              gpu_offload=False)
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def served(hub, base: Path) -> dict:
    return ck.host(hub, base)


@pytest.fixture
def catalog_path(tmp_path: Path, base: Path) -> Path:
    return ck.write_catalog(tmp_path / "catalog.toml", base)


@pytest.fixture
def mgr(hub, hf_home, served, catalog_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelManager:
    monkeypatch.setenv("DGCHAT_HOME", str(tmp_path / "dgchat-home"))
    monkeypatch.setattr(dl, "PROGRESS_INTERVAL", 0.0)
    return ModelManager(endpoint=hub.endpoint, catalog=load_catalog(catalog_path), hf_cache_dir=hf_home / "hub")


def row(m: ModelManager, name: str = ck.NAME):
    return next(r for r in m.listing(HW) if r.name == name)


def weights_gets(hub) -> list:
    return [g for g in hub.cdn_gets() if "safetensors" in g.path]


def partial_dir(m: ModelManager) -> Path:
    return m.models_dir / ".partial"


def assert_no_leftovers(m: ModelManager) -> None:
    """Nothing of the checkpoint or of a conversion is left in the models folder."""
    left = [p.name for p in m.models_dir.iterdir() if p.name.startswith(".dgchat-partial-")]
    assert left == []
    assert not (partial_dir(m) / f"{ck.NAME}.checkpoint").exists()
    assert not (partial_dir(m) / f"{ck.NAME}.checkpoint.json").exists()
    assert not (partial_dir(m) / f"{ck.NAME}.checkpoint.lock").exists()


def test_download_convert_quantize_register(mgr: ModelManager, hub, base: Path) -> None:
    entry = mgr.catalog.get(ck.NAME)
    r = row(mgr)
    assert r.status == "available" and r.needs_convert and r.size == entry.size
    assert r.fit.disk_need == 2 * entry.checkpoint_size + entry.size  # checkpoint + intermediate + result
    events: list = []
    res = mgr.pull(ck.NAME, progress=events.append, retry_delay=0)
    phases = [e.phase for e in events]
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    # download (HEADs, bytes, hashes), then convert, quantize, and the result's hash
    assert order[0] == "resolving" and order[-1] == "done"
    for phase in ("downloading", "verifying", "converting", "quantizing"):
        assert phase in phases, phase
    assert max(i for i, p in enumerate(phases) if p == "downloading") < phases.index("converting")
    assert phases.index("converting") < phases.index("quantizing")
    files = ck.checkpoint_files(base)
    total = sum(len(files[n]) for n in files if n != "chat_template.jinja")
    downloads = [e for e in events if e.phase == "downloading"]
    assert downloads[-1].done == downloads[-1].total == total  # one bar over the whole checkpoint
    assert all(0 <= e.done <= e.total for e in downloads) and {e.name for e in downloads} >= set(ck.weight_names(base))
    converting = [e for e in events if e.phase == "converting" and e.total]
    assert converting and converting[-1].done == converting[-1].total
    quantizing = [e for e in events if e.phase == "quantizing"]
    assert quantizing[-1].done == quantizing[-1].total > 1

    path = mgr.models_dir / "tiny-llada-checkpoint-Q4_K_M.gguf"
    assert res.action == "downloaded" and res.path == path == mgr.model_path(ck.NAME)
    header = read_gguf_header(path)
    assert header.get("general.file_type") == 15  # llama.cpp's MOSTLY_Q4_K_M
    assert header.tensors["blk.0.ffn_up.weight"].type_name == "Q4_K"
    m = res.model
    assert m.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and m.owned and m.source == "download"
    assert m.catalog == ck.NAME and m.repo == ck.REPO and m.commit == hub.repos[ck.REPO] and m.filename is None
    assert "from a checkpoint whose 7 files were checked by hub LFS etag, hub git etag (sha1)" in m.verified_by
    recorded = m.converted_from["files"]
    assert {n: v["sha256"] for n, v in recorded.items()} == {
        n: hashlib.sha256(d).hexdigest() for n, d in files.items() if n != "chat_template.jinja"}
    assert m.converted_from["commit"] == hub.repos[ck.REPO] and m.converted_from["quantized"] == "Q4_K_M"
    assert res.checkpoint.kept is None and res.checkpoint.skipped == ("chat_template.jinja",)
    assert any("chat_template.jinja is not in" in n for n in res.notes)
    assert_no_leftovers(mgr)  # the checkpoint is deleted after the verified conversion
    r = row(mgr)
    assert r.status == "installed" and r.path == path and not r.needs_convert and r.fit.disk_need == 0
    mgr.verify(ck.NAME)
    # every file came from the one commit the first HEAD named
    commit = hub.repos[ck.REPO]
    resolves = [q.path for q in hub.requests("HEAD", f"/{ck.REPO}/resolve/")]
    assert resolves[0].startswith(f"/{ck.REPO}/resolve/main/")
    assert all(f"/resolve/{commit}/" in p for p in resolves[1:])
    n = len(hub.log)
    assert mgr.pull(ck.NAME).action == "already installed" and len(hub.log) == n
    out = mgr.remove(ck.NAME)
    assert out.deleted == (path,) and not path.exists()


def test_keep_checkpoint(mgr: ModelManager, base: Path) -> None:
    res = mgr.pull(ck.NAME, keep_checkpoint=True, retry_delay=0)
    kept = mgr.models_dir / "checkpoints" / "tiny-llada-checkpoint"
    assert res.checkpoint.kept == kept and res.model.converted_from["path"] == str(kept)
    for name, data in ck.checkpoint_files(base).items():
        if name != "chat_template.jinja":
            assert (kept / name).read_bytes() == data, name
    assert sorted(p.name for p in kept.iterdir()) == sorted(n for n in ck.checkpoint_files(base)
                                                           if n != "chat_template.jinja")
    assert_no_leftovers(mgr)
    assert any(f"kept in {kept}" in n for n in res.notes)
    out = mgr.remove(ck.NAME)
    assert out.deleted == (res.path,) and kept.is_dir()  # the kept checkpoint is the user's to delete


def test_cancel_mid_download_then_resume(mgr: ModelManager, hub, served, base: Path) -> None:
    cancel = threading.Event()
    shard = ck.weight_names(base)[0]

    def stop(p) -> None:
        if p.phase == "downloading" and p.name == shard and p.done > 1_000_000:
            cancel.set()

    with pytest.raises(DownloadCancelled, match="paused at") as info:
        mgr.pull(ck.NAME, cancel=cancel, progress=stop, retry_delay=0)
    kept = info.value.bytes_done  # the checkpoint's bytes on disk, not the one file's
    assert info.value.resumable and 1_000_000 < kept < info.value.bytes_total
    r = row(mgr)
    assert r.status == "partial" and r.partial.done == kept and r.partial.total == info.value.bytes_total
    assert mgr.installed() == []
    part = partial_dir(mgr) / f"{ck.NAME}.checkpoint" / ".partial" / f"{shard}.part"
    have = part.stat().st_size
    n = len(hub.cdn_gets())
    res = mgr.pull(ck.NAME, retry_delay=0)
    gets = hub.cdn_gets()[n:]
    assert [g.range for g in gets if served[shard].sha256 in g.path] == [f"bytes={have}-"]
    again = sum(len(served[_by_sha(served, g.path)].data) - (int(g.range[6:-1]) if g.range else 0) for g in gets)
    assert again == info.value.bytes_total - kept  # the rest, and not a byte more
    assert res.checkpoint.resumed_from == kept and res.path.exists()


def test_cancel_mid_conversion_converts_again_without_a_download(mgr: ModelManager, hub) -> None:
    cancel = threading.Event()

    def stop(p) -> None:
        if p.phase == "converting" and p.done:
            cancel.set()

    with pytest.raises(DownloadCancelled, match="conversion of .* paused; the verified download .* is kept"):
        mgr.pull(ck.NAME, cancel=cancel, progress=stop, retry_delay=0)
    assert mgr.installed() == []
    r = row(mgr)
    assert r.status == "partial" and r.partial.done == r.partial.total
    assert any("the conversion did not finish" in n for n in r.notes)
    assert [p.name for p in mgr.models_dir.iterdir() if p.name.startswith(".dgchat-partial-")] == []
    n = len(hub.log)
    res = mgr.pull(ck.NAME, retry_delay=0)
    assert len(hub.log) == n  # no request at all: converted from the kept download
    assert any("reused (no network)" in note for note in res.notes) and res.path.exists()
    assert_no_leftovers(mgr)


def test_corrupt_file_is_refused_and_downloaded_again(mgr: ModelManager, hub, served, base: Path) -> None:
    shard = ck.weight_names(base)[1]
    served[shard].corrupt_at = 5000
    with pytest.raises(VerificationError, match=f"{ck.REPO}: {shard} is corrupt: sha256 .* the file was deleted"):
        mgr.pull(ck.NAME, retry_delay=0)
    folder = partial_dir(mgr) / f"{ck.NAME}.checkpoint"
    assert not (folder / shard).exists() and not (folder / ".partial" / f"{shard}.part").exists()
    manifest = json.loads((partial_dir(mgr) / f"{ck.NAME}.checkpoint.json").read_text())
    assert shard not in manifest["files"] and ck.weight_names(base)[0] in manifest["files"]  # the good one is kept
    assert mgr.installed() == []
    served[shard].corrupt_at = None
    before = {n: f.gets for n, f in served.items()}
    res = mgr.pull(ck.NAME, retry_delay=0)
    fetched = {n for n, f in served.items() if f.gets > before[n]}
    assert fetched == {shard}  # only the refused file came again
    assert res.path.exists()


def test_disk_check_counts_checkpoint_intermediate_and_result(mgr: ModelManager, hub, base: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    entry = mgr.catalog.get(ck.NAME)
    files = ck.checkpoint_files(base)
    download = sum(len(d) for n, d in files.items() if n != "chat_template.jinja")
    weights = sum(len(d) for n, d in files.items() if n.endswith(".safetensors"))
    from dgchat.convert.quantize import estimate_bytes
    from dgchat.convert.writer import _SPACE_MARGIN

    assert hub_checkpoint.CONVERT_SPACE_MARGIN == _SPACE_MARGIN >= dl.SPACE_MARGIN
    # the result: the converter's estimate for bf16 weights when the catalog's is smaller
    result = max(entry.size, estimate_bytes(weights // 2, 0, "Q4_K_M"))
    need = download + weights + result + _SPACE_MARGIN
    real = hub_checkpoint.shutil.disk_usage

    def free(amount: int):
        def usage(path):
            u = real(path)
            return type(u)(u.total, u.total - amount, amount)
        return usage

    # room for the download alone (and then some), not for the conversion as well
    monkeypatch.setattr(hub_checkpoint.shutil, "disk_usage", free(need - 1))
    with pytest.raises(DiskFullError) as info:
        mgr.pull(ck.NAME, retry_delay=0)
    msg = str(info.value)
    assert msg.startswith(f"not enough disk space for {entry.title}: needs ")
    assert "to download + " in msg and "for the unquantized GGUF the conversion writes first" in msg
    assert "for the Q4_K_M result" in msg and "\n" not in msg
    assert info.value.needed == need and info.value.free == need - 1
    assert hub.cdn_gets() == []  # refused before the first byte
    monkeypatch.setattr(hub_checkpoint.shutil, "disk_usage", free(need))
    assert mgr.pull(ck.NAME, retry_delay=0).path.exists()


def test_rm_drops_a_partial_checkpoint(mgr: ModelManager, base: Path) -> None:
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled):
        mgr.pull(ck.NAME, cancel=cancel, retry_delay=0,
                 progress=lambda p: cancel.set() if p.phase == "downloading" and p.done > 500_000 else None)
    assert row(mgr).status == "partial"
    out = mgr.remove(ck.NAME)
    assert out.partial_removed and row(mgr).status == "available"
    assert not (partial_dir(mgr) / f"{ck.NAME}.checkpoint").exists()


def test_a_missing_required_file_is_a_clear_404(mgr: ModelManager, hub) -> None:
    hub.files.pop((ck.REPO, "tokenizer.json"))
    with pytest.raises(NotFoundOnHubError, match=f"no file 'tokenizer.json' in {ck.REPO}"):
        mgr.pull(ck.NAME, retry_delay=0)
    assert mgr.installed() == [] and hub.cdn_gets() == []


def test_one_process_per_checkpoint(mgr: ModelManager) -> None:
    from dgchat.hub.util import FileLock

    lock = FileLock(hub_checkpoint.lock_path(mgr.models_dir, mgr.catalog.get(ck.NAME)))
    lock.path.parent.mkdir(parents=True, exist_ok=True)
    assert lock.acquire(blocking=False)
    try:
        with pytest.raises(HubError, match="is already being downloaded or converted"):
            mgr.pull(ck.NAME, retry_delay=0)
    finally:
        lock.release(unlink=True)


# -- a process killed with SIGKILL, and a new one that resumes ------------------------------------


def _child(catalog: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "fixtures.checkpoint_hub", str(catalog), ck.NAME, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def _wait(predicate, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the pull ended before {what}: {proc.communicate()}")
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=20)
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture
def env(hub, hf_home, served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dgchat-home"
    monkeypatch.setenv("DGCHAT_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    return home / "data" / "models"


def test_killed_mid_download_resumes_in_a_new_process(env: Path, hub, served, catalog_path: Path,
                                                      base: Path) -> None:
    shard = ck.weight_names(base)[0]
    stall = 1_500_000
    served[shard].stall_at = stall
    part = env / ".partial" / f"{ck.NAME}.checkpoint" / ".partial" / f"{shard}.part"
    proc = _child(catalog_path)
    try:
        assert hub.stalled.wait(60), proc.communicate()
        _wait(lambda: part.exists() and part.stat().st_size >= stall, proc, "the stall")
        _kill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    served[shard].stall_at = None
    hub.release_stall.set()
    assert part.stat().st_size == stall
    served_first = sum(len(served[n].data) for n in served if n != "chat_template.jinja")
    n = len(hub.cdn_gets())
    again = subprocess.run([sys.executable, "-m", "fixtures.checkpoint_hub", str(catalog_path), ck.NAME],
                           capture_output=True, text=True, timeout=180,
                           env=dict(os.environ, PYTHONPATH=str(TESTS)))
    assert again.returncode == 0, again.stderr
    assert "installed tiny-llada-ckpt-q4_k_m (downloaded)" in again.stdout
    gets = hub.cdn_gets()[n:]
    # the shard continued at the stall; files verified before the kill were not fetched again
    assert [g.range for g in gets if shard in g.path or served[shard].sha256 in g.path] == [f"bytes={stall}-"]
    transferred = sum(len(served[_by_sha(served, g.path)].data) - (int(g.range[6:-1]) if g.range else 0)
                      for g in gets)
    assert transferred < served_first
    assert (env / "tiny-llada-checkpoint-Q4_K_M.gguf").exists()
    assert not (env / ".partial" / f"{ck.NAME}.checkpoint").exists()


def _by_sha(served: dict, path: str) -> str:
    return next(n for n, f in served.items() if f.sha256 in path)


def test_killed_mid_conversion_converts_again_without_downloading(env: Path, hub, catalog_path: Path,
                                                                  tmp_path: Path) -> None:
    marker = tmp_path / "converting"
    proc = _child(catalog_path, "--hold-conversion", str(marker))
    try:
        _wait(marker.exists, proc, "the conversion", timeout=120)
        stale = [p for p in env.iterdir() if p.name.startswith(".dgchat-partial-")]
        assert stale  # the converter's temporary file, mid-write
        _kill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert all(p.exists() for p in stale)  # a SIGKILL runs no cleanup
    n = len(hub.log)
    again = subprocess.run([sys.executable, "-m", "fixtures.checkpoint_hub", str(catalog_path), ck.NAME],
                           capture_output=True, text=True, timeout=180, env=dict(os.environ, PYTHONPATH=str(TESTS)))
    assert again.returncode == 0, again.stderr
    assert len(hub.log) == n  # not one request: the verified download was converted again
    assert "reused (no network)" in again.stdout and "left by a conversion that was stopped" in again.stdout
    assert [p.name for p in env.iterdir() if p.name.startswith(".dgchat-partial-")] == []
    assert read_gguf_header(env / "tiny-llada-checkpoint-Q4_K_M.gguf").get("general.file_type") == 15
