"""Shared fixtures: tiny GGUF models built once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fixtures.gguf_models import TinySpec, write_tiny_gguf  # noqa: E402


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def _build(model_dir: Path, name: str, spec: TinySpec) -> Path:
    path = model_dir / f"{name}.gguf"
    if not path.exists():
        write_tiny_gguf(path, spec)
    return path


@pytest.fixture(scope="session")
def llada_gguf(model_dir: Path) -> Path:
    return _build(model_dir, "tiny-llada", TinySpec(arch="llada"))


@pytest.fixture(scope="session")
def dream_gguf(model_dir: Path) -> Path:
    return _build(model_dir, "tiny-dream", TinySpec(arch="dream"))


@pytest.fixture(scope="session")
def llama_nc_gguf(model_dir: Path) -> Path:
    """A masked-diffusion model on the `llama` architecture (attention.causal = false): has a KV cache."""
    return _build(model_dir, "tiny-llama-noncausal", TinySpec(arch="llama"))


@pytest.fixture(scope="session")
def causal_gguf(model_dir: Path) -> Path:
    return _build(model_dir, "tiny-llama-causal", TinySpec(arch="llama", diffusion=False))


@pytest.fixture(scope="session")
def unknown_arch_gguf(model_dir: Path) -> Path:
    return _build(model_dir, "tiny-unknown-arch", TinySpec(arch="foo"))


@pytest.fixture(scope="session")
def small_ctx_gguf(model_dir: Path) -> Path:
    return _build(model_dir, "tiny-small-context", TinySpec(arch="llada", n_ctx=64))


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never read or write the real user's config, data or model cache."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("DGCHAT_MODEL", raising=False)
    os.environ.setdefault("OMP_NUM_THREADS", "2")


REFERENCE_PROFILE = Path(__file__).parent / "fixtures" / "machine_profile.json"


@pytest.fixture(scope="session")
def _engine_build_key() -> str:
    from dgchat.model_backend.llamacpp import engine_build_key

    return engine_build_key()


@pytest.fixture(autouse=True)
def _reference_machine_profile(_isolated_home: None, _engine_build_key: str) -> None:
    """Every test sees the same machine profile (measured once on the project's 2-core machine,
    tests/fixtures/machine_profile.json), saved as this engine build's: speed predictions and the
    recommendations built on them are the same on every machine, and no test measures by accident.
    Tests of the measurement itself delete it or point elsewhere."""
    import json

    from dgchat.hub.machine_profile import default_threads, profile_path

    data = json.loads(REFERENCE_PROFILE.read_text())
    data.update(build_key=_engine_build_key, threads=default_threads())
    path = profile_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
