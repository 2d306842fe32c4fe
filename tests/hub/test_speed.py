"""Speed before the download (issue 29): the prediction's arithmetic, the catalog shapes against the
shipped file, and the recommendation by usable speed. No model runs here except where a test says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from dgchat.assets import bundled_model_path
from dgchat.hub.catalog import Catalog, load_catalog
from dgchat.hub.fit import TOO_SLOW, Fit, SpeedVerdict, estimate_entry, recommend, speed_verdict
from dgchat.hub.hardware import GpuInfo, Hardware, rebuild_command
from dgchat.hub.machine_profile import DeviceProfile, MachineProfile, bytes_per_weight, profile_path
from dgchat.hub.manager import ModelManager
from dgchat.hub.speed import (
    ModelShape,
    decode_seconds,
    duration_words,
    estimated_gpu_profile,
    gpu_figures,
    predict,
    quant_of,
    shape_from_entry,
    shape_from_header,
)
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.model_info import inspect_header

GIB = 1 << 30
REFERENCE = Path(__file__).parents[1] / "fixtures" / "machine_profile.json"


def linear_device(a: float = 1e-10, b: float = 1e-11, **kw) -> DeviceProfile:
    """A device whose n-token product costs a + b*n seconds per weight (memory, then compute), and
    nothing else unless asked: every term of the prediction can be checked by hand."""
    widths = (1, 4, 16, 64, 256)
    table = {w: a + b * w for w in widths}
    values = dict(kind="cpu", name="test CPU", threads=2, matmul={q: dict(table) for q in ("q4_0", "q8_0", "f16")},
                  stats_s_per_logit=0.0, topk_s_per_logit=0.0, exact_s_per_mac=0.0, decode_s=0.0, layer_s=0.0,
                  layer_token_s=0.0)
    values.update(kw)
    return DeviceProfile(**values)


def reference_profile() -> MachineProfile:
    data = json.loads(REFERENCE.read_text())
    return MachineProfile.from_dict({**data, "build_key": "k"})


def dense_shape(**kw) -> ModelShape:
    values = dict(family="masked", n_layer=2, n_embd=64, n_vocab=100, n_head=1, head_dim=64,
                  dense={"q8_0": 1_000_000}, output=("q8_0", 6_400), kv_memory=True,
                  sampler={"steps": 4, "gen_length": 32})
    values.update(kw)
    return ModelShape(**values)


# -- the arithmetic ---------------------------------------------------------------------------------


def test_tau_is_linear_between_widths_and_beyond_the_widest() -> None:
    dev = linear_device()
    assert dev.tau("q8_0", 1) == pytest.approx(1.1e-10)
    assert dev.tau("q8_0", 10) == pytest.approx(1e-10 + 1e-10)  # between 4 and 16, exactly linear here
    assert dev.tau("q8_0", 512) == pytest.approx((1e-10 + 256e-11) * 2)  # compute-bound: proportional
    assert dev.tau("q4_k", 16) == dev.tau("q8_0", 16)  # an unmeasured type runs as its stand-in
    assert dev.tau("f32", 1) == pytest.approx(2 * dev.tau("f16", 1))  # twice the bytes where memory decides


def test_experts_touched_at_canvas_width() -> None:
    moe = dense_shape(n_expert=128, n_expert_used=8, expert={"q8_0": 1000})
    assert moe.experts_touched(1) == pytest.approx(8)
    assert moe.experts_touched(256) == pytest.approx(128 * (1 - (120 / 128) ** 256))
    assert moe.experts_touched(256) > 127.9  # a 256-position canvas reads every expert
    assert dense_shape().experts_touched(256) == 0


def test_decode_cost_terms() -> None:
    dev = linear_device()
    shape = dense_shape()
    one = decode_seconds(shape, dev, 32, ctx=0, rows=1)
    assert one == pytest.approx(1_000_000 * dev.tau("q8_0", 32) + 6_400 * dev.tau("q8_0", 1))
    # twice the layers' weights: twice the product time
    two = decode_seconds(replace(shape, dense={"q8_0": 2_000_000}), dev, 32, ctx=0, rows=1)
    assert two - one == pytest.approx(1_000_000 * dev.tau("q8_0", 32))
    # experts: a token reads k of them, a canvas every one of them for ~n*k/E tokens each
    moe = replace(shape, dense={}, n_expert=128, n_expert_used=8, expert={"q8_0": 10_000})
    out = 6_400 * dev.tau("q8_0", 1)
    assert decode_seconds(moe, dev, 1, ctx=0, rows=1) - out == pytest.approx(8 * 10_000 * dev.tau("q8_0", 1))
    t = moe.experts_touched(256)
    out256 = 6_400 * dev.tau("q8_0", 256)
    assert decode_seconds(moe, dev, 256, ctx=0, rows=256) - out256 == pytest.approx(
        t * 10_000 * dev.tau("q8_0", 256 * 8 / t))
    # llama.cpp runs the last layer's MLP on the rows asked for only: with one row of two layers',
    # half of the MLP runs at 256 tokens and half at one
    mlp = replace(shape, dense={}, ffn={"q8_0": 20_000})
    assert decode_seconds(mlp, dev, 256, ctx=0, rows=1) - out == pytest.approx(
        10_000 * dev.tau("q8_0", 256) + 10_000 * dev.tau("q8_0", 1))
    assert decode_seconds(mlp, dev, 256, ctx=0, rows=256) - out256 == pytest.approx(20_000 * dev.tau("q8_0", 256))
    # attention: 2 * ctx * heads * head_dim per layer at the f16 rate
    assert decode_seconds(shape, dev, 32, ctx=100, rows=1) - one == pytest.approx(
        2 * 2 * 100 * 64 * dev.tau("f16", 32))
    # the head: statistics per logit; DiffusionGemma's soft embedding exact or top-256 on a CPU
    dev = linear_device(stats_s_per_logit=1e-9, topk_s_per_logit=2e-9, exact_s_per_mac=1e-12)
    base = decode_seconds(shape, dev, 32, ctx=0, rows=32)
    assert decode_seconds(shape, dev, 32, ctx=0, rows=32, head="stats") - base == pytest.approx(100 * 32 * 1e-9)
    dg = replace(shape, family="diffusion_gemma")
    exact = decode_seconds(dg, dev, 32, ctx=0, rows=32, head="dg") - base
    assert exact == pytest.approx(100 * 32 * 1e-9 + 100 * 64 * 32 * 1e-12)
    big = replace(dg, n_vocab=262_144, output=("q8_0", 262_144 * 64))
    base = decode_seconds(big, dev, 32, ctx=0, rows=32)
    topk = decode_seconds(big, dev, 32, ctx=0, rows=32, head="dg") - base
    assert topk == pytest.approx(262_144 * 32 * (1e-9 + 2e-9) + 256 * 64 * 32 * 1e-12)


def test_answer_arithmetic_per_family() -> None:
    dev = linear_device(decode_s=1e-3)
    # DiffusionGemma: prompt, then per canvas its steps and one commit; 256 tokens = 8 canvases of 32
    dg = dense_shape(family="diffusion_gemma", sampler={"steps": 24, "gen_length": 32}, typical_steps=20)
    p = predict(dg, dev)
    assert (p.canvas, p.canvases, p.steps_per_canvas, p.steps_are_limit) == (32, 8, 20, False)
    assert p.tokens_per_s == pytest.approx(256 / p.seconds_per_answer)
    assert p.ar_tokens_per_s is not None
    assert predict(replace(dg, typical_steps=None), dev).steps_are_limit  # no measured count: the limit
    # masked without KV memory: each step runs the whole sequence, which grows canvas by canvas
    masked = dense_shape(kv_memory=False, sampler={"steps": 8, "gen_length": 128})
    q = predict(masked, dev, prompt_tokens=64)
    first = decode_seconds(masked, dev, 64 + 128, ctx=64 + 128, rows=128, head="stats")
    second = decode_seconds(masked, dev, 64 + 256, ctx=64 + 256, rows=128, head="stats")
    assert q.canvases == 2 and q.seconds_per_answer == pytest.approx(8 * (first + second))
    assert q.ar_seconds_per_answer is None
    # with KV memory (prefix cache): a full pass at each block start, the block alone after
    cached = dense_shape(kv_memory=True, sampler={"steps": 8, "gen_length": 128, "block_length": 32})
    r = predict(cached, dev, prompt_tokens=64)
    assert r.seconds_per_answer < predict(replace(cached, kv_memory=False), dev, prompt_tokens=64).seconds_per_answer


def test_words_for_people() -> None:
    assert [duration_words(s) for s in (0.3, 4.2, 89, 360, 5400, 40_000, 300_000)] == [
        "<1 s", "4 s", "89 s", "6 min", "1.5 h", "11 h", "3 days"]
    p = predict(dense_shape(family="diffusion_gemma", typical_steps=4), linear_device(decode_s=1.0))
    assert p.sentence().startswith(f"about {duration_words(p.seconds_per_answer)} per answer on this CPU (256 tokens, ")


def test_quant_bytes_and_names() -> None:
    assert bytes_per_weight("q4_0") == 18 / 32 and bytes_per_weight("q8_0") == 34 / 32
    assert bytes_per_weight("q4_k") == 144 / 256 and bytes_per_weight("f16") == 2
    assert quant_of("diffusiongemma-26B-A4B-it-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("LLaDA-8B-Instruct.Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("LLaDA-MoE-7B-A1B-Instruct.Q8_0.gguf") == "Q8_0"
    assert quant_of("model.gguf") is None


# -- shapes -----------------------------------------------------------------------------------------


def test_shape_from_the_bundled_file() -> None:
    header = read_gguf_header(bundled_model_path())
    info = inspect_header(header)
    shape = shape_from_header(header, family=info.family, kv_memory=info.has_kv_memory, sampler=info.defaults)
    assert (shape.n_layer, shape.n_embd, shape.n_vocab, shape.n_head, shape.head_dim) == (4, 256, 16384, 4, 64)
    assert (shape.n_expert, shape.n_expert_used, shape.self_cond_inter) == (4, 2, 512)
    assert shape.output == ("q8_0", 16384 * 256)  # tied: the token embedding is the LM head
    assert shape.sampler["gen_length"] == 32 and shape.sampler["steps"] == 24
    matrices = sum(math.prod(t.shape[:2]) for n, t in header.tensors.items() if n.startswith("blk.")
                   and len(t.shape) == 2)
    assert sum(shape.dense.values()) + sum(shape.ffn.values()) == matrices
    assert sum(shape.ffn.values()) == 4 * (3 * 256 * 512 + 256 * 4)  # dense MLP and router of each layer


def test_catalog_shapes_match_what_they_describe() -> None:
    catalog = load_catalog()
    # the bundled entry's numbers describe the shipped file: the same weights, matrix by matrix
    header = read_gguf_header(bundled_model_path())
    info = inspect_header(header)
    from_file = shape_from_header(header, family=info.family, kv_memory=True, sampler={})
    from_entry = shape_from_entry(catalog.bundled)
    assert from_entry.total_weights == from_file.total_weights
    assert from_entry.active_weights == from_file.active_weights
    # DiffusionGemma 26B-A4B: ~25 B weights (the tied embedding counted once), ~3.8 B a token reads
    dg = shape_from_entry(catalog.get("diffusiongemma-26b-a4b-q4_k_m"))
    assert 24e9 < dg.total_weights < 27e9 and 3.5e9 < dg.active_weights < 4.2e9
    assert dg.output[0] == "q6_k" and set(dg.dense) >= {"q4_k", "q6_k"}  # llama-quantize's Q4_K_M mix
    # the catalog's sizes agree with the shapes at the quantization's bits per weight (the shape
    # counts the LM head once; an untied model's file also holds the token embedding, as big)
    for entry in catalog:
        if entry.bundled:
            continue
        shape = shape_from_entry(entry)
        quant = entry.quant or quant_of(entry.filename or "")
        untied = shape.total_weights + (shape.n_vocab * shape.n_embd if entry.family == "block_diffusion" else 0)
        low, high = 8 * entry.size / untied, 8 * entry.size / shape.total_weights
        band = (4.3, 5.6) if quant and quant.startswith("Q4_K") else (8.0, 9.3)
        assert low < band[1] and high > band[0], (entry.name, low, high)
    moe = shape_from_entry(catalog.get("llada-moe-7b-a1b-instruct-q8_0"))
    assert 0.9e9 < moe.active_weights < 1.6e9  # "A1B"


# -- the recommendation -----------------------------------------------------------------------------


def machine(*, ram_gib: float = 23.5, vram_gib: float | None = None, offload: bool = False,
            gpus: tuple[GpuInfo, ...] = ()) -> Hardware:
    vram = int(vram_gib * GIB) if vram_gib is not None else None
    return Hardware(cpu_cores=2, ram_total=int(ram_gib * GIB), ram_available=None, disk_free=500 * GIB,
                    models_dir=Path("/tmp/models"), gpu_offload=offload, vram_total=vram, vram_free=vram, gpus=gpus)


def verdicts(hw: Hardware, profile: MachineProfile, limit: float = 90.0,
             catalog: Catalog | None = None) -> dict[str, SpeedVerdict]:
    out = {}
    for entry in catalog or load_catalog():
        est = estimate_entry(entry, hw)
        if est.fit in (Fit.VRAM, Fit.RAM):
            out[entry.name] = speed_verdict(shape_from_entry(entry), est, hw, profile, limit)
    return out


def without_block_diffusion() -> Catalog:
    """The shipped catalog as issue 29 knew it: no block-diffusion entries (issue 42 added them;
    tests/hub/test_speed_block_diffusion.py holds the recommendation with them)."""
    shipped = load_catalog()
    return Catalog(tuple(e for e in shipped if e.family != "block_diffusion"), shipped.path)


def test_a_two_core_cpu_is_recommended_a_model_it_can_run() -> None:
    """The report of issue 29: 2 cores, 23.5 GiB, no GPU. By memory the 26B fits; by speed only the
    bundled model answers within the limit (among the masked and DiffusionGemma models), and the
    reason names what was passed over."""
    catalog, profile, hw = without_block_diffusion(), reference_profile(), machine()
    speeds = verdicts(hw, profile, catalog=catalog)
    assert speeds["diffusiongemma-26b-a4b-q4_k_m"].too_slow
    assert speeds["diffusiongemma-26b-a4b-q4_k_m"].prediction.seconds_per_answer > 120
    assert not speeds["dgchat-tiny-plays"].too_slow
    rec = recommend(catalog, hw, speeds=speeds)
    assert rec.entry.bundled
    assert rec.reason.startswith("no catalog model is predicted to answer within 90 s on this machine; the bundled "
                                 "model answers in ~")
    assert "DiffusionGemma 26B-A4B it, Q4_K_M would need ~" in rec.reason and " per answer here" in rec.reason
    assert [e.name for e, _ in rec.passed_over][0] == "diffusiongemma-26b-a4b-q4_k_m"
    # without speeds (no profile yet) the old memory-only answer stands
    assert recommend(catalog, hw).entry.name == "diffusiongemma-26b-a4b-q4_k_m"


def test_a_40_gib_gpu_gets_diffusion_gemma() -> None:
    catalog, profile = load_catalog(), reference_profile()
    hw = machine(ram_gib=64, vram_gib=40, offload=True)
    speeds = verdicts(hw, profile)
    rec = recommend(catalog, hw, speeds=speeds)
    assert rec.entry.family == "diffusion_gemma" and not rec.entry.bundled and rec.estimate.fit is Fit.VRAM
    assert rec.speed is not None and rec.speed.prediction.device == "gpu"
    assert rec.speed.prediction.basis.startswith("estimated from published figures")  # no GPU measured here
    assert "answers within 90 s and fits in GPU memory" in rec.reason


def test_a_limit_decides_and_too_slow_is_its_own_badge() -> None:
    catalog, profile, hw = load_catalog(), reference_profile(), machine(ram_gib=64)
    generous = verdicts(hw, profile, limit=1e9)
    assert recommend(catalog, hw, speeds=generous).entry.name == "diffusiongemma-26b-a4b-q8_0"
    strict = verdicts(hw, profile, limit=1e-3)
    rec = recommend(catalog, hw, speeds=strict)
    assert rec.entry.bundled and "passed over" in rec.reason


def test_a_gpu_this_build_cannot_use_shows_both_and_the_command() -> None:
    catalog, profile = load_catalog(), reference_profile()
    gpu = GpuInfo("NVIDIA GeForce RTX 4090", 24 * GIB, 23 * GIB, "nvidia")
    hw = machine(ram_gib=64, vram_gib=24, offload=False, gpus=(gpu,))
    speeds = verdicts(hw, profile)
    v = speeds["dream-v0-instruct-7b-q4_k_m"]
    assert v.prediction.device == "cpu" and v.too_slow
    assert v.after_rebuild is not None and v.after_rebuild.device == "gpu"
    assert v.after_rebuild.seconds_per_answer < v.prediction.seconds_per_answer / 20
    assert v.rebuild == 'CMAKE_ARGS="-DGGML_CUDA=on" python engine/build.py && pip install .'
    assert f"with your GPU after rebuilding: {v.after_rebuild.per_answer()}" in v.text()
    rec = recommend(catalog, hw, speeds=speeds)
    assert "after rebuilding the engine for it (CMAKE_ARGS=\"-DGGML_CUDA=on\"" in rec.reason
    assert rebuild_command("amd").startswith('CMAKE_ARGS="-DGGML_HIP=on"')
    assert rebuild_command("apple").startswith('CMAKE_ARGS="-DGGML_METAL=on"')


def test_gpu_figures_by_name() -> None:
    assert gpu_figures("NVIDIA H200")[2] == "H200"
    assert gpu_figures("NVIDIA H100 PCIe")[2] == "H100 PCIe"
    assert gpu_figures("NVIDIA GeForce RTX 4060 Ti")[2] == "RTX 4060 Ti"
    assert gpu_figures("Some Card")[2] == ""
    fast, slow = estimated_gpu_profile(None, name="NVIDIA H200"), estimated_gpu_profile(None, name="RTX 3060")
    assert fast.tau("q4_0", 1) < slow.tau("q4_0", 1) and fast.tau("q4_0", 256) < slow.tau("q4_0", 256)
    assert "typical GPU" in estimated_gpu_profile(None).basis


def test_listing_rows_carry_speed_and_badge() -> None:
    mgr = ModelManager(catalog=without_block_diffusion())
    profile = reference_profile()
    rows = {r.name: r for r in mgr.listing(machine(), profile=profile, include_hf_cache=False)}
    assert rows["diffusiongemma-26b-a4b-q4_k_m"].badge == TOO_SLOW
    assert rows["diffusiongemma-26b-a4b-q8_0"].badge == "will not fit" and rows["diffusiongemma-26b-a4b-q8_0"].speed is None
    bundled = rows["dgchat-tiny-plays"]
    assert bundled.recommended and bundled.badge == "fits in RAM"
    predicted = bundled.as_dict()["predicted"]
    assert set(predicted) >= {"tokens_per_s", "seconds_per_answer", "seconds_per_step"}
    assert predicted["tokens_per_s"] > 10
    # without a profile, no speeds and no speed badge
    assert all(r.speed is None for r in mgr.listing(machine(), include_hf_cache=False))


# -- the profile cache ------------------------------------------------------------------------------


def test_profile_cache_reused_and_invalidated(monkeypatch: pytest.MonkeyPatch) -> None:
    from dgchat.hub import machine_profile as mp
    from dgchat.model_backend import llamacpp
    from dgchat.model_backend.llamacpp import build_info

    cached = mp.cached_profile()
    assert cached is not None  # the reference profile tests/conftest.py saved as this build's
    calls = []
    monkeypatch.setattr(mp, "measure", lambda *a, **k: calls.append(1) or replace(cached, seconds=1.0))
    assert mp.ensure_profile() == cached and not calls  # reused: nothing measured
    assert mp.cached_profile(threads=cached.threads + 1) is None  # another thread count
    assert mp.ensure_profile(remeasure=True).seconds == 1.0 and calls == [1]
    # a new engine build (here: another patch level) has another key: the saved profile is stale
    info = llamacpp.engine_info()
    monkeypatch.setattr(build_info, "engine_info", lambda: replace(info, patch_level=info.patch_level + 1))
    assert mp.cached_profile() is None
    ensured = mp.ensure_profile()
    assert calls == [1, 1] and ensured.seconds == 1.0
    # a damaged file is measured again, never an error
    profile_path().write_text("{not json")
    assert mp.cached_profile() is None


def test_cli_models_list_json_has_predictions(capsys: pytest.CaptureFixture) -> None:
    from dgchat.cli import main

    assert main(["models", "list", "--json", "--no-hf-cache"]) == 0
    listing = json.loads(capsys.readouterr().out)
    models = {m["name"]: m for m in listing["models"]}
    assert models["dgchat-tiny-plays"]["predicted"]["tokens_per_s"] > 0
    assert listing["profile"]["cpu"]["name"]
    assert listing["recommendation_reason"]


@pytest.mark.slow
@pytest.mark.measures
def test_measure_this_machine() -> None:
    """The real measurement (a few seconds): every figure positive and in a plausible range."""
    from dgchat.hub.machine_profile import MATMUL_TYPES, OUTPUT_TYPES, WIDTHS, measure

    seen = []
    profile = measure(progress=lambda f, what: seen.append((f, what)))
    cpu = profile.cpu
    assert set(cpu.matmul) == set(MATMUL_TYPES) and all(set(row) == set(WIDTHS) for row in cpu.matmul.values())
    for qtype, row in cpu.matmul.items():
        assert all(0 < v < 1e-6 for v in row.values()), qtype
        assert row[256] > row[1], qtype  # 256 tokens cost more than one per weight
    assert set(cpu.output) == set(OUTPUT_TYPES)
    for qtype, head in cpu.output.items():  # the LM head's product, for the types heads are stored as
        assert set(head) == set(WIDTHS) and all(0 < v < 1e-6 for v in head.values()) and head[256] > head[1]
    bandwidth = bytes_per_weight("q8_0") / cpu.matmul["q8_0"][1]
    assert 0.5e9 < bandwidth < 2e12
    assert cpu.stats_s_per_logit > 0 and cpu.exact_s_per_mac > 0
    assert seen[-1] == (1.0, "done") and all(a <= b for (a, _), (b, _) in zip(seen, seen[1:]))
    assert not list(profile_path().parent.glob("probe-*"))  # the probe files are gone
