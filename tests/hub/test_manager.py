"""The model manager end to end: the shipped catalog's real repo/file names served by the local hub."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest

from dgchat.hub import download as dl
from dgchat.hub.errors import (
    DownloadCancelled,
    DownloadError,
    NotFoundOnHubError,
    RegistryError,
    TokenRequiredError,
    VerificationError,
)
from dgchat.hub.hardware import Hardware
from dgchat.hub.manager import ModelManager
from dgchat.hub.offline import hub_network
from dgchat.model_backend.errors import ModelFileError, UnsupportedModelError
from fixtures.hub_fixtures import model_bytes, model_file

LLADA = ("mradermacher/LLaDA-8B-Instruct-GGUF", "LLaDA-8B-Instruct.Q4_K_M.gguf")
DREAM = ("bartowski/Dream-org_Dream-v0-Instruct-7B-GGUF", "Dream-org_Dream-v0-Instruct-7B-Q4_K_M.gguf")
DG = ("unsloth/diffusiongemma-26B-A4B-it-GGUF", "diffusiongemma-26B-A4B-it-Q4_K_M.gguf")
GIB = 1024**3

HW = Hardware(cpu_cores=4, ram_total=16 * GIB, ram_available=None, disk_free=100 * GIB, models_dir=Path("/m"),
              gpu_offload=False)


@pytest.fixture
def mgr(hub, hf_home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelManager:
    monkeypatch.setenv("DGCHAT_HOME", str(tmp_path / "dgchat-home"))
    hub.add_file(*LLADA, model_bytes())
    return ModelManager(endpoint=hub.endpoint, hf_cache_dir=hf_home / "hub")


def row(m: ModelManager, name: str):
    return next(r for r in m.listing(HW) if r.name == name)


def test_pull_installs_verifies_and_registers(mgr: ModelManager, hub, tmp_path: Path) -> None:
    assert row(mgr, "llada-8b-instruct-q4_k_m").status == "available"
    res = mgr.pull("llada-8b-instruct-q4_k_m", retry_delay=0)
    assert res.action == "downloaded" and res.path == mgr.models_dir / LLADA[1]
    assert res.path.read_bytes() == model_bytes()
    m = res.model
    assert m.sha256 == hashlib.sha256(model_bytes()).hexdigest() and m.owned and m.source == "download"
    assert m.catalog == m.name == "llada-8b-instruct-q4_k_m" and m.repo == LLADA[0] and m.commit == hub.repos[LLADA[0]]
    assert m.architecture == "llada" and m.verified_by == "hub LFS etag" and m.arch["n_layer"] == 32
    # the registry is a plain JSON file under the data dir
    saved = json.loads((tmp_path / "dgchat-home" / "data" / "models.json").read_text())
    assert saved["models"][0]["path"] == str(res.path)
    r = row(mgr, "llada-8b-instruct-q4_k_m")
    assert r.status == "installed" and r.path == res.path and r.size == len(model_bytes()) and r.fit is not None
    assert mgr.model_path("llada-8b-instruct-q4_k_m") == res.path
    n = len(hub.log)
    again = mgr.pull("llada-8b-instruct-q4_k_m")
    assert again.action == "already installed" and len(hub.log) == n  # no network for an installed model
    assert not (mgr.models_dir / ".partial").exists() or list((mgr.models_dir / ".partial").iterdir()) == []


@pytest.mark.parametrize("fault", ["404", "401", "dropped"])
def test_failed_pull_never_lists_a_half_model(mgr: ModelManager, hub, fault: str) -> None:
    name = "dream-v0-instruct-7b-q4_k_m"
    if fault == "404":
        expected, match = NotFoundOnHubError, "no file 'Dream-org_Dream-v0-Instruct-7B-Q4_K_M.gguf'"
        hub.add_file(DREAM[0], "other.gguf", b"x" * 10)
    elif fault == "401":
        hub.add_file(*DREAM, model_bytes())
        hub.gate(DREAM[0], "hf_secret")
        expected, match = TokenRequiredError, "is gated"
    else:
        f = hub.add_file(*DREAM, model_bytes())
        f.cuts = [2_000_000]
        f.drop_next = 0
        expected, match = DownloadError, "failed at .* pull again to resume"
    with pytest.raises(expected, match=match):
        mgr.pull(name, retries=0, retry_delay=0)
    assert mgr.installed() == []
    r = row(mgr, name)
    assert r.installed is None and r.path is None
    assert r.status == ("partial" if fault == "dropped" else "available")
    assert not (mgr.models_dir / DREAM[1]).exists()
    with pytest.raises(RegistryError, match="is not installed"):
        mgr.model_path(name)
    if fault == "dropped":
        assert 0 < r.partial.done < r.partial.total
        res = mgr.pull(name, retry_delay=0)
        assert res.download.resumed_from == r.partial.done and res.path.read_bytes() == model_bytes()


def test_pull_without_network_says_so_and_leaves_nothing(mgr: ModelManager, hub) -> None:
    """The hub unreachable: NoNetworkError, no half model, and .partial holds no lock."""
    import socket

    from dgchat.hub.errors import NoNetworkError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    offline = ModelManager(endpoint=closed, hf_cache_dir=mgr.hf_cache_dir)
    with pytest.raises(NoNetworkError, match="^no network connection: 127.0.0.1 refused the connection"):
        offline.pull("llada-8b-instruct-q4_k_m", retries=0, retry_delay=0)
    assert offline.installed() == [] and row(offline, "llada-8b-instruct-q4_k_m").status == "available"
    partial = offline.models_dir / ".partial"
    assert not partial.exists() or list(partial.iterdir()) == []
    assert hub.log == []


def test_rm_deletes_only_owned_files(mgr: ModelManager, tmp_path: Path) -> None:
    res = mgr.pull("llada-8b-instruct-q4_k_m", retry_delay=0)
    out = mgr.remove("llada-8b-instruct-q4_k_m")
    assert out.deleted == (res.path,) and not res.path.exists() and mgr.installed() == []

    original = tmp_path / "mine" / "My Model.gguf"
    original.parent.mkdir()
    original.write_bytes(model_bytes())
    imported = mgr.import_model(original)
    assert imported.name == "my-model" and not imported.owned and imported.path == original
    out = mgr.remove("my-model")
    assert out.deleted == () and out.kept == (original,) and original.read_bytes() == model_bytes()
    with pytest.raises(RegistryError, match="no installed model named 'my-model'"):
        mgr.remove("my-model")
    with pytest.raises(RegistryError, match="ships with dgchat and cannot be removed"):
        mgr.remove("dgchat-tiny-plays")


def test_rm_drops_a_partial_download(mgr: ModelManager, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dl, "PROGRESS_INTERVAL", 0.0)
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled):
        mgr.pull("llada-8b-instruct-q4_k_m", cancel=cancel,
                 progress=lambda p: cancel.set() if p.phase == "downloading" and p.done > 100_000 else None)
    assert row(mgr, "llada-8b-instruct-q4_k_m").status == "partial"
    out = mgr.remove("llada-8b-instruct-q4_k_m")
    assert out.partial_removed and row(mgr, "llada-8b-instruct-q4_k_m").status == "available"


def test_import_validates_the_file(mgr: ModelManager, tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all, just text" * 10)
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        mgr.import_model(junk)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(model_bytes()[:100_000])
    with pytest.raises(ModelFileError):
        mgr.import_model(truncated)
    with pytest.raises(UnsupportedModelError, match="causal"):
        mgr.import_model(model_file("causal"))
    with pytest.raises(RegistryError, match="is a catalog model's name"):
        mgr.import_model(model_file(), name="llada-8b-instruct-q4_k_m")
    with pytest.raises(RegistryError, match="not a valid model name"):
        mgr.import_model(model_file(), name="Bad Name")
    m = mgr.import_model(model_file(), name="tiny")
    assert m.architecture == "llada" and m.sha256 == hashlib.sha256(model_bytes()).hexdigest()
    assert m.arch["n_layer"] == 4 and m.context_length == 2048
    with pytest.raises(RegistryError, match="already installed as 'tiny'"):
        mgr.import_model(model_file(), name="tiny2")
    with pytest.raises(RegistryError, match="a model named 'tiny' is already installed"):
        mgr.import_model(model_file(), name="tiny")
    r = row(mgr, "tiny")
    assert r.status == "installed" and r.entry is None and r.fit is not None


def test_verify(mgr: ModelManager) -> None:
    res = mgr.pull("llada-8b-instruct-q4_k_m", retry_delay=0)
    v = mgr.verify("llada-8b-instruct-q4_k_m")
    assert v.sha256 == res.model.sha256 and v.size == len(model_bytes())
    data = bytearray(res.path.read_bytes())
    data[len(data) // 2] ^= 0x01
    res.path.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match="has changed or is corrupt .* install it again"):
        mgr.verify("llada-8b-instruct-q4_k_m")
    assert res.path.exists()  # verify reports; the user decides
    res.path.unlink()
    with pytest.raises(ModelFileError, match="is gone"):
        mgr.verify("llada-8b-instruct-q4_k_m")
    assert row(mgr, "llada-8b-instruct-q4_k_m").status == "missing"
    # pulling again replaces the entry whose file is gone
    assert mgr.pull("llada-8b-instruct-q4_k_m", retry_delay=0).action == "downloaded"


def _download_into_hf_cache(hub, hf_home: Path, repo: str, filename: str) -> Path:
    from huggingface_hub import hf_hub_download

    with hub_network():
        return Path(hf_hub_download(repo, filename, endpoint=hub.endpoint, cache_dir=str(hf_home / "hub")))


def test_models_in_the_hf_cache_are_used_without_a_download(mgr: ModelManager, hub, hf_home: Path) -> None:
    cached = _download_into_hf_cache(hub, hf_home, *LLADA)
    hub.add_file("someone/other-GGUF", "other.Q8_0.gguf", model_bytes())
    other = _download_into_hf_cache(hub, hf_home, "someone/other-GGUF", "other.Q8_0.gguf")
    hub.add_file("someone/causal-GGUF", "causal.gguf", model_file("causal").read_bytes())
    _download_into_hf_cache(hub, hf_home, "someone/causal-GGUF", "causal.gguf")
    n = len(hub.log)
    rows = {r.name: r for r in mgr.listing(HW)}
    assert rows["llada-8b-instruct-q4_k_m"].status == "in HF cache"
    assert rows["someone/other-GGUF/other.Q8_0.gguf"].status == "in HF cache"
    assert rows["someone/other-GGUF/other.Q8_0.gguf"].path == other
    assert "someone/causal-GGUF/causal.gguf" not in rows  # not a model dgchat runs
    res = mgr.pull("llada-8b-instruct-q4_k_m")
    assert res.action == "from HF cache" and res.path == cached and len(hub.log) == n
    assert res.model.source == "hf-cache" and not res.model.owned and res.model.verified_by == "HF cache blob sha256"
    assert row(mgr, "llada-8b-instruct-q4_k_m").status == "installed"
    out = mgr.remove("llada-8b-instruct-q4_k_m")
    assert out.deleted == () and cached.exists()  # never deletes the HF cache's file
    assert len(hub.log) == n


def test_corrupt_hf_cache_copy_is_not_used(mgr: ModelManager, hub, hf_home: Path) -> None:
    cached = _download_into_hf_cache(hub, hf_home, *LLADA)
    blob = cached.resolve()
    data = bytearray(blob.read_bytes())
    data[1000] ^= 0xFF
    blob.write_bytes(bytes(data))
    res = mgr.pull("llada-8b-instruct-q4_k_m", retry_delay=0)
    assert res.action == "downloaded" and res.path.read_bytes() == model_bytes()
    assert any("is corrupt" in n and "downloading instead" in n for n in res.notes)


def test_listing_and_recommendation(mgr: ModelManager) -> None:
    rows = mgr.listing(HW)
    names = [r.name for r in rows]
    assert names[:len(mgr.catalog)] == [e.name for e in mgr.catalog]
    assert sum(r.recommended for r in rows) == 1
    rec = mgr.recommend(HW)
    assert next(r for r in rows if r.recommended).name == rec.entry.name
    for r in rows:
        assert r.fit is not None and r.fit.badge in ("fits in VRAM", "fits in RAM", "will not fit")
        json.dumps(r.as_dict())
    assert all(r.fit is None for r in mgr.listing(None))


def test_corrupt_registry_gives_a_clear_error(mgr: ModelManager) -> None:
    mgr.registry.path.parent.mkdir(parents=True, exist_ok=True)
    mgr.registry.path.write_text("{ not json")
    with pytest.raises(RegistryError, match="models.json: not valid JSON"):
        mgr.listing(HW)


@pytest.fixture(scope="module")
def unsloth_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="the synthetic unsloth-layout file is built from a tiny checkpoint")
    from fixtures import dg_cache
    from fixtures.dg_unsloth import write_unsloth_layout

    base = tmp_path_factory.getbasetemp()
    out = base / "hub-unsloth-layout.gguf"
    if not out.exists():
        write_unsloth_layout(dg_cache.checkpoint(base, "sw8"), out)
    return out


def test_pull_converts_the_upstream_diffusion_gemma_layout(mgr: ModelManager, hub, unsloth_file: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dl, "PROGRESS_INTERVAL", 0.0)
    src = unsloth_file.read_bytes()
    hub.add_file(*DG, src)
    name = "diffusiongemma-26b-a4b-q4_k_m"
    cancel = threading.Event()
    phases: list[str] = []

    def stop_while_converting(p) -> None:
        phases.append(p.phase)
        if p.phase == "converting" and p.done:
            cancel.set()

    with pytest.raises(DownloadCancelled, match="conversion of .* cancelled; the download is kept"):
        mgr.pull(name, cancel=cancel, progress=stop_while_converting, retry_delay=0)
    assert "downloading" in phases and "verifying" in phases
    assert mgr.installed() == [] and row(mgr, name).status == "available"
    assert not (mgr.models_dir / f"{Path(DG[1]).stem}.dgchat.gguf").exists()
    n = len(hub.log)
    res = mgr.pull(name, retry_delay=0)  # converts the kept download: no network
    assert len(hub.log) == n and res.path.name == "diffusiongemma-26B-A4B-it-Q4_K_M.dgchat.gguf"
    assert any("reused" in note for note in res.notes)
    m = res.model
    assert m.architecture == "gemma4" and m.owned
    assert m.converted_from["sha256"] == hashlib.sha256(src).hexdigest() and m.converted_from["repo"] == DG[0]
    assert m.sha256 == hashlib.sha256(res.path.read_bytes()).hexdigest()
    assert not (mgr.models_dir / DG[1]).exists()  # the upstream-layout file is gone once converted
    assert row(mgr, name).status == "installed"
    mgr.verify(name)


def test_upstream_layout_in_the_hf_cache_is_converted_without_a_download(mgr: ModelManager, hub, hf_home: Path,
                                                                        unsloth_file: Path) -> None:
    hub.add_file(*DG, unsloth_file.read_bytes())
    cached = _download_into_hf_cache(hub, hf_home, *DG)
    n = len(hub.log)
    r = row(mgr, "diffusiongemma-26b-a4b-q4_k_m")
    assert r.status == "in HF cache" and r.needs_convert and r.path is None  # not runnable before conversion
    res = mgr.pull("diffusiongemma-26b-a4b-q4_k_m")
    assert res.action == "from HF cache" and len(hub.log) == n
    assert res.model.owned and res.model.converted_from["path"] == str(cached) and res.path.parent == mgr.models_dir
    mgr.remove("diffusiongemma-26b-a4b-q4_k_m")
    assert not res.path.exists() and cached.exists()  # the converted copy was ours, the cache is not
