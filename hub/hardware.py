"""What this machine offers a model: CPU cores, RAM, free disk in the models folder, whether this
llama.cpp build can offload to a GPU, and VRAM where it can be read.

Detection never fails: what cannot be read is None (with a note saying why), and the user can
correct any value (`Hardware.with_overrides`, persisted by `save_hardware_overrides`). Sources:
- cores: the CPUs this process may run on (sched_getaffinity), else os.cpu_count();
- RAM: /proc/meminfo (capped by a cgroup memory limit), `sysctl -n hw.memsize` on macOS,
  Win32_ComputerSystem via PowerShell on Windows, else sysconf;
- GPU offload: `llama_supports_gpu_offload()` through dgchat.model_backend.llamacpp.engine_info();
- VRAM: `nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv` (summed over GPUs);
  AMD on Linux: /sys/class/drm/card*/device (vendor 0x1002, mem_info_vram_total / _used);
  Apple silicon: unified memory, VRAM = hw.memsize (Metal may use about 3/4 of it, see fit.py).

A GPU this engine build cannot offload to (README's default build is CPU-only) gets a note with the
command that builds the engine for it (`rebuild_command`).
"""

from __future__ import annotations

import csv
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dgchat.hub import paths
from dgchat.hub.errors import HubError
from dgchat.hub.util import format_bytes, llamacpp_module, parse_size
from dgchat.paths import atomic_write_text
from dgchat.toml_files import TomlFileError, read_toml
from dgchat.toml_write import toml_table

EDITABLE = ("cpu_cores", "ram_total", "disk_free", "gpu_offload", "vram_total", "vram_free", "unified_memory")
_INT_FIELDS = ("cpu_cores", "ram_total", "disk_free", "vram_total", "vram_free")
_BOOL_FIELDS = ("gpu_offload", "unified_memory")


@dataclass(frozen=True)
class GpuInfo:
    name: str
    vram_total: int | None  # bytes
    vram_free: int | None  # bytes
    kind: str  # "nvidia" | "amd" | "apple"


@dataclass(frozen=True)
class Hardware:
    """Sizes in bytes; None where unknown. `overridden` names the fields the user corrected."""

    cpu_cores: int | None
    ram_total: int | None
    ram_available: int | None
    disk_free: int | None
    models_dir: Path
    gpu_offload: bool  # this llama.cpp build can offload layers to a GPU
    vram_total: int | None = None  # summed over `gpus`; Apple silicon: the unified memory
    vram_free: int | None = None
    unified_memory: bool = False  # Apple silicon: the GPU shares RAM
    gpus: tuple[GpuInfo, ...] = ()
    notes: tuple[str, ...] = ()  # why a value is missing, what was overridden
    overridden: frozenset[str] = frozenset()

    def with_overrides(self, **values: Any) -> Hardware:
        """A copy with the user's corrections (keys from EDITABLE; None clears a value).

        Overriding vram_total without vram_free forgets the detected free VRAM (it described
        another GPU); overriding ram_total forgets ram_available likewise."""
        changes = _check_overrides(values, where="hardware override")
        if not changes:
            return self
        if "vram_total" in changes and "vram_free" not in changes:
            changes["vram_free"] = None
        extra: dict[str, Any] = {}
        if "ram_total" in changes:
            extra["ram_available"] = None
        notes = tuple(n for n in self.notes if not any(n.startswith(f"{k}:") for k in changes))
        notes += tuple(f"{k}: set by the user" for k in values if k in changes)
        return replace(self, **changes, **extra, notes=notes, overridden=self.overridden | set(values))

    def summary(self) -> list[tuple[str, str]]:
        """(label, value) rows to show plainly, in the order a person reads them."""
        gpu = "yes" if self.gpu_offload else "no (CPU only)"
        if self.vram_total is not None:
            kind = "unified memory" if self.unified_memory else "VRAM"
            free = f", {format_bytes(self.vram_free)} free" if self.vram_free is not None else ""
            vram = f"{format_bytes(self.vram_total)} {kind}{free}"
        else:
            vram = "unknown"
        names = ", ".join(g.name for g in self.gpus)
        return [
            ("CPU cores", str(self.cpu_cores) if self.cpu_cores is not None else "unknown"),
            ("RAM", format_bytes(self.ram_total) if self.ram_total is not None else "unknown"),
            ("Free disk", f"{format_bytes(self.disk_free)} in {self.models_dir}" if self.disk_free is not None
             else f"unknown ({self.models_dir})"),
            ("GPU offload", gpu),
            ("GPU memory", vram + (f" ({names})" if names else "")),
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "cpu_cores": self.cpu_cores, "ram_total": self.ram_total, "ram_available": self.ram_available,
            "disk_free": self.disk_free, "models_dir": str(self.models_dir), "gpu_offload": self.gpu_offload,
            "vram_total": self.vram_total, "vram_free": self.vram_free, "unified_memory": self.unified_memory,
            "gpus": [{"name": g.name, "vram_total": g.vram_total, "vram_free": g.vram_free, "kind": g.kind}
                     for g in self.gpus],
            "notes": list(self.notes), "overridden": sorted(self.overridden),
        }


def _check_overrides(values: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in EDITABLE:
            raise HubError(f"{where}: unknown setting {key!r} (known: {', '.join(EDITABLE)})")
        if value is None:
            out[key] = None
        elif key in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise HubError(f"{where}: {key} must be true or false (got {value!r})")
            out[key] = value
        else:
            if isinstance(value, str):
                value = int(value) if key == "cpu_cores" and value.strip().isdigit() else parse_size(value)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise HubError(f"{where}: {key} must be a non-negative integer (got {value!r})")
            out[key] = value
    return out


# -- detection --------------------------------------------------------------------------------------


def _run(cmd: list[str], timeout: float) -> str | None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def _cpu_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _meminfo(text: str) -> tuple[int | None, int | None]:
    values: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+):\s+(\d+)\s*kB", line)
        if m:
            values[m.group(1)] = int(m.group(2)) * 1024
    return values.get("MemTotal"), values.get("MemAvailable")


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):  # "max" or a huge number: no limit
            return int(text)
    return None


def _ram(platform_name: str, timeout: float, notes: list[str]) -> tuple[int | None, int | None]:
    if platform_name.startswith("linux"):
        try:
            total, available = _meminfo(Path("/proc/meminfo").read_text())
        except OSError:
            total, available = None, None
        limit = _cgroup_limit()
        if total is not None and limit is not None and limit < total:
            notes.append(f"ram_total: limited by this container's cgroup to {format_bytes(limit)}")
            total = limit
            available = min(available, limit) if available is not None else None
        if total is not None:
            return total, available
    elif platform_name == "darwin":
        out = _run(["sysctl", "-n", "hw.memsize"], timeout)
        if out and out.strip().isdigit():
            return int(out.strip()), None
    elif platform_name == "win32":
        out = _run(["powershell", "-NoProfile", "-Command",
                    "(Get-CimInstance Win32_ComputerSystem).TotalPhysicalMemory;"
                    "(Get-CimInstance Win32_OperatingSystem).FreePhysicalMemory"], timeout)
        if out:
            parts = [p.strip() for p in out.split() if p.strip().isdigit()]
            if parts:
                return int(parts[0]), (int(parts[1]) * 1024 if len(parts) > 1 else None)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), None
    except (AttributeError, ValueError, OSError):
        notes.append("ram_total: could not be read; enter it by hand")
        return None, None


def _mib(text: str, header: str) -> int | None:
    text = text.strip()
    m = re.match(r"^([0-9]+(?:\.[0-9]+)?)\s*(MiB|GiB|KiB|B)?$", text)
    if not m:
        return None  # "[N/A]" (unified-memory boards), "[Not Supported]"
    unit = m.group(2) or ("MiB" if "mib" in header.lower() else "B")
    return int(float(m.group(1)) * {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}[unit])


def parse_nvidia_smi(output: str) -> list[GpuInfo]:
    """Parse `nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv` (header line included)."""
    rows = [r for r in csv.reader(output.strip().splitlines(), skipinitialspace=True) if r]
    if not rows:
        return []
    header = [h.strip().lower() for h in rows[0]]
    if not any(h.startswith("memory.total") for h in header):
        header, body = ["name", "memory.total [mib]", "memory.free [mib]"], rows  # noheader output
    else:
        body = rows[1:]
    col = {h.split(" ")[0]: i for i, h in enumerate(header)}
    gpus = []
    for row in body:
        def cell(key: str) -> str | None:
            i = col.get(key)
            return row[i] if i is not None and i < len(row) else None

        total = cell("memory.total")
        free = cell("memory.free")
        gpus.append(GpuInfo(
            name=(cell("name") or "NVIDIA GPU").strip(),
            vram_total=_mib(total, header[col["memory.total"]]) if total is not None else None,
            vram_free=_mib(free, header[col["memory.free"]]) if free is not None and "memory.free" in col else None,
            kind="nvidia",
        ))
    return gpus


def _amd(drm_root: Path) -> list[GpuInfo]:
    """AMD GPUs from the amdgpu driver's sysfs files (Linux): one per card with its own VRAM."""
    gpus = []
    for card in sorted(drm_root.glob("card[0-9]*")):
        dev = card / "device"
        try:
            if dev.joinpath("vendor").read_text().strip().lower() != "0x1002":
                continue
            total = int(dev.joinpath("mem_info_vram_total").read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            free: int | None = total - int(dev.joinpath("mem_info_vram_used").read_text().strip())
        except (OSError, ValueError):
            free = None
        try:
            name = dev.joinpath("product_name").read_text().strip() or "AMD GPU"
        except OSError:
            name = "AMD GPU"
        gpus.append(GpuInfo(name=name, vram_total=total, vram_free=free, kind="amd"))
    return gpus


# CMake switches that build llama.cpp's backend for each kind of GPU (llama.cpp's docs/build.md)
_GPU_BUILD_FLAGS = {"nvidia": "-DGGML_CUDA=on", "amd": "-DGGML_HIP=on", "apple": "-DGGML_METAL=on"}


def rebuild_command(kind: str) -> str:
    """The command, run in dgchat's source folder, that builds an engine able to offload to a GPU
    of `kind` (README's install builds for the CPU only)."""
    return f'CMAKE_ARGS="{_GPU_BUILD_FLAGS.get(kind, "-DGGML_VULKAN=on")}" python engine/build.py && pip install .'


def _nvidia(nvidia_smi: str, timeout: float, notes: list[str]) -> list[GpuInfo]:
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return []
    out = _run([exe, "--query-gpu=name,memory.total,memory.free", "--format=csv"], timeout)
    if out is None:
        notes.append("vram_total: nvidia-smi is installed but did not answer (driver not loaded?)")
        return []
    gpus = parse_nvidia_smi(out)
    if gpus and all(g.vram_total is None for g in gpus):
        notes.append("vram_total: nvidia-smi reports no memory size (unified-memory board?); enter it by hand")
    return gpus


def detect_hardware(models_dir: Path | None = None, *, apply_saved: bool = True, nvidia_smi: str = "nvidia-smi",
                    timeout: float = 5.0, gpu_offload: bool | None = None,
                    platform_name: str | None = None, drm_root: Path = Path("/sys/class/drm")) -> Hardware:
    """Read this machine's resources (no network; a few local commands with `timeout`).

    models_dir: where models go (free disk is measured there or at its nearest existing parent).
    apply_saved: apply the corrections saved with `save_hardware_overrides`.
    gpu_offload: skip asking llama.cpp (tests, or a caller that already knows)."""
    plat = platform_name or sys.platform
    models = Path(models_dir) if models_dir is not None else paths.models_dir()
    notes: list[str] = []
    ram_total, ram_available = _ram(plat, timeout, notes)
    try:
        disk_free: int | None = shutil.disk_usage(paths.existing_parent(models)).free
    except OSError as exc:
        disk_free = None
        notes.append(f"disk_free: could not be read ({exc.strerror or exc})")
    asked = True
    if gpu_offload is None:
        try:
            gpu_offload = llamacpp_module().engine_info().gpu_offload
        except Exception as exc:  # a broken engine must not stop the wizard from showing the machine
            gpu_offload, asked = False, False
            notes.append(f"gpu_offload: llama.cpp could not be asked ({str(exc).splitlines()[0][:120]}); "
                         "set it by hand if this build offloads")
    gpus: list[GpuInfo] = []
    unified = False
    if plat == "darwin" and platform.machine() == "arm64" and ram_total is not None:
        unified = True
        gpus.append(GpuInfo(name="Apple silicon GPU", vram_total=ram_total, vram_free=None, kind="apple"))
    else:
        gpus.extend(_nvidia(nvidia_smi, timeout, notes))
        if plat.startswith("linux"):
            gpus.extend(_amd(drm_root))
    totals = [g.vram_total for g in gpus if g.vram_total is not None]
    frees = [g.vram_free for g in gpus if g.vram_free is not None]
    vram_total = sum(totals) if totals else None
    vram_free = sum(frees) if frees and len(frees) == len(gpus) else None
    if gpus and not gpu_offload and asked:
        notes.append(f"gpu_offload: {gpus[0].name} is present but this engine build cannot offload to it "
                     f"(a CPU-only build), so models run on the CPU; to use it: {rebuild_command(gpus[0].kind)}")
    if not gpus and gpu_offload:
        notes.append("vram_total: this build can offload, but no GPU memory size could be read; enter it by hand")
    hw = Hardware(
        cpu_cores=_cpu_cores(), ram_total=ram_total, ram_available=ram_available, disk_free=disk_free,
        models_dir=models, gpu_offload=bool(gpu_offload), vram_total=vram_total, vram_free=vram_free,
        unified_memory=unified, gpus=tuple(gpus), notes=tuple(notes),
    )
    if apply_saved:
        saved = load_hardware_overrides()
        if saved:
            hw = hw.with_overrides(**saved)
    return hw


# -- saved corrections ------------------------------------------------------------------------------


def load_hardware_overrides(path: Path | None = None) -> dict[str, Any]:
    """The saved corrections ({} when none). Raises HubError naming the file on a bad value."""
    path = Path(path) if path is not None else paths.hardware_overrides_path()
    if not path.exists():
        return {}
    try:  # a regular file of bounded size and nesting (dgchat.toml_files)
        raw = read_toml(path)
    except TomlFileError as exc:
        raise HubError(f"{path}: {exc}") from None
    return _check_overrides(raw, where=str(path))


def save_hardware_overrides(values: dict[str, Any], path: Path | None = None) -> Path:
    """Persist corrections (EDITABLE keys; None or a missing key = use detection). Returns the file."""
    path = Path(path) if path is not None else paths.hardware_overrides_path()
    checked = {k: v for k, v in _check_overrides(values, where="hardware override").items() if v is not None}
    header = "# dgchat: corrections to the detected hardware (sizes in bytes); delete a line to detect it again\n"
    atomic_write_text(path, header + toml_table(checked.items()))
    return path


def clear_hardware_overrides(path: Path | None = None) -> None:
    path = Path(path) if path is not None else paths.hardware_overrides_path()
    path.unlink(missing_ok=True)


__all__ = [
    "EDITABLE", "GpuInfo", "Hardware", "clear_hardware_overrides", "detect_hardware", "load_hardware_overrides",
    "parse_nvidia_smi", "rebuild_command", "save_hardware_overrides",
]
