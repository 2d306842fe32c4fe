#!/usr/bin/env python3
"""Build and install llama-cpp-python 0.3.36 with dgchat's llama.cpp patch set.

    python engine/build.py                 # download, patch, build, install into this Python
    CMAKE_ARGS="-DGGML_CUDA=on" python engine/build.py     # GPU builds: CMAKE_ARGS passes through
    python engine/build.py --no-rpc        # without llama.cpp's RPC backend (or DGCHAT_ENGINE_RPC=0)
    python engine/build.py --full          # also libmtmd and llama-common (or DGCHAT_ENGINE_FULL=1)
    python engine/build.py --check         # download + apply the patches only (no compiler needed)
    python engine/build.py --sdist FILE    # use an already downloaded sdist (offline)
    python engine/build.py --slim-source OUT.tar.xz   # a few-MB patched source archive, see below

Steps: `pip download` the sdist (no binaries), check its sha256, unpack it into the cache, apply
engine/patches/*.patch with `patch -p1` inside vendor/llama.cpp, set the local version
0.3.36+dgchat.N (so `llama-cpp-python==0.3.36` pins still match), `pip wheel` it, cache the wheel
under a key made of the sdist hash, the patches, CMAKE_ARGS and the platform, and `pip install` it
into the running interpreter's environment. A second run with the same inputs reuses the cached
wheel. Standard library only: this runs before dgchat is installed.

The build adds -DGGML_RPC=ON to CMAKE_ARGS (unless CMAKE_ARGS sets GGML_RPC itself, or --no-rpc):
the wheel then also holds libggml-rpc, the backend behind `dgchat --rpc HOST:PORT` (layers on other
machines) and `dgchat rpc-server` (docs/SCALING.md). It is on by default because it costs about
14 s of the build (ggml-rpc.cpp + transport.cpp, measured from ninja's log on 2 cores) and
one 188 KB library, and lets the test suite check RPC wherever the engine is built.

It also adds -DLLAVA_BUILD=OFF -DDGCHAT_NO_COMMON=ON (unless CMAKE_ARGS sets them, or --full): dgchat
never loads llama-cpp-python's multimodal library or llama.cpp's llama-common, and together they are
103 of the build's 181 compile units (patch 0014). README's install command on a fresh venv with an
empty cache, 2 cores: 8 min 17 s with them, 3 min 30 s without (one session, side by side).

Vulkan (AMD, Intel and other GPUs; on Debian 12 with the packages README names):
CMAKE_ARGS="-DGGML_VULKAN=on" python engine/build.py (patch 0013 lets ggml-vulkan compile with
Vulkan headers older than 1.3.272).

--slim-source OUT writes, instead of a wheel, a small deterministic archive (.tar.xz, or .tar.gz by
its name) of the PATCHED sources for builds where the 77 MB sdist cannot travel (the offline GPU
check, tests/bench/gpu_check.sh): llama.cpp with only what CMake needs to configure and build
libllama, ggml (CPU and CUDA backends) and llama-diffusion-cli - no models, docs, tests, tools,
other backends, git history - plus llama-cpp-python's pure-Python `llama_cpp` package (load the
built library with LLAMA_CPP_LIB_PATH) and DGCHAT_SLIM.json (patch level, sdist and patch hashes,
CMake source folder). Cached like the wheels, under a key of the sdist, the patches and the rules.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The patch set version: llama_dgchat_patch_level() returns it (0001-dgchat-patch-level.patch).
PATCH_LEVEL = 7
LOCAL_VERSION = f"{VERSION}+dgchat.{PATCH_LEVEL}"
HERE = Path(__file__).resolve().parent
PATCH_DIR = HERE / "patches"
RPC_CMAKE_ARG = "-DGGML_RPC=ON"
RPC_ENV = "DGCHAT_ENGINE_RPC"
# What dgchat never loads: llama-cpp-python's multimodal library (libmtmd, LLAVA_BUILD) and
# llama.cpp's llama-common, which only libmtmd, the examples and the tools link (patch 0014).
LEAN_CMAKE_ARGS = ("-DLLAVA_BUILD=OFF", "-DDGCHAT_NO_COMMON=ON")
FULL_ENV = "DGCHAT_ENGINE_FULL"


class BuildError(Exception):
    """A failure with a one-line explanation for the user."""


def log(msg: str) -> None:
    print(f"[dgchat engine] {msg}", flush=True)


def default_cache_dir() -> Path:
    if env := os.environ.get("DGCHAT_CACHE_DIR"):
        return Path(env) / "engine"
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "dgchat" / "Cache"
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches" / "dgchat"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dgchat"
    return base / "engine"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def patch_files(patch_dir: Path = PATCH_DIR) -> list[Path]:
    files = sorted(patch_dir.glob("*.patch"))
    if not files:
        raise BuildError(f"no patches found in {patch_dir}")
    return files


def patch_set_hash(patches: list[Path]) -> str:
    h = hashlib.sha256()
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def build_key(patches: list[Path], cmake_args: str) -> str:
    """Identifies a wheel: same sdist, patches, CMake options, interpreter platform -> same wheel."""
    h = hashlib.sha256()
    for part in (SDIST_SHA256, patch_set_hash(patches), cmake_args, sysconfig.get_platform(),
                 platform.machine(), LOCAL_VERSION):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:20]


def run(cmd: list[str], *, cwd: Path | None = None, log_file: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if log_file is None:
        return subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True)
    with open(log_file, "w") as fh:
        return subprocess.run(cmd, cwd=cwd, env=env, text=True, stdout=fh, stderr=subprocess.STDOUT)


def tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def fetch_sdist(cache: Path, sdist: Path | None) -> Path:
    """The verified sdist: the given file, a cached copy, or a fresh `pip download`."""
    target = cache / "sdist" / SDIST_NAME
    if sdist is not None:
        if not sdist.is_file():
            raise BuildError(f"{sdist}: no such file")
        candidate = sdist
    elif target.is_file():
        candidate = target
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        log(f"downloading {PACKAGE}=={VERSION} source ...")
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            res = run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                       f"{PACKAGE}=={VERSION}", "-d", tmp])
            got = Path(tmp) / SDIST_NAME
            if res.returncode != 0 or not got.is_file():
                last = (res.stderr or res.stdout or "").strip().splitlines()[-1:] or ["no output"]
                raise BuildError(f"pip could not download {PACKAGE}=={VERSION}: {last[0]}")
            os.replace(got, target)
        candidate = target
    digest = sha256_file(candidate)
    if digest != SDIST_SHA256:
        if candidate == target:
            target.unlink()
        raise BuildError(f"{candidate.name}: sha256 {digest} does not match the expected {SDIST_SHA256}")
    return candidate


def unpack(sdist: Path, dest: Path) -> Path:
    """Extract into a fresh folder; returns the source root (llama_cpp_python-0.3.36)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        if sys.version_info >= (3, 12) or hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            for m in tar.getmembers():
                p = (dest / m.name).resolve()
                if not str(p).startswith(str(dest.resolve())) or m.issym() or m.islnk():
                    raise BuildError(f"{sdist.name}: unsafe path {m.name} in the archive")
            tar.extractall(dest)
    root = dest / f"llama_cpp_python-{VERSION}"
    if not (root / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        raise BuildError(f"{sdist.name}: unexpected layout (no vendor/llama.cpp)")
    return root


def apply_patches(root: Path, patches: list[Path]) -> None:
    llama = root / "vendor" / "llama.cpp"
    tool = shutil.which("patch")
    git = shutil.which("git")
    if tool is None and git is None:
        raise BuildError("neither `patch` nor `git` is installed; one of them is needed to apply the patches")
    for p in patches:
        if tool is not None:
            check = [tool, "-p1", "--forward", "--batch", "--dry-run", "-i", str(p)]
            apply = [tool, "-p1", "--forward", "--batch", "--quiet", "-i", str(p)]
        else:
            check = [git, "apply", "--check", "-p1", str(p)]
            apply = [git, "apply", "-p1", str(p)]
        res = run(check, cwd=llama)
        if res.returncode != 0:
            detail = (res.stdout + res.stderr).strip().splitlines()
            raise BuildError(f"patch {p.name} does not apply to llama.cpp in {PACKAGE} {VERSION}: "
                             f"{detail[-1] if detail else 'rejected'}")
        res = run(apply, cwd=llama)
        if res.returncode != 0:
            raise BuildError(f"patch {p.name} failed: {(res.stdout + res.stderr).strip()}")
    log(f"applied {len(patches)} patches")


def set_local_version(root: Path) -> None:
    init = root / "llama_cpp" / "__init__.py"
    text = init.read_text()
    new, n = re.subn(r'__version__\s*=\s*"[^"]*"', f'__version__ = "{LOCAL_VERSION}"', text)
    if n != 1:
        raise BuildError(f"{init}: could not find __version__ to set the local version")
    init.write_text(new)


def check_toolchain() -> None:
    compilers = ["cl"] if sys.platform == "win32" else ["c++", "g++", "clang++"]
    if not any(shutil.which(c) for c in compilers):
        raise BuildError("no C++ compiler found (install build-essential / Xcode command line tools / MSVC)")


def rpc_requested(cmake_args: str) -> bool:
    return re.search(r"-DGGML_RPC=(ON|1|TRUE|YES)\b", cmake_args, re.I) is not None


def effective_cmake_args(environ_args: str, rpc: bool, lean: bool = False) -> str:
    """CMAKE_ARGS as given, plus the RPC backend when asked for, plus (lean) LEAN_CMAKE_ARGS; an
    option CMAKE_ARGS sets itself is left as it is."""
    extra = ([RPC_CMAKE_ARG] if rpc else []) + (list(LEAN_CMAKE_ARGS) if lean else [])
    args = " ".join(environ_args.split())  # spacing must not change the wheel's cache key
    for arg in extra:
        name = arg.split("=", 1)[0]
        if re.search(re.escape(name) + "=", environ_args, re.I) is None:
            args = f"{args} {arg}".strip()
    return args


def build_wheel(root: Path, out_dir: Path, work: Path, cmake_args: str) -> Path:
    check_toolchain()
    log_file = work / "build.log"
    log(f"compiling {LOCAL_VERSION} (several minutes; log: {log_file}) ...")
    env = dict(os.environ)
    if cmake_args:
        env["CMAKE_ARGS"] = cmake_args
    else:
        env.pop("CMAKE_ARGS", None)
    if env.get("CMAKE_ARGS"):
        log(f"CMAKE_ARGS={env['CMAKE_ARGS']}")
    res = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--wheel-dir", str(work / "wheel"), str(root)],
              log_file=log_file, env=env)
    wheels = list((work / "wheel").glob("llama_cpp_python-*.whl"))
    if res.returncode != 0 or len(wheels) != 1:
        text = tail(log_file, 60)
        hint = ""
        if re.search(r"CMAKE_C(XX)?_COMPILER|No CMAKE_CXX_COMPILER|compiler.*not found", text, re.I):
            hint = " (no working C/C++ compiler)"
        elif "CUDA" in text and "not found" in text:
            hint = " (CUDA toolkit not found: check CMAKE_ARGS / nvcc on PATH)"
        sys.stderr.write(text + "\n")
        raise BuildError(f"building the wheel failed{hint}; see {log_file}")
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / wheels[0].name
    shutil.copy2(wheels[0], final.with_suffix(".tmp"))
    os.replace(final.with_suffix(".tmp"), final)
    shutil.copy2(log_file, out_dir / "build.log")
    return final


def cached_wheel(wheel_dir: Path) -> Path | None:
    found = sorted(wheel_dir.glob("llama_cpp_python-*.whl")) if wheel_dir.is_dir() else []
    return found[0] if found else None


def install(wheel: Path, rpc: bool = False) -> None:
    log(f"installing {wheel.name} into {sys.prefix}")
    for cmd in ([sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)],
                [sys.executable, "-m", "pip", "install", str(wheel)]):
        res = run(cmd)
        if res.returncode != 0:
            last = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise BuildError(f"pip install failed: {last[0]}")
    probe = ("import ctypes, llama_cpp; f = getattr(llama_cpp.llama_cpp._lib, 'llama_dgchat_patch_level', None); "
             "f and setattr(f, 'restype', ctypes.c_int32); print(f() if f else 0)")
    res = run([sys.executable, "-c", probe])
    level = res.stdout.strip()
    if res.returncode != 0 or level != str(PATCH_LEVEL):
        raise BuildError(f"installed, but llama_cpp reports patch level {level or '?'}: {res.stderr.strip()[-200:]}")
    if rpc:
        probe = ("import ctypes; from llama_cpp import _ggml; f = _ggml.libggml.ggml_backend_reg_by_name; "
                 "f.restype, f.argtypes = ctypes.c_void_p, [ctypes.c_char_p]; print(bool(f(b'RPC')))")
        res = run([sys.executable, "-c", probe])
        if res.returncode != 0 or res.stdout.strip() != "True":
            raise BuildError(f"installed, but llama.cpp has no RPC backend: {res.stderr.strip()[-200:]}")
    log(f"llama-cpp-python {LOCAL_VERSION} installed (patch level {PATCH_LEVEL}{', RPC backend' if rpc else ''})")


# -- slim patched source archive (--slim-source) ----------------------------------------------------
# For machines the 77 MB sdist cannot reach (tests/bench/gpu_check.sh carries this to an offline GPU
# machine). Paths are posix, relative to the sdist root. The CMake project is vendor/llama.cpp,
# configured with SLIM_CMAKE_ARGS (plus e.g. -DGGML_CUDA=ON): each folder dropped here is one that
# CMake only enters when an option those arguments leave OFF is ON.
SLIM_FORMAT = 1
SLIM_ROOT = f"llama_cpp_python-{VERSION}-dgchat{PATCH_LEVEL}-slim"
SLIM_MANIFEST = "DGCHAT_SLIM.json"
SLIM_CMAKE_DIR = "vendor/llama.cpp"
SLIM_MTIME = 1735689600  # 2025-01-01T00:00Z for every entry; not 0: ninja reads an mtime of 0 as "missing"
SLIM_SUFFIXES = (".tar.xz", ".tar.gz", ".tgz")
SLIM_CMAKE_ARGS = (
    "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_COMMON=ON", "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_MTMD=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
)
SLIM_TARGETS = ("llama", "llama-diffusion-cli")
_L = SLIM_CMAKE_DIR
SLIM_KEEP = (
    # llama-cpp-python: the ctypes package, and its own (tiny) build files for reference
    "llama_cpp", "CMakeLists.txt", "pyproject.toml", "LICENSE.md", "README.md",
    # llama.cpp: what configuring and building libllama, ggml and the examples reads
    f"{_L}/CMakeLists.txt", f"{_L}/LICENSE", f"{_L}/licenses", f"{_L}/cmake", f"{_L}/include",
    f"{_L}/src", f"{_L}/ggml", f"{_L}/common", f"{_L}/vendor",
    f"{_L}/pocs",  # entered with the examples
    f"{_L}/examples/CMakeLists.txt",  # and each folder it add_subdirectory()s: slim_files()
)
SLIM_DROP = (  # fnmatch patterns, matched against every kept file's and folder's path
    # ggml backends other than CPU and CUDA (entered only when GGML_<NAME>=ON)
    *(f"{_L}/ggml/src/ggml-{b}" for b in ("blas", "cann", "et", "hexagon", "hip", "metal", "musa", "opencl",
                                           "openvino", "rpc", "sycl", "virtgpu", "vulkan", "webgpu", "zdnn",
                                           "zendnn")),
    f"{_L}/vendor/miniaudio/miniaudio.h",  # 4 MB, included by tools/mtmd only
    f"{_L}/examples/sycl",  # GGML_SYCL only
    "*/__pycache__", "*.pyc", "*/.DS_Store",
)
# What is left out, for the manifest (the rest of the sdist: everything not in SLIM_KEEP).
SLIM_DROPPED_NOTE = (
    "llama.cpp: models/ (vocab GGUFs), docs/, media/, tests/, tools/ (server, cli, mtmd, web UI), app/, "
    "benches/, scripts/, ci/, gguf-py/ (the gguf wheel is used), grammars/, requirements/, conversion/, "
    "convert_*.py, examples not built by examples/CMakeLists.txt, ggml backends other than CPU and CUDA, "
    "vendor/miniaudio.h; llama-cpp-python: .git/, docs/, examples/, tests/, docker/, scripts/"
)


def _slim_examples(root: Path) -> list[str]:
    """The example folders examples/CMakeLists.txt enters (configure fails without them)."""
    text = (root / SLIM_CMAKE_DIR / "examples" / "CMakeLists.txt").read_text()
    return sorted(set(re.findall(r"add_subdirectory\(\s*([\w.-]+)\s*\)", text)))


def _slim_dropped(rel: str) -> bool:
    return any(fnmatch.fnmatchcase(rel, pat) for pat in SLIM_DROP)


def slim_files(root: Path) -> list[str]:
    """Sorted posix paths (relative to the sdist root) of the files the slim archive holds."""
    keep = list(SLIM_KEEP) + [f"{SLIM_CMAKE_DIR}/examples/{d}" for d in _slim_examples(root)]
    found: set[str] = set()
    for item in keep:
        if _slim_dropped(item):
            continue
        path = root / item
        if path.is_file():
            found.add(item)
        elif path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path):
                rel_dir = Path(dirpath).relative_to(root).as_posix()
                dirnames[:] = sorted(d for d in dirnames if not _slim_dropped(f"{rel_dir}/{d}"))
                found.update(r for f in filenames if not _slim_dropped(r := f"{rel_dir}/{f}"))
        else:
            raise BuildError(f"slim source: {item} is missing from {SDIST_NAME}")
    return sorted(found, key=lambda r: PurePosixPath(r).parts)


def slim_key(patches: list[Path], suffix: str) -> str:
    h = hashlib.sha256()
    for part in (SDIST_SHA256, patch_set_hash(patches), LOCAL_VERSION, str(SLIM_FORMAT), suffix,
                 repr(SLIM_KEEP), repr(SLIM_DROP), repr(SLIM_CMAKE_ARGS), str(SLIM_MTIME)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:20]


def slim_suffix(out: Path) -> str:
    for suffix in SLIM_SUFFIXES:
        if out.name.endswith(suffix):
            return suffix
    raise BuildError(f"--slim-source {out}: name the archive *.tar.xz (smallest) or *.tar.gz")


def slim_manifest(patches: list[Path], n_files: int, n_bytes: int) -> dict:
    return {
        "format": SLIM_FORMAT,
        "package": PACKAGE,
        "version": VERSION,
        "local_version": LOCAL_VERSION,
        "patch_level": PATCH_LEVEL,
        "sdist": SDIST_NAME,
        "sdist_sha256": SDIST_SHA256,
        "patches": [{"name": p.name, "sha256": sha256_file(p)} for p in patches],
        "patch_set_sha256": patch_set_hash(patches),
        "cmake_source_dir": SLIM_CMAKE_DIR,
        "cmake_args": list(SLIM_CMAKE_ARGS),
        "cmake_targets": list(SLIM_TARGETS),
        "python_package": "llama_cpp",
        "files": n_files,
        "bytes": n_bytes,
        "dropped": SLIM_DROPPED_NOTE,
    }


def write_slim_archive(root: Path, out: Path, patches: list[Path], suffix: str) -> dict:
    """Write the patched, unpacked sdist at `root` as a slim archive; returns its manifest.

    Deterministic: entries sorted, folders listed, mtime SLIM_MTIME, owner 0/0 without names,
    modes 0755/0644, no gzip timestamp (xz has none), so equal inputs give byte-equal archives."""
    import gzip
    import io
    import json
    import lzma

    files = slim_files(root)
    sizes = {rel: (root / rel).stat().st_size for rel in files}
    manifest = slim_manifest(patches, len(files) + 1, sum(sizes.values()))
    blob = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    dirs = {PurePosixPath(rel).parent.as_posix() for rel in files}
    dirs = {d for rel in dirs for d in [PurePosixPath(rel), *PurePosixPath(rel).parents] if str(d) != "."}
    entries = sorted([(str(d), None) for d in dirs] + [(rel, "file") for rel in files] + [(SLIM_MANIFEST, "manifest")],
                     key=lambda e: PurePosixPath(e[0]).parts)

    def info(name: str, kind: int, size: int = 0, mode: int = 0o644) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(f"{SLIM_ROOT}/{name}" if name else SLIM_ROOT)
        ti.type, ti.size, ti.mode, ti.mtime = kind, size, mode, SLIM_MTIME
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        return ti

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as raw:
        if suffix == ".tar.xz":
            comp = lzma.LZMAFile(raw, "wb", preset=9)
        else:
            comp = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0)
        with comp, tarfile.open(fileobj=comp, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(info("", tarfile.DIRTYPE, mode=0o755))
            for name, kind in entries:
                if kind is None:
                    tar.addfile(info(name, tarfile.DIRTYPE, mode=0o755))
                elif kind == "manifest":
                    tar.addfile(info(name, tarfile.REGTYPE, len(blob)), io.BytesIO(blob))
                else:
                    path = root / name
                    mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
                    with open(path, "rb") as fh:
                        tar.addfile(info(name, tarfile.REGTYPE, sizes[name], mode), fh)
    return manifest


def slim_source(cache: Path, sdist_arg: Path | None, patches: list[Path], dest: str, rebuild: bool) -> Path:
    """Write (or reuse from the cache) the slim archive and copy it to `dest`: a file name, or a
    folder (existing, or written with a trailing slash) that gets the default name."""
    out = Path(dest).expanduser()
    if dest.endswith(("/", os.sep)) or out.is_dir():
        out = out / f"{SLIM_ROOT}.tar.xz"
    suffix = slim_suffix(out)
    cached = cache / "slim" / slim_key(patches, suffix) / f"{SLIM_ROOT}{suffix}"
    if cached.is_file() and not rebuild:
        log(f"using cached slim source {cached}")
    else:
        sdist = fetch_sdist(cache, sdist_arg)
        work = Path(tempfile.mkdtemp(prefix="slim-", dir=cache))
        try:
            root = unpack(sdist, work / "src")
            apply_patches(root, patches)
            set_local_version(root)
            tmp = work / cached.name
            manifest = write_slim_archive(root, tmp, patches, suffix)
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(tmp), cached)
            log(f"slim source: {manifest['files']} files, {manifest['bytes'] / 1e6:.1f} MB unpacked")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if out.resolve() != cached.resolve():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        shutil.copyfile(cached, tmp)
        os.replace(tmp, out)
    log(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB, patch level {PATCH_LEVEL}, sha256 {sha256_file(out)[:16]})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: the user cache folder /dgchat/engine")
    ap.add_argument("--sdist", type=Path, default=None, help=f"use this {SDIST_NAME} instead of downloading it")
    ap.add_argument("--patches", type=Path, default=PATCH_DIR, help=argparse.SUPPRESS)
    ap.add_argument("--check", action="store_true", help="only verify that the patches apply")
    ap.add_argument("--no-install", action="store_true", help="build (or reuse) the wheel and print its path")
    ap.add_argument("--rebuild", action="store_true", help="ignore a cached wheel (or slim archive)")
    ap.add_argument("--rpc", action="store_true", help=f"build llama.cpp's RPC backend ({RPC_CMAKE_ARG}; the default)")
    ap.add_argument("--no-rpc", action="store_true", help=f"leave the RPC backend out (same as {RPC_ENV}=0)")
    ap.add_argument("--full", action="store_true",
                    help=f"also build libmtmd and llama-common, which dgchat does not use (same as {FULL_ENV}=1)")
    ap.add_argument("--slim-source", default=None, metavar="OUT",
                    help="write a small archive of the patched sources (OUT: *.tar.xz, *.tar.gz or a folder) "
                         "for offline builds, and nothing else")
    args = ap.parse_args(argv)
    try:
        cache = (args.cache_dir or default_cache_dir()).expanduser()
        cache.mkdir(parents=True, exist_ok=True)
        patches = patch_files(args.patches)
        if args.slim_source is not None:
            print(slim_source(cache, args.sdist, patches, args.slim_source, args.rebuild))
            return 0
        rpc_off = args.no_rpc or os.environ.get(RPC_ENV, "").strip().lower() in ("0", "off", "false", "no")
        rpc = args.rpc or not rpc_off
        full = args.full or os.environ.get(FULL_ENV, "").strip().lower() in ("1", "on", "true", "yes")
        cmake_args = effective_cmake_args(os.environ.get("CMAKE_ARGS", ""), rpc, lean=not full)
        key = build_key(patches, cmake_args)
        wheel_dir = cache / "wheels" / key
        wheel = None if (args.rebuild or args.check) else cached_wheel(wheel_dir)
        if wheel is not None:
            log(f"using cached wheel {wheel}")
        else:
            sdist = fetch_sdist(cache, args.sdist)
            work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
            try:
                root = unpack(sdist, work / "src")
                apply_patches(root, patches)
                set_local_version(root)
                if args.check:
                    log("the patch set applies cleanly")
                    return 0
                wheel = build_wheel(root, wheel_dir, work, cmake_args)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        if args.no_install:
            print(wheel)
        else:
            install(wheel, rpc=rpc_requested(cmake_args))
        return 0
    except BuildError as exc:
        print(f"dgchat engine build: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dgchat engine build: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
