"""Fixtures every test folder may use: tiny GGUF models built once per test session, the session's
base folder of memoised checkpoints, the local hub with an isolated huggingface_hub home, a real
`dgchat serve` on loopback; and, for every test, an isolated home and the reference machine profile.

Fixtures only one folder uses live in that folder's conftest.py (tests/app/conftest.py). Builders
that tests call with arguments stay modules under tests/fixtures/, imported as `fixtures.<module>`:
this file puts tests/ on sys.path for that (tests/README.md describes the layout)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fixtures.gguf_models import TinySpec, write_tiny_gguf  # noqa: E402
from fixtures.hub_fixtures import FILE, REPO, model_bytes  # noqa: E402
from fixtures.hub_server import HubServer  # noqa: E402

if TYPE_CHECKING:  # the engine loads llama.cpp: imported where a test asks for it
    from dgchat.model_backend.engine import DiffusionEngine
    from dgchat.server.app import ServerThread


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


@pytest.fixture(scope="session")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's base temp folder: fixtures.convert_cache and fixtures.dg_cache memoise the
    checkpoints and conversions they build there, so each is built once however many modules use it."""
    return tmp_path_factory.getbasetemp()


# -- the local hub (tests/fixtures/hub_server.py) and an isolated huggingface_hub home -----------

@pytest.fixture
def hub() -> Iterator[HubServer]:
    """A local hub on 127.0.0.1 serving the fixture model as REPO/FILE (fixtures.hub_fixtures), per test."""
    server = HubServer().start()
    server.add_file(REPO, FILE, model_bytes())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """huggingface_hub's folders and token under tmp, offline by default (as dgchat runs)."""
    from huggingface_hub import constants

    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home


# -- a real `dgchat serve` on loopback over the tiny llada, one per test module ------------------
# (the remote tests and the app's remote tests; a module that needs another engine or server
# defines its own fixture of that name, which pytest prefers)

@pytest.fixture(scope="module")
def engine(llada_gguf: Path) -> Iterator[DiffusionEngine]:
    from dgchat.model_backend.loader import load_engine

    with load_engine(llada_gguf, n_threads=1) as e:
        yield e


@pytest.fixture(scope="module")
def server(engine: DiffusionEngine) -> Iterator[ServerThread]:
    from dgchat.server.app import ServeConfig, ServerThread

    with ServerThread(engine, ServeConfig(port=0, quiet=True)) as st:
        yield st


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never read or write the real user's config, data or model cache."""
    home = tmp_path_factory.mktemp("home")
    # Mesa keeps its compiled shaders under XDG_CACHE_HOME: an empty one makes every `dgchat`
    # subprocess on a Vulkan device recompile all of ggml-vulkan's pipelines (lavapipe, 2 cores: over
    # 300 s for a 16-token generation that takes 4 s with the cache). Shaders are not user data.
    monkeypatch.setenv("MESA_SHADER_CACHE_DIR", os.environ.get("MESA_SHADER_CACHE_DIR")
                       or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("DGCHAT_MODEL", raising=False)
    os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(autouse=True)
def _counted_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose seed nobody chose draws one (param_resolution.draw_seed); in tests the draws are
    0, 1, 2, ... per test, so snapshots and answers repeat and consecutive runs still differ."""
    import itertools

    from dgchat.model_backend import param_resolution

    counter = itertools.count()
    monkeypatch.setattr(param_resolution, "draw_seed", lambda: next(counter))


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
