"""model_backend/placement.py: where the weights go for a GPU's free memory, from a header or a
catalog shape, without llama.cpp.

Memory sizes are GiB (8 GiB = 8 x 2^30 bytes), the free memory the plan is given. The MoE cases are
DiffusionGemma 26B-A4B: its full tensor list as tests/bench/make_fullshape_dg.py writes it (30
layers, 128 experts of width 704, top-8; Q4_0 with a Q6_K token embedding, 14.4 GB), read from a
header-only (sparse) file, and the catalog's Q4_K_M entry (16.9 GB) estimated from its shape. The
dense case is the catalog's LLaDA 8B Q4_K_M (5.1 GB; no KV cache in llama.cpp for LLaDA)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.gguf_file import GgufHeader, read_gguf_header
from dgchat.model_backend.placement import (
    DEFAULT_MARGIN,
    HEAD_EMBD_T_F32_BYTES,
    RESERVE_BYTES,
    GiB,
    LayerBytes,
    ModelBytes,
    Placement,
    parse_bytes,
    pattern_matches,
    plan_placement,
    runtime_bytes,
    runtime_from_header,
)
from fixtures.fullshape_header import write_fullshape_header

DG_SHAPE = dict(n_layer=30, n_embd=2816, n_vocab=262144, n_head=16, head_dim=256, n_head_kv=8, n_ff=2112,
                n_expert=128, n_ff_expert=704)
DG_RUNTIME = dict(n_ctx=8192, n_layer=30, n_head_kv=8, head_dim=256, n_vocab=262144, n_embd=2816, canvas=256,
                  n_head=16, n_layer_swa=25, sliding_window=1024, n_head_kv_full=2, head_dim_full=512,
                  self_cond_inter=2112)
Q4_0 = 18 / 32  # bytes per weight: a 32-weight block is 2 bytes of scale + 16 of nibbles
Q6_K = 210 / 256


@pytest.fixture(scope="module")
def dg_header(tmp_path_factory: pytest.TempPathFactory) -> GgufHeader:
    return read_gguf_header(write_fullshape_header(tmp_path_factory.mktemp("placement") / "dg-fullshape.gguf"))


@pytest.fixture(scope="module")
def dg(dg_header: GgufHeader) -> ModelBytes:
    return ModelBytes.from_header(dg_header)


@pytest.fixture(scope="module")
def dg_runtime(dg_header: GgufHeader) -> int:
    return runtime_from_header(dg_header, n_ctx=8192, canvas=256)


def dg_catalog() -> ModelBytes:
    return ModelBytes.from_shape(file_size=16_900_000_000, **DG_SHAPE)


def llada_8b() -> tuple[ModelBytes, int]:
    model = ModelBytes.from_shape(n_layer=32, n_embd=4096, n_vocab=126464, file_size=5_100_000_000, n_head=32,
                                  head_dim=128, n_head_kv=32, n_ff=12288, tied=False)
    runtime = runtime_bytes(n_ctx=4096, n_layer=32, n_head_kv=32, head_dim=128, n_vocab=126464, n_embd=4096,
                            canvas=128, n_head=32, kv_bytes_per_value=0)
    return model, runtime


def budget(gib: float) -> int:
    return int(gib * GiB * (1 - DEFAULT_MARGIN)) - RESERVE_BYTES


def gpu_weights(model: ModelBytes, p: Placement, runtime: int) -> int:
    """The GPU bytes of a placement, counted here from its fields, independently of the planner."""
    if p.mode == "cpu":
        return 0
    first = model.n_layer + 1 - p.gpu_layers
    total = runtime + model.output + model.other
    for i, layer in enumerate(model.layers):
        if i >= first:
            total += layer.dense + (0 if i in p.experts_in_ram else layer.experts)
    return total


# -- sizes -------------------------------------------------------------------------------------------
def test_sizes_from_the_full_shape_header(dg: ModelBytes, dg_header: GgufHeader) -> None:
    assert dg.n_layer == 30 and dg.is_moe and dg.output_copy == dg.token_embedding
    # ffn_gate_up_exps + ffn_down_exps (Q4_0) + ffn_down_exps.scale (f32, one per expert)
    per_layer_experts = 128 * (2816 * 2 * 704 + 704 * 2816) * Q4_0 + 128 * 4
    assert all(layer.experts == per_layer_experts for layer in dg.layers)
    assert all(0 < layer.dense < layer.experts / 10 for layer in dg.layers)  # attention + dense MLP + router
    embedding = 262144 * 2816 * Q6_K
    assert dg.token_embedding == embedding
    assert dg.output == embedding + 2816 * 4  # the tied LM head (llama.cpp's copy) + output_norm (f32)
    assert dg.other == 256 * 4  # rope_freqs (f32, head_dim_full / 2): llama.cpp duplicates it into every layer
    # every tensor counted once (the tied head is the same bytes in the file)
    assert dg.weights == sum(t.nbytes for t in dg_header.tensors.values())
    # full-attention layers (every 6th) have the larger attention
    assert dg.layers[5].dense > dg.layers[0].dense == dg.layers[1].dense


def test_the_catalog_shape_estimate_agrees_with_the_header(dg: ModelBytes) -> None:
    estimate = ModelBytes.from_shape(file_size=dg.weights, **DG_SHAPE)
    assert estimate.weights == pytest.approx(dg.weights, rel=1e-6)
    assert estimate.experts == pytest.approx(dg.experts, rel=0.03)
    assert sum(layer.dense for layer in estimate.layers) == pytest.approx(sum(layer.dense for layer in dg.layers),
                                                                          rel=0.1)


def test_runtime_formula(dg_runtime: int) -> None:
    # the header's facts give the same buffers as the catalog's shape
    assert dg_runtime == runtime_bytes(**DG_RUNTIME)
    kv = 2 * 2 * (5 * 2 * 512 * 8192 + 25 * 8 * 256 * (1024 + 256))  # full layers + sliding (window + canvas)
    logits = 4 * 256 * 262144 * 4  # 1 GiB: the catalog's extra_bytes
    activations = 256 * 4 * (16 * 8192 + 16 * 2816)
    head = 262144 * 2816 * 2 + 3 * 2112 * 2816 * 4  # E^T in f16 (over HEAD_EMBD_T_F32_BYTES) + the MLP in f32
    assert dg_runtime == kv + logits + activations + head
    assert runtime_bytes(**(DG_RUNTIME | {"kv_bytes_per_value": 4})) == dg_runtime + kv  # --precise: f32 KV


def test_the_head_threshold_is_the_engines() -> None:
    from dgchat.model_backend.diffusion_gemma import EMBD_T_F32_BYTES

    assert HEAD_EMBD_T_F32_BYTES == EMBD_T_F32_BYTES


# -- the plan at 8, 12, 16, 24, 80 GiB -------------------------------------------------------------
# (GiB free, mode, layers whose experts stay in RAM): the header's file (14.4 GB, Q4_0) and the
# catalog's Q4_K_M (16.9 GB), with 8192 tokens of context and a 256-token canvas (3.0 GiB of buffers,
# 1.4 GiB of it the exact self-conditioning's transposed embedding)
HEADER_PLANS = [(80, "gpu", 0), (24, "gpu", 0), (16, "experts-in-ram", 5), (12, "experts-in-ram", 14),
                (8, "experts-in-ram", 24)]
CATALOG_PLANS = [(80, "gpu", 0), (24, "gpu", 0), (16, "experts-in-ram", 9), (12, "experts-in-ram", 17),
                 (8, "experts-in-ram", 25)]


def _check_moe_plan(model: ModelBytes, runtime: int, gib: int, mode: str, k: int) -> Placement:
    p = plan_placement(model, gpu_free=gib * GiB, runtime=runtime)
    assert (p.mode, len(p.experts_in_ram)) == (mode, k)
    assert p.gpu_layers == 31 and p.layers_on_gpu == 30  # every layer and the output layer
    assert p.experts_in_ram == tuple(range(k))  # the FIRST layers' experts, as llama.cpp's --n-cpu-moe
    assert p.gpu_bytes == gpu_weights(model, p, runtime) <= budget(gib)
    if k:  # the fewest: one layer fewer does not fit
        fewer = Placement(p.mode, 31, tuple(range(k - 1)), 0, 0, 0, "", 30)
        assert gpu_weights(model, fewer, runtime) > budget(gib)
    # every weight is somewhere: RAM holds the token embedding and the experts kept there
    assert p.ram_bytes == model.token_embedding + sum(model.layers[i].experts for i in p.experts_in_ram)
    assert p.gpu_free == gib * GiB
    return p


@pytest.mark.parametrize("gib, mode, k", HEADER_PLANS)
def test_diffusion_gemma_header(dg: ModelBytes, dg_runtime: int, gib: int, mode: str, k: int) -> None:
    _check_moe_plan(dg, dg_runtime, gib, mode, k)


@pytest.mark.parametrize("gib, mode, k", CATALOG_PLANS)
def test_diffusion_gemma_catalog_q4_k_m(gib: int, mode: str, k: int) -> None:
    p = _check_moe_plan(dg_catalog(), runtime_bytes(**DG_RUNTIME), gib, mode, k)
    if mode == "gpu":
        assert p.reason.startswith("fits: ")
    else:
        assert p.reason == f"fits with experts of {k} of 30 layers in RAM ({gib}.0 GiB free)"


def test_smaller_cards_split_layers_or_fall_back_to_the_cpu(dg: ModelBytes, dg_runtime: int) -> None:
    # 6 GiB: still every layer, 28 layers' experts in RAM
    assert plan_placement(dg, gpu_free=6 * GiB, runtime=dg_runtime).experts_in_ram == tuple(range(28))
    # 4 GiB: the buffers and the LM head alone (3.6 GiB) do not fit the 3.5 GiB budget
    p = plan_placement(dg, gpu_free=4 * GiB, runtime=dg_runtime)
    assert (p.mode, p.gpu_layers, p.gpu_bytes) == ("cpu", 0, 0) and "not even the output layer" in p.reason
    # with small buffers (a short context, top-k self-conditioning): a layers split, every layer's
    # experts in RAM and the last layers' rest on the GPU
    small = 256 << 20
    p = plan_placement(dg, gpu_free=int(1.5 * GiB), runtime=small)
    assert p.mode == "layers-split" and 0 < p.layers_on_gpu < 30
    assert p.experts_in_ram == tuple(range(30 - p.layers_on_gpu, 30))
    assert p.gpu_bytes == gpu_weights(dg, p, small) <= budget(1.5)
    more = Placement(p.mode, p.gpu_layers + 1, tuple(range(29 - p.layers_on_gpu, 30)), 0, 0, 0, "", 30)
    assert gpu_weights(dg, more, small) > budget(1.5)  # one layer more does not fit
    assert p.reason == f"{p.layers_on_gpu} of 30 layers on the GPU, with every layer's experts in RAM (1.5 GiB free)"


@pytest.mark.parametrize("gib, mode, layers", [(80, "gpu", 32), (24, "gpu", 32), (16, "gpu", 32), (12, "gpu", 32),
                                               (8, "gpu", 32), (4, "layers-split", 22), (1, "cpu", 0)])
def test_dense_8b(gib: int, mode: str, layers: int) -> None:
    model, runtime = llada_8b()
    p = plan_placement(model, gpu_free=gib * GiB, runtime=runtime)
    assert (p.mode, p.layers_on_gpu, p.experts_in_ram) == (mode, layers, ())
    assert p.overrides() == []
    assert p.gpu_bytes == gpu_weights(model, p, runtime)
    if mode != "cpu":
        assert p.gpu_bytes <= budget(gib)
    if mode == "layers-split":  # the last layers, and no more than fit
        assert p.gpu_layers == layers + 1
        more = Placement(p.mode, p.gpu_layers + 1, (), 0, 0, 0, "", 32)
        assert gpu_weights(model, more, runtime) > budget(gib)


# -- overrides --------------------------------------------------------------------------------------
def test_forced_settings(dg: ModelBytes, dg_runtime: int) -> None:
    p = plan_placement(dg, gpu_free=80 * GiB, runtime=dg_runtime, experts_on="cpu")
    assert (p.mode, p.gpu_layers, p.experts_in_ram) == ("experts-in-ram", 31, tuple(range(30)))
    assert p.reason == "--experts-on cpu: the experts of all 30 layers in RAM"
    # experts_on gpu: no expert in RAM, whole layers split instead
    p = plan_placement(dg, gpu_free=12 * GiB, runtime=dg_runtime, experts_on="gpu")
    assert p.mode == "layers-split" and p.experts_in_ram == () and 0 < p.layers_on_gpu < 30
    assert p.gpu_bytes <= budget(12)
    # --gpu-layers N: llama.cpp's count (output layer, then the last N-1)
    p = plan_placement(dg, gpu_free=80 * GiB, runtime=dg_runtime, gpu_layers=10)
    assert (p.mode, p.gpu_layers, p.layers_on_gpu, p.reason) == ("layers-split", 10, 9, "--gpu-layers 10")
    p = plan_placement(dg, gpu_free=12 * GiB, runtime=dg_runtime, gpu_layers=999)  # auto still keeps it fitting
    assert (p.mode, p.gpu_layers, len(p.experts_in_ram)) == ("experts-in-ram", 31, 14)
    assert p.reason == "--gpu-layers 999, experts of 14 layers in RAM to fit"
    p = plan_placement(dg, gpu_free=12 * GiB, runtime=dg_runtime, gpu_layers=999, experts_on="gpu")
    assert (p.mode, p.experts_in_ram) == ("gpu", ()) and "needs" in p.reason  # as asked, even if it does not fit
    p = plan_placement(dg, gpu_free=80 * GiB, runtime=dg_runtime, gpu_layers=5, experts_on="cpu")
    assert p.experts_in_ram == (26, 27, 28, 29) and p.gpu_layers == 5
    assert plan_placement(dg, gpu_free=80 * GiB, runtime=dg_runtime, gpu_layers=0).mode == "cpu"


def test_no_gpu_is_the_cpu(dg: ModelBytes, dg_runtime: int) -> None:
    for kwargs in ({}, {"gpu_layers": 20}, {"experts_on": "cpu"}):
        p = plan_placement(dg, gpu_free=0, runtime=dg_runtime, **kwargs)
        assert (p.mode, p.gpu_layers, p.experts_in_ram, p.gpu_bytes, p.gpu_free) == ("cpu", 0, (), 0, 0)
        assert p.ram_bytes == dg.weights and p.overrides() == []
    with pytest.raises(InvalidParameterError):
        plan_placement(dg, gpu_free=GiB, runtime=0, experts_on="ram")
    with pytest.raises(InvalidParameterError):
        plan_placement(dg, gpu_free=GiB, runtime=0, gpu_layers=-1)


def test_override_patterns_match_exactly_the_experts_kept(dg: ModelBytes, dg_header: GgufHeader,
                                                          dg_runtime: int) -> None:
    p = plan_placement(dg, gpu_free=12 * GiB, runtime=dg_runtime)
    patterns = p.overrides()
    assert len(patterns) == 1  # one run of layers, one pattern
    matched = {name for name in dg_header.tensors if any(pattern_matches(pat, name) for pat in patterns)}
    kept = {name for name in dg_header.tensors
            if re.match(r"blk\.(\d+)\.ffn_(gate_up|down)_exps\.", name) and int(name.split(".")[1]) < 14}
    assert matched == kept and len(kept) == 14 * 3  # gate_up weight, down weight and down scale per layer
    # runs: one pattern each; blk.1 never matches blk.10
    split = Placement("experts-in-ram", 31, (0, 1, 2, 10, 11), 0, 0, GiB, "", 30)
    assert len(split.overrides()) == 2
    assert not any(pattern_matches(pat, "blk.12.ffn_down_exps.weight") for pat in split.overrides())
    assert not any(pattern_matches(pat, "blk.1.ffn_gate_inp.weight") for pat in split.overrides())
    assert not any(pattern_matches(pat, "blk.1.ffn_gate_shexp.weight") for pat in split.overrides())
    assert any(pattern_matches(pat, "blk.1.ffn_up_exps.weight") for pat in split.overrides())
    assert any(pattern_matches(pat, "blk.11.ffn_gate_exps.bias") for pat in split.overrides())


def test_summary_and_json(dg: ModelBytes, dg_runtime: int) -> None:
    p = plan_placement(dg, gpu_free=12 * GiB, runtime=dg_runtime)
    assert re.fullmatch(r"GPU \d+\.\d GiB \(30 of 30 layers, experts of 14 layers in RAM\) · RAM \d+\.\d GiB",
                        p.summary())
    data = p.as_json()
    assert data["mode"] == "experts-in-ram" and data["gpu_layers"] == 31 and data["experts_in_ram"] == list(range(14))
    assert data["gpu_bytes"] == p.gpu_bytes and data["ram_bytes"] == p.ram_bytes and data["gpu_free"] == 12 * GiB
    cpu = plan_placement(dg, gpu_free=0, runtime=dg_runtime)
    assert cpu.summary().startswith("CPU only · RAM ") and "no GPU" in cpu.summary()


def test_from_header_on_a_dense_model_without_layers_named() -> None:
    model = ModelBytes(layers=(LayerBytes(100, 0),) * 4, token_embedding=50, output=60)
    p = plan_placement(model, gpu_free=RESERVE_BYTES * 2, runtime=0)
    assert p.mode == "gpu" and p.gpu_bytes == 460 and p.ram_bytes == 50


@pytest.mark.parametrize("text, value", [("2G", 2 * GiB), ("2GiB", 2 * GiB), ("1.5g", int(1.5 * GiB)),
                                         ("2048M", 2 * GiB), ("8000000000", 8_000_000_000), (" 12 GB ", 12 * GiB)])
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "2x", "-1G", "G", "1.2.3G"])
def test_parse_bytes_refuses(text: str) -> None:
    with pytest.raises(InvalidParameterError):
        parse_bytes(text)


def test_fixture_file_is_sparse(dg_header: GgufHeader) -> None:
    path = Path(dg_header.path)
    assert path.stat().st_size > 14e9 and path.stat().st_blocks * 512 < 200e6
