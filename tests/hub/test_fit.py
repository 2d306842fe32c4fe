"""The stated fit estimate, its badges, and the recommendation."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgchat.hub.catalog import ArchInfo, load_catalog
from dgchat.hub.fit import (
    OVERHEAD_BASE,
    Fit,
    arch_from_header,
    estimate,
    estimate_entry,
    recommend,
    usable_ram,
    usable_vram,
)
from dgchat.hub.hardware import Hardware

GIB = 1024**3
MIB = 1024**2


def machine(ram_gib: float | None = 32, vram_gib: float | None = None, offload: bool = True,
            free_vram_gib: float | None = None, unified: bool = False, disk_gib: float | None = 500) -> Hardware:
    return Hardware(
        cpu_cores=8, ram_total=int(ram_gib * GIB) if ram_gib is not None else None, ram_available=None,
        disk_free=int(disk_gib * GIB) if disk_gib is not None else None, models_dir=Path("/models"),
        gpu_offload=offload, vram_total=int(vram_gib * GIB) if vram_gib is not None else None,
        vram_free=int(free_vram_gib * GIB) if free_vram_gib is not None else None, unified_memory=unified,
    )


def test_formula_by_hand() -> None:
    arch = ArchInfo(n_layer=32, n_head_kv=8, head_dim=128)
    est = estimate(4 * GIB, arch, 4096, machine(vram_gib=24))
    kv = 2 * 2 * 32 * 8 * 128 * 4096  # K and V, f16, every layer, every token: 512 MiB
    assert est.kv_cache == kv == 512 * MIB
    assert est.overhead == OVERHEAD_BASE + int(0.05 * 4 * GIB)
    assert est.need == 4 * GIB + kv + est.overhead
    assert est.fit is Fit.VRAM and est.badge == "fits in VRAM" and est.usable_vram == int(0.9 * 24 * GIB)


def test_sliding_window_and_wider_full_layers() -> None:
    arch = ArchInfo(n_layer=30, n_head_kv=8, head_dim=256, n_layer_swa=25, sliding_window=1024,
                    n_head_kv_full=2, head_dim_full=512, extra_bytes=GIB)
    ctx = 8192
    assert arch.kv_bytes(ctx) == 2 * 2 * (5 * 2 * 512 * ctx + 25 * 8 * 256 * 1024)
    assert arch.kv_bytes(512) == 2 * 2 * (5 * 2 * 512 * 512 + 25 * 8 * 256 * 512)
    assert estimate(GIB, arch, ctx, machine()).overhead == OVERHEAD_BASE + int(0.05 * GIB) + GIB


@pytest.mark.parametrize("hw,size_gib,fit", [
    (machine(ram_gib=32, vram_gib=24), 8, Fit.VRAM),
    (machine(ram_gib=32, vram_gib=24, free_vram_gib=4), 8, Fit.RAM),  # the GPU is busy: free VRAM counts
    (machine(ram_gib=32, vram_gib=24, offload=False), 8, Fit.RAM),  # CPU-only llama.cpp build
    (machine(ram_gib=32), 8, Fit.RAM),
    (machine(ram_gib=8), 8, Fit.NONE),
    (machine(ram_gib=64, vram_gib=64, unified=True), 40, Fit.VRAM),  # 75% of 64 GiB for Metal
    (machine(ram_gib=64, vram_gib=64, unified=True), 48, Fit.RAM),
    (machine(ram_gib=None), 1, Fit.UNKNOWN),
    (machine(ram_gib=None, vram_gib=24), 1, Fit.VRAM),
])
def test_badges(hw: Hardware, size_gib: float, fit: Fit) -> None:
    est = estimate(int(size_gib * GIB), ArchInfo(n_layer=32, n_head_kv=8, head_dim=128), 4096, hw)
    assert est.fit is fit, est.reason
    assert est.reason.startswith("needs ")


def test_usable_memory() -> None:
    assert usable_ram(machine(ram_gib=100)) == int(0.85 * 100 * GIB)
    assert usable_vram(machine(vram_gib=10, offload=False)) == 0
    assert usable_vram(machine(vram_gib=10, free_vram_gib=7)) == 7 * GIB
    assert usable_vram(machine(vram_gib=64, unified=True)) == int(0.75 * 64 * GIB)


def test_disk_check() -> None:
    arch = ArchInfo(n_layer=2, n_head_kv=2, head_dim=64)
    est = estimate(10 * GIB, arch, 512, machine(disk_gib=15))
    assert est.disk_ok and est.disk_need == 10 * GIB
    est = estimate(10 * GIB, arch, 512, machine(disk_gib=15), convert=True)  # the converted copy too
    assert est.disk_ok is False and "of disk" in est.reason
    assert estimate(10 * GIB, arch, 512, machine(disk_gib=1), on_disk=True).disk_ok is True
    assert estimate(10 * GIB, arch, 512, machine(disk_gib=None)).disk_ok is None


def test_recommendation() -> None:
    cat = load_catalog()
    # a big GPU: the strongest model that fits in VRAM
    rec = recommend(cat, machine(ram_gib=128, vram_gib=80))
    assert rec.entry.name == "diffusiongemma-26b-a4b-q8_0"
    assert rec.reason.startswith("the strongest model that fits in GPU memory (it needs ")
    assert "preferred for speed" not in rec.reason  # it is the strongest that fits at all
    # 24 GB GPU: the Q8_0 does not fit in VRAM (only in RAM), the Q4_K_M does
    rec = recommend(cat, machine(ram_gib=64, vram_gib=24))
    assert rec.entry.name == "diffusiongemma-26b-a4b-q4_k_m" and rec.estimate.fit is Fit.VRAM
    assert "preferred for speed over DiffusionGemma 26B-A4B it, Q8_0" in rec.reason
    # with 24 GiB of RAM the Q8_0 still runs, its experts of some layers in RAM (issue 45), so the
    # note stays; with too little RAM even for those, the Q4_K_M is simply the strongest that fits
    rec = recommend(cat, machine(ram_gib=24, vram_gib=24))
    assert rec.entry.name == "diffusiongemma-26b-a4b-q4_k_m" and "would run with its experts in RAM" in rec.reason
    rec = recommend(cat, machine(ram_gib=8, vram_gib=24))
    assert rec.entry.name == "diffusiongemma-26b-a4b-q4_k_m" and "preferred for speed" not in rec.reason
    # 8 GB GPU: a 7-8B Q4 in VRAM (SDAR 8B, rank 78, above Dream's 60) beats a 26B with its experts
    # in RAM, and the reason says it is for speed
    rec = recommend(cat, machine(ram_gib=64, vram_gib=8))
    assert rec.entry.name == "sdar-8b-chat-q4_k_m" and rec.estimate.fit is Fit.VRAM
    assert ("preferred for speed over DiffusionGemma 26B-A4B it, Q8_0, which is stronger but would run with its "
            "experts in RAM") in rec.reason
    # CPU only, 23.5 GiB (20.0 GiB usable): DiffusionGemma Q4 needs 18.4 GiB, so it fits and,
    # being the strongest that fits, is the one recommended (the report of issue 16)
    rec = recommend(cat, machine(ram_gib=23.5, offload=False))
    assert rec.entry.name == "diffusiongemma-26b-a4b-q4_k_m" and rec.estimate.fit is Fit.RAM
    assert rec.reason == ("the strongest model that fits in RAM (it needs 18.4 GiB of the 20.0 GiB usable: "
                          "85% of the RAM, the rest stays free for the system)")
    # CPU only, 20 GiB (17.0 usable): the Q4 does not fit, SDAR 8B (rank 78) is the strongest that does
    assert recommend(cat, machine(ram_gib=20, offload=False)).entry.name == "sdar-8b-chat-q4_k_m"
    # ... and with SDAR 8B set aside, Dream (rank 60) is the strongest of the GGUF entries there
    from dgchat.hub.catalog import Catalog

    no_sdar = Catalog(tuple(e for e in cat if e.family != "block_diffusion"), cat.path)
    assert recommend(no_sdar, machine(ram_gib=20, offload=False)).entry.name == "dream-v0-instruct-7b-q4_k_m"
    assert recommend(cat, machine(ram_gib=40, offload=False)).entry.name == "diffusiongemma-26b-a4b-q8_0"
    # 4 GiB of RAM: a real chat model fits now, SDAR 1.7B at Q8_0 (3.0 GiB of the 3.4 GiB usable)
    assert recommend(cat, machine(ram_gib=4, offload=False)).entry.name == "sdar-1.7b-chat-q8_0"
    # too little of everything: the bundled model, always
    rec = recommend(cat, machine(ram_gib=1, offload=False))
    assert rec.entry.bundled and "bundled model always works" in rec.reason
    rec = recommend(cat, machine(ram_gib=None, offload=False))
    assert rec.entry.bundled and "RAM is unknown" in rec.reason
    # no room on disk for any download (the smallest checkpoint needs ~2.8 GB with its conversion)
    assert recommend(cat, machine(ram_gib=64, vram_gib=24, disk_gib=2)).entry.bundled
    # ... unless it is already here
    rec = recommend(cat, machine(ram_gib=64, vram_gib=24, disk_gib=2), on_disk={"llada-8b-instruct-q4_k_m"})
    assert rec.entry.name == "llada-8b-instruct-q4_k_m"


def test_a_checkpoint_needs_disk_for_itself_its_conversion_and_the_result() -> None:
    sdar = load_catalog().get("sdar-1.7b-chat-q4_k_m")
    est = estimate_entry(sdar, machine(ram_gib=16, disk_gib=9.5))
    # the bf16 checkpoint, the unquantized GGUF written from it, and the Q4_K_M file, all at once
    assert est.disk_need == 2 * sdar.checkpoint_size + sdar.size and est.disk_ok is True
    assert est.weights == sdar.size  # memory: the GGUF that runs, not the checkpoint
    assert estimate_entry(sdar, machine(ram_gib=16, disk_gib=8.5)).disk_ok is False
    assert estimate_entry(sdar, machine(ram_gib=16, disk_gib=5)).disk_ok is False  # the checkpoint alone fits
    assert "the download needs 8.8 GiB of disk" in estimate_entry(sdar, machine(ram_gib=16, disk_gib=5)).reason
    assert estimate_entry(sdar, machine(ram_gib=16, disk_gib=5), on_disk=True).disk_need == 0


def test_bundled_entry_is_always_on_disk() -> None:
    cat = load_catalog()
    est = estimate_entry(cat.bundled, machine(ram_gib=4, disk_gib=0))
    assert est.disk_need == 0 and est.fit is Fit.RAM


def test_arch_from_a_gguf_header(tmp_path: Path) -> None:
    from dgchat.model_backend.gguf_file import read_gguf_header
    from fixtures.gguf_models import TinySpec, write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "m.gguf", TinySpec(arch="llada", n_layer=3, n_head=4, n_head_kv=2, n_embd=64,
                                                         n_ctx=2048))
    arch, ctx = arch_from_header(read_gguf_header(path))
    assert (arch.n_layer, arch.n_head_kv, arch.head_dim, arch.n_layer_swa) == (3, 2, 16, 0)
    assert ctx == 2048
