"""A mixture of experts on a GPU too small for it (issue 45): the catalog shape's bytes, the engine's
plan, the prediction with experts in RAM, and the fit badge that says so."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dgchat.hub.catalog import load_catalog
from dgchat.hub.fit import Fit, estimate_entry, recommend, speed_verdict
from dgchat.hub.hardware import GpuInfo, Hardware
from dgchat.hub.machine_profile import MachineProfile, bytes_per_weight
from dgchat.hub.speed import estimated_gpu_profile, predict, row_type, shape_from_entry
from dgchat.hub.split_speed import (
    OP_OFFLOAD_MIN_BATCH,
    SplitPrediction,
    model_bytes,
    plan_for,
    predict_placed,
    split_words,
    step_parts,
)
from fixtures.speed_profile import REFERENCE_PROFILE

GIB = 1024**3
DG_Q4 = "diffusiongemma-26b-a4b-q4_k_m"
DG_Q8 = "diffusiongemma-26b-a4b-q8_0"


def entry(name: str):
    return next(e for e in load_catalog() if e.name == name)


def machine(ram_gib: float = 32, vram_gib: float | None = 12, offload: bool = True) -> Hardware:
    vram = int(vram_gib * GIB) if vram_gib is not None else None
    return Hardware(cpu_cores=2, ram_total=int(ram_gib * GIB), ram_available=None, disk_free=500 * GIB,
                    models_dir=Path("/models"), gpu_offload=offload, vram_total=vram, vram_free=vram)


def reference_profile() -> MachineProfile:
    return MachineProfile.from_dict({**json.loads(REFERENCE_PROFILE.read_text()), "build_key": "k"})


# -- bytes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [DG_Q4, DG_Q8])
def test_model_bytes_add_up_to_the_catalog_file(name: str) -> None:
    """The shape's bytes at their storage types are the file the catalog names (16.9 GB at Q4_K_M,
    26.9 GB at Q8_0): within 1 %, with the tied LM head counted once as the file holds it."""
    e = entry(name)
    model = model_bytes(shape_from_entry(e))
    assert model.output_copy > 0 and model.n_layer == 30  # tied: the LM head is token_embd's copy
    assert model.weights == pytest.approx(e.size, rel=0.01)
    # the routed experts are most of it: what makes keeping them in RAM worth it
    assert 0.85 < model.experts / model.weights < 0.95


def test_rows_the_k_quants_cannot_hold_fall_back_as_llama_quantize_does() -> None:
    """DiffusionGemma's expert ffn_down rows are 704 wide, not a multiple of the k-quants' 256:
    llama-quantize stores them q5_0 (for q4_k) and q8_0 (for q6_k); without that the shape came to
    15.4 GB, 9 % under the file."""
    assert row_type("q4_k", 704) == "q5_0" and row_type("q6_k", 704) == "q8_0" and row_type("q4_k", 2816) == "q4_k"
    assert row_type("q8_0", 704) == "q8_0"
    shape = shape_from_entry(entry(DG_Q4))
    assert set(shape.expert) == {"q4_k", "q5_0", "q8_0"}
    one_expert = sum(w * bytes_per_weight(q) for q, w in shape.expert.items())
    assert one_expert * 128 == pytest.approx(15.2e9, rel=0.01)


# -- the plan and its speed --------------------------------------------------------------------------


def dg_at_12_gib():
    e = entry(DG_Q4)
    shape = shape_from_entry(e)
    est = estimate_entry(e, machine())
    plan = plan_for(shape, e.arch, e.context, vram=12 * GIB, need=est.need)
    return shape, est, plan


def test_diffusion_gemma_q4_at_12_gib_keeps_some_layers_experts_in_ram() -> None:
    _, est, plan = dg_at_12_gib()
    assert plan.mode == "experts-in-ram" and plan.layers_on_gpu == 30
    assert 0 < len(plan.experts_in_ram) < 30
    assert plan.gpu_bytes <= 12 * GIB and est.placement == plan


def test_a_split_step_is_between_all_on_the_gpu_and_all_on_the_cpu() -> None:
    """At 12 GiB the split answers slower than the whole model on the same GPU would and faster than
    the CPU alone, and the weights in RAM (not the GPU's share) are most of a canvas step."""
    shape, _, plan = dg_at_12_gib()
    cpu, gpu = reference_profile().cpu, estimated_gpu_profile(None)
    split = predict_placed(shape, gpu, cpu, plan)
    whole, on_cpu = predict(shape, gpu), predict(shape, cpu)
    assert isinstance(split, SplitPrediction) and split.device == "gpu+cpu"
    assert whole.seconds_per_step < split.seconds_per_step < on_cpu.seconds_per_step
    assert whole.seconds_per_answer < split.seconds_per_answer < on_cpu.seconds_per_answer
    assert split.step["ram_weights_seconds"] > split.step["gpu_seconds"]
    assert split.step["seconds"] == pytest.approx(split.seconds_per_step, rel=1e-6)
    # llama.cpp's default for a 256-token canvas: the experts copied to the GPU; the other route,
    # the CPU multiplying them, is kept beside it and is slower on this 2-core profile
    assert split.step["route"] == "copy" and split.other_route["route"] == "cpu"
    assert split.other_route["seconds"] > split.step["seconds"]
    assert split.other_route["seconds_per_answer"] > split.seconds_per_answer
    # a step moves about every expert of the layers in RAM (a canvas touches 127.9 of 128)
    per_layer = model_bytes(shape).layers[0].experts
    assert split.step["bus_bytes"] == pytest.approx(len(plan.experts_in_ram) * per_layer, rel=0.01)


def test_the_route_follows_llama_cpps_op_offload_batch() -> None:
    """ggml-cuda / ggml-vulkan offload a MUL_MAT_ID of 32 tokens or more (ne[2]); one `--ar` token
    stays on the CPU, which reads only its 8 experts per layer."""
    shape, _, plan = dg_at_12_gib()
    cpu, gpu = reference_profile().cpu, estimated_gpu_profile(None)

    def parts(n: int, route: str = "auto"):
        return step_parts(shape, gpu, n, ctx=64 + n, rows=n, cpu=cpu, placement=plan, route=route)

    assert parts(OP_OFFLOAD_MIN_BATCH - 1).route == "cpu" and parts(OP_OFFLOAD_MIN_BATCH).route == "copy"
    one = parts(1)
    assert one.route == "cpu" and one.copied_bytes < 1e6  # only the hidden states cross
    # forced the other way, one token would copy 8 experts of each layer in RAM
    assert parts(1, "copy").copied_bytes == pytest.approx(
        len(plan.experts_in_ram) * 8 * model_bytes(shape).layers[0].experts / 128, rel=1e-6)


# -- the fit badge -----------------------------------------------------------------------------------


def test_the_fit_says_experts_in_ram() -> None:
    est = estimate_entry(entry(DG_Q4), machine(ram_gib=32, vram_gib=12))
    assert est.fit is Fit.EXPERTS_RAM and est.badge == "fits with experts in RAM" and est.fits
    assert "the experts of" in est.reason and "in RAM" in est.reason
    # a GPU that holds it whole, and a CPU-only build: as before
    assert estimate_entry(entry(DG_Q4), machine(ram_gib=64, vram_gib=24)).fit is Fit.VRAM
    assert estimate_entry(entry(DG_Q4), machine(ram_gib=32, vram_gib=12, offload=False)).fit is Fit.RAM
    # too little RAM for the experts that do not fit the GPU
    assert estimate_entry(entry(DG_Q4), machine(ram_gib=8, vram_gib=12)).fit is Fit.NONE
    # a dense model is never planned this way
    assert estimate_entry(entry("llada-8b-instruct-q4_k_m"), machine(vram_gib=4)).placement is None


def test_the_verdict_prices_the_plan_and_says_where() -> None:
    hw = machine(ram_gib=32, vram_gib=12)
    e = entry(DG_Q4)
    shape = shape_from_entry(e)
    est = estimate_entry(e, hw)
    verdict = speed_verdict(shape, est, hw, reference_profile(), 90.0, e.arch)
    prediction = verdict.prediction
    assert isinstance(prediction, SplitPrediction)
    assert prediction.where().startswith("on the GPU with the experts of ")
    assert "layers in RAM" in verdict.text()
    assert prediction.as_dict()["placement"]["mode"] == "experts-in-ram"
    words = split_words(prediction)
    assert words is not None and words.startswith("Step (estimated): ") and "copied to the GPU" in words
    assert split_words(predict(shape, reference_profile().cpu)) is None


def test_after_a_rebuild_the_gpu_time_is_the_plans_too() -> None:
    """A GPU this build cannot offload to: the time after rebuilding is priced by the same plan."""
    gpu = GpuInfo("NVIDIA GeForce RTX 4070", 12 * GIB, 12 * GIB, "nvidia")
    hw = replace(machine(ram_gib=32, vram_gib=12, offload=False), gpus=(gpu,))
    e = entry(DG_Q4)
    est = estimate_entry(e, hw)
    assert est.fit is Fit.RAM and est.placement is None  # this build runs it on the CPU
    verdict = speed_verdict(shape_from_entry(e), est, hw, reference_profile(), 90.0, e.arch)
    assert verdict.after_rebuild is not None and isinstance(verdict.after_rebuild, SplitPrediction)
    assert verdict.after_rebuild.seconds_per_answer < verdict.prediction.seconds_per_answer


def test_a_smaller_gpu_prefers_a_model_it_holds_and_says_why() -> None:
    rec = recommend(load_catalog(), machine(ram_gib=64, vram_gib=8))
    assert rec.estimate.fit is Fit.VRAM
    assert "which is stronger but would run with its experts in RAM" in rec.reason
    assert estimate_entry(entry(DG_Q8), machine(ram_gib=64, vram_gib=8)).fit is Fit.EXPERTS_RAM
