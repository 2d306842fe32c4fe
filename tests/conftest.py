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



@pytest.fixture(autouse=True)
def _reference_machine_profile(_isolated_home: None, monkeypatch: pytest.MonkeyPatch,
                               request: pytest.FixtureRequest) -> None:
    """Every test sees the same machine profile (tests/fixtures/speed_profile.py); a test that sets
    its own DGCHAT_HOME installs it there again. Measuring for real takes seconds: in this process
    it fails loudly unless the test is marked `measures` (or replaces `measure` itself)."""
    from fixtures.speed_profile import install_reference_profile

    from dgchat.hub import machine_profile

    install_reference_profile()
    if request.node.get_closest_marker("measures") is None:
        def refuse(*_args, **_kwargs):
            raise AssertionError("this test measured the machine: install_reference_profile() after setting "
                                 "DGCHAT_HOME, or mark it @pytest.mark.measures")

        monkeypatch.setattr(machine_profile, "measure", refuse)
