"""The offline GPU check's pieces that run without a GPU: engine/build.py --slim-source (the patched
source archive the device machine builds from) and the scripts tests/bench/gpu_check*.sh.

- the selection and archive rules, on a small fake sdist (always runs);
- the real archive from the pinned sdist (when a verified sdist is available locally: build.py's
  cache or DGCHAT_TEST_SDIST): small, deterministic, patched, nothing of what it should drop, and
  a CPU-only CMake configure of it succeeds (needs cmake and a C++ compiler; a few seconds);
- a CUDA configure of it where nvcc and cuBLAS are found (extra CMake hints, e.g. for cuBLAS from
  a pip wheel, in DGCHAT_TEST_CUDA_CMAKE_ARGS);
- DGCHAT_TEST_SLIM_BUILD=1: a real CPU build of libllama + llama-diffusion-cli from the archive
  (~7 min on 2 cores) and llama_cpp loading it through LLAMA_CPP_LIB_PATH with the right patch level.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fixtures.engine_build import ROOT, build, local_sdist as _local_sdist

SCRIPTS = [ROOT / "tests" / "bench" / name for name in ("gpu_check.sh", "gpu_check_prepare.sh", "vulkan_check.sh")]
MAX_ARCHIVE_MB = 6  # 1.9 MB at patch level 3; the device tool carries 64 MiB in all, wheels included


SDIST = _local_sdist()  # looked up at import: the tests themselves run with a temporary XDG_CACHE_HOME
needs_sdist = pytest.mark.skipif(SDIST is None, reason="no local llama_cpp_python-0.3.36.tar.gz "
                                 "(run engine/build.py once, or set DGCHAT_TEST_SDIST)")


# -- scripts -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script: Path) -> None:
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_check_script_writes_at_most_eight_result_files() -> None:
    """The device tool brings back 8 files from $OUT: the script must not write more names."""
    text = (ROOT / "tests" / "bench" / "gpu_check.sh").read_text()
    import re

    names = set(re.findall(r'\$OUT/([\w.-]+)', text))
    assert names and len(names) <= 8, names


# -- the rules, on a fake sdist -----------------------------------------------------------------------

def _fake_sdist(root: Path) -> Path:
    files = {
        "CMakeLists.txt": "project(llama_cpp)\n", "pyproject.toml": "", "LICENSE.md": "", "README.md": "",
        "llama_cpp/__init__.py": '__version__ = "x"\n', "llama_cpp/server/app.py": "",
        "llama_cpp/__pycache__/x.cpython-312.pyc": "", "docs/index.md": "", "tests/test_x.py": "",
        ".git/HEAD": "", "vendor/llama.cpp/CMakeLists.txt": "", "vendor/llama.cpp/LICENSE": "",
        "vendor/llama.cpp/licenses/a": "", "vendor/llama.cpp/cmake/common.cmake": "",
        "vendor/llama.cpp/include/llama.h": "", "vendor/llama.cpp/src/llama.cpp": "",
        "vendor/llama.cpp/common/common.cpp": "", "vendor/llama.cpp/pocs/CMakeLists.txt": "",
        "vendor/llama.cpp/vendor/miniaudio/miniaudio.h": "x" * 1000,
        "vendor/llama.cpp/vendor/miniaudio/CMakeLists.txt": "",
        "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c": "", "vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu": "",
        "vendor/llama.cpp/ggml/src/ggml-vulkan/x.cpp": "", "vendor/llama.cpp/ggml/src/ggml-metal/x.metal": "",
        "vendor/llama.cpp/ggml/include/ggml-vulkan.h": "",
        "vendor/llama.cpp/examples/CMakeLists.txt": "add_subdirectory(diffusion)\nadd_subdirectory( simple )\n"
                                                    "if (GGML_SYCL)\n  add_subdirectory(sycl)\nendif()\n",
        "vendor/llama.cpp/examples/diffusion/diffusion-cli.cpp": "", "vendor/llama.cpp/examples/simple/s.cpp": "",
        "vendor/llama.cpp/examples/sycl/x.cpp": "", "vendor/llama.cpp/examples/llama.swiftui/x.swift": "",
        "vendor/llama.cpp/models/ggml-vocab-llama.gguf": "x" * 1000, "vendor/llama.cpp/tools/server/s.cpp": "",
        "vendor/llama.cpp/gguf-py/gguf/__init__.py": "", "vendor/llama.cpp/docs/build.md": "",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "vendor/llama.cpp/src/llama.cpp").chmod(0o775)
    return root


def test_slim_selection_keeps_what_cmake_reads_and_drops_the_rest(tmp_path: Path) -> None:
    files = build.slim_files(_fake_sdist(tmp_path))
    assert files == sorted(files, key=lambda r: r.split("/"))
    kept = set(files)
    for rel in ("llama_cpp/__init__.py", "llama_cpp/server/app.py", "vendor/llama.cpp/src/llama.cpp",
                "vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu", "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c",
                "vendor/llama.cpp/ggml/include/ggml-vulkan.h", "vendor/llama.cpp/vendor/miniaudio/CMakeLists.txt",
                "vendor/llama.cpp/examples/CMakeLists.txt", "vendor/llama.cpp/examples/diffusion/diffusion-cli.cpp",
                "vendor/llama.cpp/examples/simple/s.cpp", "vendor/llama.cpp/pocs/CMakeLists.txt"):
        assert rel in kept, rel
    for prefix in ("docs/", "tests/", ".git/", "llama_cpp/__pycache__", "vendor/llama.cpp/models/",
                   "vendor/llama.cpp/tools/", "vendor/llama.cpp/gguf-py/", "vendor/llama.cpp/docs/",
                   "vendor/llama.cpp/ggml/src/ggml-vulkan/", "vendor/llama.cpp/ggml/src/ggml-metal/",
                   "vendor/llama.cpp/examples/sycl/", "vendor/llama.cpp/examples/llama.swiftui/",
                   "vendor/llama.cpp/vendor/miniaudio/miniaudio.h"):
        assert not any(f.startswith(prefix) for f in kept), prefix


def test_slim_archive_is_deterministic(tmp_path: Path) -> None:
    root = _fake_sdist(tmp_path / "src")
    patches = build.patch_files()
    a, b, c = tmp_path / "a.tar.xz", tmp_path / "b.tar.xz", tmp_path / "c.tar.gz"
    manifest = build.write_slim_archive(root, a, patches, ".tar.xz")
    (root / "llama_cpp/__init__.py").touch()  # a new mtime changes nothing
    build.write_slim_archive(root, b, patches, ".tar.xz")
    assert a.read_bytes() == b.read_bytes()
    build.write_slim_archive(root, c, patches, ".tar.gz")
    assert c.read_bytes()[:2] == b"\x1f\x8b" and c.read_bytes()[4:8] == b"\0\0\0\0"  # gzip, no timestamp
    with tarfile.open(a) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names[0] == build.SLIM_ROOT and all(n.startswith(build.SLIM_ROOT + "/") for n in names[1:])
        assert {m.mtime for m in members} == {build.SLIM_MTIME}
        assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "", "")}
        modes = {m.name.split("/", 1)[-1]: m.mode for m in members}
        assert modes["vendor/llama.cpp/src/llama.cpp"] == 0o755 and modes["llama_cpp/__init__.py"] == 0o644
        got = json.load(tar.extractfile(f"{build.SLIM_ROOT}/{build.SLIM_MANIFEST}"))
    assert got == manifest
    assert got["patch_level"] == build.PATCH_LEVEL and got["cmake_source_dir"] == "vendor/llama.cpp"
    assert [p["name"] for p in got["patches"]] == [p.name for p in patches]


def test_slim_output_names(tmp_path: Path) -> None:
    assert build.slim_suffix(Path("x.tar.xz")) == ".tar.xz" and build.slim_suffix(Path("x.tgz")) == ".tgz"
    with pytest.raises(build.BuildError, match="tar.xz"):
        build.slim_suffix(Path("x.zip"))
    patches = build.patch_files()
    assert build.slim_key(patches, ".tar.xz") != build.slim_key(patches, ".tar.gz")


# -- the real archive -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if SDIST is None:
        pytest.skip("no local sdist")
    tmp = tmp_path_factory.mktemp("slim")
    assert build.main(["--slim-source", str(tmp / "out") + "/", "--sdist", str(SDIST),
                       "--cache-dir", str(tmp / "cache")]) == 0
    (archive,) = (tmp / "out").glob("*.tar.xz")
    return archive


@pytest.fixture(scope="module")
def slim_tree(slim: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("slim-tree")
    with tarfile.open(slim) as tar:
        tar.extractall(dest, filter="data")
    return dest / build.SLIM_ROOT


@needs_sdist
def test_slim_archive_is_small_patched_and_reproducible(slim: Path, tmp_path: Path) -> None:
    size_mb = slim.stat().st_size / 1e6
    assert size_mb < MAX_ARCHIVE_MB, size_mb
    with tarfile.open(slim) as tar:
        names = tar.getnames()
        llama_h = tar.extractfile(f"{build.SLIM_ROOT}/vendor/llama.cpp/include/llama.h").read().decode()
        model_cpp = tar.extractfile(f"{build.SLIM_ROOT}/vendor/llama.cpp/src/llama-model.cpp").read().decode()
        init = tar.extractfile(f"{build.SLIM_ROOT}/llama_cpp/__init__.py").read().decode()
        manifest = json.load(tar.extractfile(f"{build.SLIM_ROOT}/{build.SLIM_MANIFEST}"))
    rel = {n.split("/", 1)[1] for n in names if "/" in n}
    # every patch applied: 0001's patch level function, 0006's new source file
    assert "llama_dgchat_patch_level" in llama_h
    assert f"#define LLAMA_DGCHAT_PATCH_LEVEL {build.PATCH_LEVEL}\n" in model_cpp
    assert "vendor/llama.cpp/src/llama-dgchat.cpp" in rel
    assert f'__version__ = "{build.LOCAL_VERSION}"' in init
    assert manifest["patch_level"] == build.PATCH_LEVEL and manifest["sdist_sha256"] == build.SDIST_SHA256
    for needed in ("vendor/llama.cpp/CMakeLists.txt", "vendor/llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt",
                   "vendor/llama.cpp/ggml/src/ggml-cpu/CMakeLists.txt", "vendor/llama.cpp/examples/diffusion/CMakeLists.txt",
                   "llama_cpp/llama_cpp.py", "llama_cpp/_ctypes_extensions.py"):
        assert needed in rel, needed
    for gone in ("vendor/llama.cpp/models/", "vendor/llama.cpp/docs/", "vendor/llama.cpp/tests/",
                 "vendor/llama.cpp/tools/", "vendor/llama.cpp/media/", "vendor/llama.cpp/gguf-py/",
                 "vendor/llama.cpp/ggml/src/ggml-vulkan/", "vendor/llama.cpp/ggml/src/ggml-sycl/",
                 "vendor/llama.cpp/ggml/src/ggml-metal/", ".git/", "docs/", "tests/"):
        assert not any(r.startswith(gone) for r in rel), gone
    # the cached copy is reused, and a rebuild gives the same bytes
    again = tmp_path / "again.tar.xz"
    cache = slim.parent.parent / "cache"
    assert build.main(["--slim-source", str(again), "--sdist", str(SDIST), "--cache-dir", str(cache),
                       "--rebuild"]) == 0
    assert again.read_bytes() == slim.read_bytes()


def _cmake_configure(src: Path, build_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    manifest = json.loads((src / build.SLIM_MANIFEST).read_text())
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cmd = ["cmake", "-S", str(src / manifest["cmake_source_dir"]), "-B", str(build_dir), *gen,
           "-DCMAKE_BUILD_TYPE=Release", *manifest["cmake_args"], *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None or not any(shutil.which(c) for c in ("c++", "g++", "clang++")),
                                 reason="needs cmake and a C++ compiler")


@needs_sdist
@needs_cmake
def test_slim_source_configures_for_the_cpu(slim_tree: Path, tmp_path: Path) -> None:
    res = _cmake_configure(slim_tree, tmp_path / "build", "-DGGML_CUDA=OFF", "-DGGML_NATIVE=OFF")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Including CPU backend" in res.stdout


@needs_sdist
@needs_cmake
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_slim_source_configures_for_cuda(slim_tree: Path, tmp_path: Path) -> None:
    extra = shlex.split(os.environ.get("DGCHAT_TEST_CUDA_CMAKE_ARGS", ""))
    res = _cmake_configure(slim_tree, tmp_path / "build", "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
                           "-DGGML_CUDA_NCCL=OFF", "-DGGML_NATIVE=OFF", *extra)
    out = res.stdout + res.stderr
    if res.returncode != 0 and not extra and ("CUDA::cublas" in out or "CUDA::cuda_driver" in out):
        pytest.skip("nvcc without cuBLAS / libcuda here (set DGCHAT_TEST_CUDA_CMAKE_ARGS to point at them)")
    assert res.returncode == 0, out[-4000:]
    assert "Including CUDA backend" in res.stdout


@pytest.mark.slow
@needs_sdist
@needs_cmake
@pytest.mark.skipif(os.environ.get("DGCHAT_TEST_SLIM_BUILD") != "1", reason="set DGCHAT_TEST_SLIM_BUILD=1 (~7 min)")
def test_slim_source_builds_and_loads_on_the_cpu(slim_tree: Path, tmp_path: Path) -> None:
    bdir = tmp_path / "build"
    res = _cmake_configure(slim_tree, bdir, "-DGGML_CUDA=OFF")
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((slim_tree / build.SLIM_MANIFEST).read_text())
    res = subprocess.run(["cmake", "--build", str(bdir), "--target", *manifest["cmake_targets"], "-j", str(os.cpu_count() or 2)],
                         capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    assert (bdir / "bin" / "llama-diffusion-cli").is_file()
    probe = ("import ctypes, llama_cpp; f = llama_cpp.llama_cpp._lib.llama_dgchat_patch_level; "
             "f.restype = ctypes.c_int32; print(llama_cpp.__version__, f())")
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(bdir / "bin"), PYTHONPATH=str(slim_tree))
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [build.LOCAL_VERSION, str(build.PATCH_LEVEL)]


def test_device_pytest_reports_an_unnamed_crash_as_a_failure(tmp_path: Path) -> None:
    """tests/bench/device_pytest.py: a SIGSEGV that is not lavapipe's named crash (no Vulkan device
    here) fails the run after the tests before it ran; finished tests are read from pytest -vv, and
    a failure's traceback is printed when it happens (the crash takes pytest's end summary with it)."""
    (tmp_path / "test_crash.py").write_text(
        "import os, signal\n"
        "def test_first():\n    pass\n"
        "def test_fails():\n    assert 1 + 1 == 3, 'shown before the crash'\n"
        "def test_dies():\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
        "def test_after():\n    pass\n")
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "bench" / "device_pytest.py"), "test_crash.py"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "DGCHAT_TEST_GPU_LAYERS": "0"})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "test_first PASSED" in res.stdout
    assert "not the named lavapipe crash" in res.stdout and "test_after PASSED" not in res.stdout
    assert "test_crash.py::test_fails failed (call)" in res.stdout and "shown before the crash" in res.stdout
