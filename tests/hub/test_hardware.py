"""Hardware detection: real commands (fake nvidia-smi / sysctl scripts on PATH), overrides."""

from __future__ import annotations

import os
import platform
import shutil
import stat
from pathlib import Path

import pytest

from dgchat.hub import hardware as hwmod
from dgchat.hub.errors import HubError
from dgchat.hub.hardware import (
    Hardware,
    detect_hardware,
    load_hardware_overrides,
    parse_nvidia_smi,
    save_hardware_overrides,
)

MIB = 1024**2
GIB = 1024**3

NVIDIA_TWO = """name, memory.total [MiB], memory.free [MiB]
NVIDIA GeForce RTX 4090, 24564 MiB, 23008 MiB
NVIDIA RTX A4000, 16376 MiB, 16000 MiB
"""


def fake_command(folder: Path, name: str, output: str, code: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DGCHAT_HOME", str(tmp_path / "dgchat-home"))
    return tmp_path


def test_parse_nvidia_smi() -> None:
    gpus = parse_nvidia_smi(NVIDIA_TWO)
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA RTX A4000"]
    assert gpus[0].vram_total == 24564 * MIB and gpus[0].vram_free == 23008 * MIB and gpus[0].kind == "nvidia"
    # the exact query of the issue (no name column), and units-less values
    [g] = parse_nvidia_smi("memory.total [MiB], memory.free [MiB]\n81559 MiB, 80000 MiB\n")
    assert g.vram_total == 81559 * MIB and g.vram_free == 80000 * MIB and g.name == "NVIDIA GPU"
    [g] = parse_nvidia_smi("name, memory.total [MiB], memory.free [MiB]\nNVIDIA GH200, [N/A], [N/A]\n")
    assert g.vram_total is None and g.vram_free is None
    # captured on an H200 with the exact command detect_hardware runs
    [g] = parse_nvidia_smi("name, memory.total [MiB], memory.free [MiB]\nNVIDIA H200, 143771 MiB, 143156 MiB\n")
    assert (g.name, g.vram_total, g.vram_free) == ("NVIDIA H200", 143771 * MIB, 143156 * MIB)
    [g] = parse_nvidia_smi("Tesla T4, 15360, 15000\n")  # --format=csv,noheader,nounits
    assert g.vram_total == 15360 * MIB
    assert parse_nvidia_smi("") == []


def test_detect_with_nvidia_smi_on_path(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = home / "bin"
    fake_command(bin_dir, "nvidia-smi", NVIDIA_TWO)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    hw = detect_hardware(home / "models" / "not" / "yet", gpu_offload=True, platform_name="linux")
    assert hw.vram_total == (24564 + 16376) * MIB and hw.vram_free == (23008 + 16000) * MIB
    assert len(hw.gpus) == 2 and not hw.unified_memory and hw.gpu_offload
    assert hw.cpu_cores and hw.cpu_cores >= 1
    assert hw.ram_total and hw.ram_total > 256 * MIB
    assert hw.disk_free == shutil.disk_usage(home).free or abs(hw.disk_free - shutil.disk_usage(home).free) < 64 * MIB
    assert hw.notes == ()
    rows = dict(hw.summary())
    assert rows["GPU offload"] == "yes" and "40.0 GiB VRAM" in rows["GPU memory"] and "RTX 4090" in rows["GPU memory"]


def test_cpu_only_build_with_a_gpu_present(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_command(home / "bin", "nvidia-smi", NVIDIA_TWO)
    monkeypatch.setenv("PATH", f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}")
    hw = detect_hardware(home, gpu_offload=False, platform_name="linux")
    assert hw.vram_total is not None and not hw.gpu_offload
    note = next(n for n in hw.notes if "cannot offload" in n)
    # the note names the GPU and the exact command that builds an engine for it
    assert "RTX 4090" in note and note.endswith('to use it: CMAKE_ARGS="-DGGML_CUDA=on" python engine/build.py && '
                                                 'pip install .')


def test_amd_gpu_from_sysfs(home: Path) -> None:
    drm = home / "drm"
    card = drm / "card1" / "device"
    card.mkdir(parents=True)
    (card / "vendor").write_text("0x1002\n")
    (card / "mem_info_vram_total").write_text(f"{16 * 1024 * MIB}\n")
    (card / "mem_info_vram_used").write_text(f"{1024 * MIB}\n")
    (card / "product_name").write_text("Radeon RX 7800 XT\n")
    other = drm / "card0" / "device"  # an integrated Intel GPU: not counted
    other.mkdir(parents=True)
    (other / "vendor").write_text("0x8086\n")
    hw = detect_hardware(home, nvidia_smi="no-such-nvidia-smi", gpu_offload=False, platform_name="linux",
                         drm_root=drm)
    assert [(g.name, g.kind) for g in hw.gpus] == [("Radeon RX 7800 XT", "amd")]
    assert hw.vram_total == 16 * 1024 * MIB and hw.vram_free == 15 * 1024 * MIB
    assert any('CMAKE_ARGS="-DGGML_HIP=on"' in n for n in hw.notes)


def test_nvidia_smi_missing_or_failing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hw = detect_hardware(home, nvidia_smi="no-such-nvidia-smi", gpu_offload=False, platform_name="linux")
    assert hw.vram_total is None and hw.gpus == () and dict(hw.summary())["GPU memory"] == "unknown"
    fake_command(home / "bin", "nvidia-smi", "NVIDIA-SMI has failed\n", code=9)
    monkeypatch.setenv("PATH", f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}")
    hw = detect_hardware(home, gpu_offload=True, platform_name="linux")
    assert hw.vram_total is None
    assert any("did not answer" in n for n in hw.notes) and any("enter it by hand" in n for n in hw.notes)


def test_apple_silicon_unified_memory(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_command(home / "bin", "sysctl", f"{64 * GIB}\n")
    monkeypatch.setenv("PATH", f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(hwmod.platform, "machine", lambda: "arm64")
    hw = detect_hardware(home, gpu_offload=True, platform_name="darwin")
    assert hw.ram_total == 64 * GIB and hw.unified_memory and hw.vram_total == 64 * GIB
    assert hw.gpus[0].kind == "apple" and "unified memory" in dict(hw.summary())["GPU memory"]


def test_gpu_offload_comes_from_the_llama_cpp_build(home: Path) -> None:
    from dgchat.model_backend.llamacpp import engine_info

    hw = detect_hardware(home, apply_saved=False)
    assert hw.gpu_offload == engine_info().gpu_offload


def test_meminfo_parsing() -> None:
    total, avail = hwmod._meminfo("MemTotal:       16318264 kB\nMemFree: 1 kB\nMemAvailable:    8000000 kB\n")
    assert total == 16318264 * 1024 and avail == 8000000 * 1024


def test_overrides(home: Path) -> None:
    hw = detect_hardware(home, nvidia_smi="no-such-nvidia-smi", gpu_offload=False, platform_name="linux")
    edited = hw.with_overrides(ram_total="16G", gpu_offload=True, vram_total=8 * GIB)
    assert edited.ram_total == 16 * GIB and edited.ram_available is None
    assert edited.vram_total == 8 * GIB and edited.vram_free is None and edited.gpu_offload
    assert edited.overridden == {"ram_total", "gpu_offload", "vram_total"}
    assert "ram_total: set by the user" in edited.notes
    with pytest.raises(HubError, match="unknown setting 'ram'"):
        hw.with_overrides(ram=1)
    with pytest.raises(HubError, match="ram_total must be a non-negative integer"):
        hw.with_overrides(ram_total=-5)
    with pytest.raises(HubError, match="gpu_offload must be true or false"):
        hw.with_overrides(gpu_offload="yes")
    with pytest.raises(HubError, match="not a size"):
        hw.with_overrides(ram_total="lots")

    path = save_hardware_overrides({"ram_total": 12 * GIB, "vram_total": 6 * GIB, "gpu_offload": True})
    assert path.is_relative_to(home)
    assert load_hardware_overrides() == {"ram_total": 12 * GIB, "vram_total": 6 * GIB, "gpu_offload": True}
    again = detect_hardware(home, nvidia_smi="no-such-nvidia-smi", gpu_offload=False, platform_name="linux")
    assert again.ram_total == 12 * GIB and again.vram_total == 6 * GIB and again.gpu_offload
    raw = detect_hardware(home, nvidia_smi="no-such-nvidia-smi", gpu_offload=False, platform_name="linux",
                          apply_saved=False)
    assert raw.ram_total == hw.ram_total
    path.write_text("ram_total = -1\n")
    with pytest.raises(HubError, match=f"{path}: ram_total must be"):
        load_hardware_overrides()
    path.write_text("ram_total = [\n")
    with pytest.raises(HubError, match="not valid TOML"):
        load_hardware_overrides()


def test_as_dict_round_trips_json(home: Path) -> None:
    import json

    hw = Hardware(cpu_cores=8, ram_total=32 * GIB, ram_available=None, disk_free=None, models_dir=home,
                  gpu_offload=True, vram_total=24 * GIB, vram_free=20 * GIB)
    d = json.loads(json.dumps(hw.as_dict()))
    assert d["vram_free"] == 20 * GIB and d["models_dir"] == str(home)
    assert platform.system()  # detection helpers import cleanly on this platform
