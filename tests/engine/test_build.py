"""engine/build.py: the pieces that run without a compiler or the network.

The full build (download, patch, compile ~5 min, install) is exercised by hand:
`python engine/build.py` in a throwaway venv (see docs/diffusion-gemma-gguf.md). Applying the patch
set to the real sdist runs here when a verified sdist is available locally (build.py's cache, or
DGCHAT_TEST_SDIST), and is skipped with that reason otherwise.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from fixtures.engine_build import ROOT, build, local_sdist as _local_sdist

def test_version_and_patch_level_agree() -> None:
    assert build.LOCAL_VERSION == f"0.3.36+dgchat.{build.PATCH_LEVEL}"
    text = (ROOT / "engine" / "patches" / "0001-dgchat-patch-level.patch").read_text()
    assert f"+#define LLAMA_DGCHAT_PATCH_LEVEL {build.PATCH_LEVEL}\n" in text
    # the local version still satisfies dgchat's `llama-cpp-python==0.3.36` pin (PEP 440)
    from packaging.specifiers import SpecifierSet

    assert build.LOCAL_VERSION in SpecifierSet("==0.3.36")


def test_cache_key_tracks_patches_and_cmake_args(tmp_path: Path) -> None:
    patches = build.patch_files()
    assert [p.name[:4] for p in patches] == [f"{i:04d}" for i in range(1, 18)]
    k = build.build_key(patches, "")
    assert k == build.build_key(patches, "")
    assert k != build.build_key(patches, "-DGGML_CUDA=on")
    changed = tmp_path / "p"
    changed.mkdir()
    for p in patches:
        (changed / p.name).write_bytes(p.read_bytes())
    (changed / patches[-1].name).write_bytes(patches[-1].read_bytes() + b"\n")
    assert build.build_key(build.patch_files(changed), "") != k


def test_the_default_build_leaves_out_what_dgchat_never_loads() -> None:
    """libmtmd (LLAVA_BUILD) and llama-common (patch 0014) are left out unless CMAKE_ARGS names them
    or --full is given; an option the user sets is never overridden."""
    assert build.effective_cmake_args("", True, lean=True) == "-DGGML_RPC=ON -DLLAVA_BUILD=OFF -DDGCHAT_NO_COMMON=ON"
    assert build.effective_cmake_args("-DGGML_VULKAN=on", False, lean=True) == (
        "-DGGML_VULKAN=on -DLLAVA_BUILD=OFF -DDGCHAT_NO_COMMON=ON")
    assert build.effective_cmake_args("-DLLAVA_BUILD=ON", False, lean=True) == "-DLLAVA_BUILD=ON -DDGCHAT_NO_COMMON=ON"
    assert build.effective_cmake_args("", False) == ""
    patch = (ROOT / "engine" / "patches" / "0014-no-common-library.patch").read_text()
    assert "option(DGCHAT_NO_COMMON" in patch and "set(LLAMA_BUILD_COMMON OFF)" in patch


def test_bad_sdist_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = tmp_path / build.SDIST_NAME
    with tarfile.open(fake, "w:gz"):
        pass
    rc = build.main(["--check", "--sdist", str(fake), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "sha256" in err[0]


def test_patches_apply_to_the_pinned_sdist(tmp_path: Path) -> None:
    sdist = _local_sdist()
    if sdist is None:
        pytest.skip("no local llama_cpp_python-0.3.36.tar.gz (run engine/build.py once, or set DGCHAT_TEST_SDIST)")
    assert build.main(["--check", "--sdist", str(sdist), "--cache-dir", str(tmp_path)]) == 0
