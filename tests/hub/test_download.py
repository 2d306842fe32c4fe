"""Resumable verified downloads against a local server that speaks the hub's file contract.

Every test goes through huggingface_hub 2.4.0 for the HEAD (hf_hub_url + get_hf_file_metadata, with
HF_HUB_OFFLINE on as dgchat runs) and through dgchat's own transfer for the bytes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dgchat.hub import download as dl
from dgchat.hub.download import Progress, discard_partial, download_file, list_partials, partial_paths
from dgchat.hub.errors import (
    DiskFullError,
    DownloadCancelled,
    DownloadError,
    HubError,
    NoNetworkError,
    NotFoundOnHubError,
    TokenRequiredError,
    VerificationError,
)
from dgchat.hub.util import FileLock
from fixtures.hub_fixtures import FILE, REPO, model_bytes

DATA_SIZE = len(model_bytes())


@pytest.fixture(autouse=True)
def _every_chunk_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Localhost moves the whole file within one 0.1 s throttle interval; tests that act on a
    progress report (cancel, fill the disk) need one per chunk."""
    monkeypatch.setattr(dl, "PROGRESS_INTERVAL", 0.0)


def fetch(server, dest: Path, **kw):
    kw.setdefault("retry_delay", 0.0)
    return download_file(kw.pop("repo", REPO), kw.pop("filename", FILE), dest, endpoint=server.endpoint, **kw)


def assert_clean(dest: Path) -> None:
    """No .part, sidecar or lock left next to a finished download."""
    folder = dest.parent / ".partial"
    assert not folder.exists() or list(folder.iterdir()) == []


def partial_files(dest: Path) -> list[str]:
    folder = dest.parent / ".partial"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def closed_endpoint() -> str:
    """A local address nothing listens on: connecting to it is refused at once."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_download_verifies_and_reports(hub, hf_home, tmp_path: Path) -> None:
    reports: list[Progress] = []
    res = fetch(hub, tmp_path / "m.gguf", progress=reports.append)
    data = (tmp_path / "m.gguf").read_bytes()
    assert data == model_bytes()
    assert res.sha256 == hashlib.sha256(data).hexdigest() == res.remote.sha256
    assert res.verified_by == "hub LFS etag" and res.size == DATA_SIZE and res.resumed_from == 0
    assert res.remote.commit == hub.repos[REPO] and res.remote.url.endswith(f"/resolve/{res.remote.commit}/{FILE}")
    phases = [r.phase for r in reports]
    assert phases[0] == "resolving" and phases[-1] == "done"
    assert phases.index("downloading") < phases.index("verifying") < phases.index("done")
    got = [r.done for r in reports if r.phase == "downloading"]
    assert got == sorted(got) and got[-1] == DATA_SIZE
    assert all(r.total == DATA_SIZE for r in reports if r.phase == "downloading")
    assert_clean(tmp_path / "m.gguf")
    # huggingface_hub is still offline for everything else
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE is True


_rng = random.Random(20240607)
_CASES = []
for _i in range(24):
    n_cuts = 1 + _i % 3
    _CASES.append((sorted(_rng.sample(range(1, DATA_SIZE - 1), n_cuts)), _i % 5 == 4))


@pytest.mark.parametrize("cuts,drop_first", _CASES, ids=[f"cut{i}" for i in range(len(_CASES))])
def test_cut_connections_resume_to_identical_file(hub, hf_home, tmp_path: Path, cuts: list[int],
                                                  drop_first: bool) -> None:
    f = hub.files[(REPO, FILE)]
    f.cuts = list(cuts)
    f.drop_next = 1 if drop_first else 0  # and one connection dropped before any response
    res = fetch(hub, tmp_path / "m.gguf")
    assert (tmp_path / "m.gguf").read_bytes() == model_bytes()
    assert res.sha256 == f.sha256
    gets = hub.cdn_gets()
    assert len(gets) == len(cuts) + 1 + int(drop_first)
    # every reconnect asked for the bytes after what it had (a RST may lose what was in flight),
    # never past the cut that ended the previous response
    starts = [int(g.range.split("=")[1].rstrip("-")) if g.range else 0 for g in gets]
    assert starts == sorted(starts) and starts[-1] <= cuts[-1]
    assert all(g.status == 206 for g in gets if g.range)
    assert_clean(tmp_path / "m.gguf")


def test_corrupted_byte_is_caught_and_deleted(hub, hf_home, tmp_path: Path) -> None:
    hub.files[(REPO, FILE)].corrupt_at = DATA_SIZE // 3
    with pytest.raises(VerificationError, match=r"m\.gguf is corrupt: sha256 .* the file was deleted"):
        fetch(hub, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()
    part, side, _ = partial_paths(tmp_path / "m.gguf")
    assert not part.exists() and not side.exists()


def test_server_that_ignores_range_still_gives_identical_file(hub, hf_home, tmp_path: Path) -> None:
    f = hub.files[(REPO, FILE)]
    f.ignore_range = True
    f.cuts = [DATA_SIZE // 2]
    res = fetch(hub, tmp_path / "m.gguf")
    assert (tmp_path / "m.gguf").read_bytes() == model_bytes()
    assert any("ignored the Range request" in n for n in res.notes)


def test_cancel_then_resume_in_a_new_download(hub, hf_home, tmp_path: Path) -> None:
    cancel = threading.Event()

    def stop_after_a_megabyte(p: Progress) -> None:
        if p.phase == "downloading" and p.done >= 1_000_000:
            cancel.set()

    dest = tmp_path / "m.gguf"
    with pytest.raises(DownloadCancelled, match="paused at .*pull it again to resume") as info:
        fetch(hub, dest, progress=stop_after_a_megabyte, cancel=cancel)
    assert info.value.resumable and 1_000_000 <= info.value.bytes_done < DATA_SIZE
    part, side, _ = partial_paths(dest)
    have = part.stat().st_size
    assert have == info.value.bytes_done and model_bytes()[:have] == part.read_bytes()
    sidecar = json.loads(side.read_text())
    assert sidecar["etag"] == hub.files[(REPO, FILE)].sha256 and sidecar["size"] == DATA_SIZE
    assert sidecar["commit"] == hub.repos[REPO] and sidecar["repo"] == REPO
    assert not dest.exists()
    assert partial_files(dest) == ["m.gguf.part", "m.gguf.part.json"]  # what a resume needs, no lock
    [partial] = list_partials(tmp_path)
    assert partial.filename == "m.gguf" and partial.done == have and partial.total == DATA_SIZE

    n_before = len(hub.cdn_gets())
    res = fetch(hub, dest)
    assert dest.read_bytes() == model_bytes() and res.resumed_from == have
    assert [g.range for g in hub.cdn_gets()[n_before:]] == [f"bytes={have}-"]
    assert any("resumed at" in n for n in res.notes)
    assert_clean(dest)


def test_cancel_interrupts_a_stalled_connection(hub, hf_home, tmp_path: Path) -> None:
    hub.files[(REPO, FILE)].stall_at = 2_000_000
    cancel = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            fetch(hub, tmp_path / "m.gguf", cancel=cancel, timeout=60)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    assert hub.stalled.wait(10)
    time.sleep(0.2)
    t0 = time.monotonic()
    cancel.set()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 2.0
    assert isinstance(errors[0], DownloadCancelled)
    part, _, _ = partial_paths(tmp_path / "m.gguf")
    assert 0 < part.stat().st_size <= 2_000_000
    assert part.read_bytes() == model_bytes()[: part.stat().st_size]


def test_retries_exhausted_keep_a_resumable_partial(hub, hf_home, tmp_path: Path) -> None:
    f = hub.files[(REPO, FILE)]
    f.cuts = [1_500_000]
    f.drop_next = 0
    messages: list[str] = []

    def on_progress(p: Progress) -> None:
        if p.message:
            messages.append(p.message)
            f.drop_next = 10  # from the first failure on, every reconnect is dropped

    with pytest.raises(DownloadError, match=r"failed at .*kept, pull again to resume") as info:
        fetch(hub, tmp_path / "m.gguf", retries=2, progress=on_progress)
    assert info.value.resumable and 0 < info.value.bytes_done <= 1_500_000
    assert any("retrying" in m and "attempt 1 of 2" in m for m in messages)
    f.drop_next = 0
    res = fetch(hub, tmp_path / "m.gguf")
    assert res.resumed_from == info.value.bytes_done
    assert (tmp_path / "m.gguf").read_bytes() == model_bytes()


def test_file_changed_upstream_discards_the_partial(hub, hf_home, tmp_path: Path) -> None:
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled):
        fetch(hub, tmp_path / "m.gguf", cancel=cancel,
              progress=lambda p: cancel.set() if p.phase == "downloading" and p.done > 500_000 else None)
    new = bytes(reversed(model_bytes()))
    hub.replace_file(REPO, FILE, new)
    res = fetch(hub, tmp_path / "m.gguf")
    assert (tmp_path / "m.gguf").read_bytes() == new and res.resumed_from == 0
    assert any("changed on the hub" in n for n in res.notes)


@pytest.mark.parametrize("repo,filename,revision,message", [
    ("nobody/nothing-GGUF", FILE, "main", "no repository nobody/nothing-GGUF"),
    (REPO, "missing.Q4_K_M.gguf", "main", "no file 'missing.Q4_K_M.gguf' in dgchat-test/tiny-llada-GGUF"),
    (REPO, FILE, "v9", "has no revision 'v9'"),
])
def test_404s_give_clear_messages_and_leave_nothing(hub, hf_home, tmp_path: Path, repo, filename, revision,
                                                    message) -> None:
    with pytest.raises(NotFoundOnHubError, match=message):
        fetch(hub, tmp_path / "m.gguf", repo=repo, filename=filename, revision=revision)
    assert not (tmp_path / "m.gguf").exists()
    assert_clean(tmp_path / "m.gguf")  # no .part and no .lock
    assert hub.cdn_gets() == []


@pytest.mark.parametrize("where,reason", [
    ("refused", "127.0.0.1 refused the connection"),
    ("unresolvable", "dgchat-no-such-hub.invalid could not be looked up (no answer from DNS)"),
])
def test_no_network_is_said_plainly_and_leaves_no_lock(hf_home, tmp_path: Path, where: str, reason: str) -> None:
    endpoint = closed_endpoint() if where == "refused" else "http://dgchat-no-such-hub.invalid"
    dest = tmp_path / "m.gguf"
    with pytest.raises(NoNetworkError) as info:
        download_file(REPO, FILE, dest, endpoint=endpoint, retry_delay=0.0)
    assert str(info.value) == f"no network connection: {reason}; nothing was downloaded"
    assert info.value.reason == reason and not info.value.resumable
    assert not dest.exists()
    assert_clean(dest)  # the lock taken for the attempt is gone


def test_losing_the_network_mid_download_keeps_the_partial_and_no_lock(hub, hf_home, tmp_path: Path) -> None:
    f = hub.files[(REPO, FILE)]
    f.cuts = [1_500_000]
    f.drop_next = 0

    def on_progress(p: Progress) -> None:
        if p.message:  # the first reconnect is due: the hub goes away (connections refused from now on)
            hub.stop()

    dest = tmp_path / "m.gguf"
    with pytest.raises(NoNetworkError, match=r"^no network connection: 127\.0\.0\.1 refused the connection; "
                       r"the download of m\.gguf stopped at .*kept, pull again to resume") as info:
        fetch(hub, dest, retries=2, progress=on_progress)
    assert info.value.resumable and 0 < info.value.bytes_done <= 1_500_000
    assert partial_files(dest) == ["m.gguf.part", "m.gguf.part.json"]


def test_gated_repo_needs_the_right_token(hub, hf_home, tmp_path: Path) -> None:
    hub.gate(REPO, "hf_right")
    with pytest.raises(TokenRequiredError, match="is gated: it needs a Hugging Face access token") as no_token:
        fetch(hub, tmp_path / "m.gguf")
    assert no_token.value.repo == REPO and not no_token.value.had_token
    with pytest.raises(TokenRequiredError, match="your Hugging Face token has no access") as wrong:
        fetch(hub, tmp_path / "m.gguf", token="hf_wrong")
    assert wrong.value.had_token
    assert not partial_paths(tmp_path / "m.gguf")[0].exists()
    fetch(hub, tmp_path / "m.gguf", token="hf_right")
    assert (tmp_path / "m.gguf").read_bytes() == model_bytes()
    resolves = hub.requests(prefix=f"/{REPO}/resolve/")
    assert resolves[-1].authorization == "Bearer hf_right" and resolves[-1].method == "GET"
    # the token goes to the hub, never to the CDN the hub redirects to
    assert all(g.authorization is None for g in hub.cdn_gets())


def test_pinned_sha256_that_differs_from_the_hub_is_refused(hub, hf_home, tmp_path: Path) -> None:
    with pytest.raises(VerificationError, match="not the file the catalog pins"):
        fetch(hub, tmp_path / "m.gguf", sha256="ab" * 32)
    assert hub.cdn_gets() == []


def test_git_stored_file_is_checked_by_its_git_etag_or_pinned_sha(hub, hf_home, tmp_path: Path) -> None:
    f = hub.add_file(REPO, "small.gguf", model_bytes()[:300_000], lfs=False)
    res = fetch(hub, tmp_path / "a.gguf", filename="small.gguf")
    assert res.verified_by == "hub git etag (sha1)" and res.remote.sha256 is None
    assert res.remote.git_sha1 == hashlib.sha1(b"blob %d\0" % len(f.data) + f.data).hexdigest()
    f.corrupt_at = 100  # a git-stored file served wrong: its ETag (git blob sha1) catches it
    with pytest.raises(VerificationError, match="corrupt: git sha1"):
        fetch(hub, tmp_path / "bad.gguf", filename="small.gguf")
    assert not (tmp_path / "bad.gguf").exists() and not partial_paths(tmp_path / "bad.gguf")[0].exists()
    f.corrupt_at = None
    res = fetch(hub, tmp_path / "b.gguf", filename="small.gguf", sha256=f.sha256)
    assert res.verified_by == "catalog sha256"
    f.corrupt_at = 10
    with pytest.raises(VerificationError, match="corrupt"):
        fetch(hub, tmp_path / "c.gguf", filename="small.gguf", sha256=f.sha256)
    assert not (tmp_path / "c.gguf").exists()


def test_full_disk_mid_transfer_keeps_a_clean_resumable_prefix(hub, hf_home, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    budget = {"left": 1_234_567}

    def write(fd: int, data) -> int:
        if budget["left"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(data), budget["left"])
        budget["left"] -= n
        return real_write(fd, bytes(data[:n]))

    monkeypatch.setattr(dl.os, "write", write)
    with pytest.raises(DiskFullError, match=r"disk full while downloading m\.gguf .* kept; free .* pull again") as info:
        fetch(hub, tmp_path / "m.gguf")
    assert info.value.resumable and info.value.bytes_done == 1_234_567
    part = partial_paths(tmp_path / "m.gguf")[0]
    assert part.read_bytes() == model_bytes()[:1_234_567]
    monkeypatch.setattr(dl.os, "write", real_write)
    res = fetch(hub, tmp_path / "m.gguf")
    assert res.resumed_from == 1_234_567 and (tmp_path / "m.gguf").read_bytes() == model_bytes()


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """Mount a tmpfs of the requested size (root only; skipped where mounting is not allowed)."""
    mounts: list[Path] = []

    def make(size_mib: int) -> Path:
        point = tmp_path / f"tmpfs{len(mounts)}"
        point.mkdir()
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("a tmpfs needs root")
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(point)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
        mounts.append(point)
        return point

    yield make
    for point in mounts:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_real_full_disk_on_a_small_tmpfs(hub, hf_home, small_tmpfs) -> None:
    tiny = small_tmpfs(8)  # less than file + margin: refused before the first byte
    with pytest.raises(DiskFullError, match=r"not enough disk space for m\.gguf: needs .* free in") as info:
        fetch(hub, tiny / "m.gguf")
    assert info.value.free is not None and info.value.needed > info.value.free
    assert hub.cdn_gets() == [] and not partial_paths(tiny / "m.gguf")[0].exists()

    disk = small_tmpfs(40)  # room at the start; a ballast file fills it halfway through
    ballast = disk / "ballast"

    def fill(p: Progress) -> None:
        if p.phase == "downloading" and p.done > 1_000_000 and not ballast.exists():
            fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                while os.write(fd, b"\0" * (1 << 20)):
                    pass
            except OSError:
                pass  # ENOSPC: the disk is full now
            finally:
                os.close(fd)

    with pytest.raises(DiskFullError, match="disk full while downloading") as full:
        fetch(hub, disk / "m.gguf", progress=fill)
    part = partial_paths(disk / "m.gguf")[0]
    have = part.stat().st_size
    assert full.value.resumable and have == full.value.bytes_done and part.read_bytes() == model_bytes()[:have]
    assert not (disk / "m.gguf").exists()
    ballast.unlink()
    res = fetch(hub, disk / "m.gguf")
    assert res.resumed_from == have and (disk / "m.gguf").read_bytes() == model_bytes()


def test_one_download_per_file_at_a_time(hub, hf_home, tmp_path: Path) -> None:
    lock = FileLock(partial_paths(tmp_path / "m.gguf")[2])
    assert lock.acquire(blocking=False)
    try:
        with pytest.raises(HubError, match="already being downloaded"):
            fetch(hub, tmp_path / "m.gguf")
        with pytest.raises(HubError, match="being downloaded right now"):
            discard_partial(tmp_path / "m.gguf")
    finally:
        lock.release()
    fetch(hub, tmp_path / "m.gguf")


def test_discard_partial(hub, hf_home, tmp_path: Path) -> None:
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled):
        fetch(hub, tmp_path / "m.gguf", cancel=cancel,
              progress=lambda p: cancel.set() if p.phase == "downloading" and p.done > 300_000 else None)
    assert discard_partial(tmp_path / "m.gguf") is True
    assert list_partials(tmp_path) == [] and discard_partial(tmp_path / "m.gguf") is False


def test_speed_and_eta() -> None:
    m = dl._Meter(window=5.0)
    for t in range(11):
        m.add(float(t), t * 1_000_000)  # 1 MB/s
    assert m.speed() == pytest.approx(1_000_000)
    assert len(m.samples) <= 7  # the window slides
    reports: list[Progress] = []
    d = dl.Downloader(REPO, FILE, Path("/nonexistent/m.gguf"), progress=reports.append)
    d._meter = m
    d._report("downloading", 4_000_000, 10_000_000, force=True)
    assert reports[-1].speed == pytest.approx(1_000_000) and reports[-1].eta == pytest.approx(6.0)
    assert reports[-1].fraction == pytest.approx(0.4)
