"""Placements through the real llama.cpp on this CPU-only build: the CPU path as before, the
tensor-override array accepted (experts kept in RAM change nothing in the logits), and a stated
GPU memory ($DGCHAT_GPU_MEMORY) planned into an experts-in-RAM placement, with the local GPU
simulated (llama.cpp without a GPU device runs every layer on the CPU whatever n_gpu_layers says,
so the tokens must equal the plain load's)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.make_fullshape_dg import TINY, write_fullshape_dg
from dgchat.config import ConfigError, load_config
from dgchat.model_backend import llamacpp
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.llamacpp import offload
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.placement import GiB, ModelBytes, Placement


@pytest.fixture(scope="module")
def dg_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DiffusionGemma of TINY's shape (2 layers, 4 experts top-2): a mixture of experts llama.cpp runs."""
    return write_fullshape_dg(tmp_path_factory.mktemp("placement") / "dg-tiny-q4_0.gguf", **TINY)


def _logits(model: llamacpp.LlamaModel) -> np.ndarray:
    ctx = llamacpp.LlamaContext(model, n_ctx=64, max_tokens=32, n_threads=2)
    try:
        tokens = np.arange(300, 324, dtype=np.int32)
        return np.array(ctx.decode_tokens(tokens, np.arange(tokens.size, dtype=np.int32)), copy=True)
    finally:
        ctx.close()


def _answer(engine) -> FinalEvent:
    prompt = engine.chat_prompt([{"role": "user", "content": "hello there"}])
    params = DiffusionParams(steps=2, gen_length=16, max_tokens=16, early_stop=False, seed=1)
    return [e for e in engine.generate(prompt, params) if isinstance(e, FinalEvent)][0]


def test_overrides_to_the_cpu_are_accepted_and_change_nothing(dg_tiny: Path) -> None:
    header = read_gguf_header(dg_tiny)
    plain = llamacpp.LlamaModel(dg_tiny, header=header)
    try:
        assert plain.placement.mode == "cpu" and plain.placement.gpu_layers == 0 and plain._overrides is None
        expected = _logits(plain)
    finally:
        plain.close()
    kept = Placement("experts-in-ram", 0, (0, 1), 0, 0, 0, "test: every expert to the CPU", 2)
    model = llamacpp.LlamaModel(dg_tiny, header=header, placement=kept)
    try:
        assert model._overrides is not None and len(model._overrides[1]) == 1
        assert model.placement is kept and model.n_gpu_layers == 0 and not model.output_on_gpu
        log = "\n".join(llamacpp.recent_log(4000))
        # llama.cpp matched the pattern against the expert tensors of both layers, nothing else
        for name in ("blk.0.ffn_gate_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_down_exps.scale"):
            assert re.search(rf"tensor {re.escape(name)} \(.*\) buffer type overridden to CPU", log), name
        assert "tensor blk.0.attn_q.weight (" not in log
        np.testing.assert_array_equal(_logits(model), expected)
    finally:
        model.close()


def _simulate_gpu(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(offload, "local_gpu_present", lambda: True)
    monkeypatch.setattr(offload, "local_gpu_devices",
                        lambda: [llamacpp.BackendDevice("GPU0", "simulated", free, free)])


def test_stated_gpu_memory_keeps_the_first_layers_experts_in_ram(dg_tiny: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with load_engine(dg_tiny, n_threads=2) as engine:
        assert engine.placement.mode == "cpu" and engine.placement.reason == "no GPU to offload to"
        expected = _answer(engine)

    _simulate_gpu(monkeypatch, 64 * GiB)
    monkeypatch.setenv(offload.GPU_MEMORY_ENV, "8G")
    with load_engine(dg_tiny, n_threads=2) as engine:
        whole = engine.placement
        assert (whole.mode, whole.gpu_layers, whole.gpu_free) == ("gpu", 3, 8 * GiB)
    # a device that holds everything but layer 0's experts: the plan keeps exactly those in RAM
    model_bytes = ModelBytes.from_header(read_gguf_header(dg_tiny))
    need = whole.gpu_bytes - model_bytes.layers[0].experts
    free = need + 2  # a stated limit is what the plan may use: no margin is kept off it
    monkeypatch.setenv(offload.GPU_MEMORY_ENV, str(free))
    with load_engine(dg_tiny, n_threads=2) as engine:
        placement = engine.placement
        assert (placement.mode, placement.gpu_layers, placement.experts_in_ram) == ("experts-in-ram", 3, (0,))
        assert placement.gpu_bytes == need and placement.gpu_free == free
        assert engine.model._overrides is not None
        got = _answer(engine)
    np.testing.assert_array_equal(got.tokens, expected.tokens)

    # --experts-on cpu: every layer's experts, whatever fits
    monkeypatch.setenv(offload.GPU_MEMORY_ENV, "8G")
    with load_engine(dg_tiny, n_threads=2, experts_on="cpu") as engine:
        assert engine.placement.experts_in_ram == (0, 1)
        np.testing.assert_array_equal(_answer(engine).tokens, expected.tokens)
    # --gpu-layers 2: the output layer and the last layer
    with load_engine(dg_tiny, n_threads=2, n_gpu_layers=2) as engine:
        assert (engine.placement.mode, engine.placement.layers_on_gpu) == ("layers-split", 1)
        assert engine.model.n_gpu_layers == 2


def test_a_bad_memory_limit_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(offload.GPU_MEMORY_ENV, "lots")
    with pytest.raises(InvalidParameterError, match=r"\$DGCHAT_GPU_MEMORY: 'lots' is not a memory size"):
        offload.gpu_free_memory()
    with pytest.raises(InvalidParameterError, match="experts_on"):
        load_engine("unused.gguf", experts_on="ram")


def test_rpc_servers_keep_every_layer_offloaded(dg_tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offload.rpc_probe, "registered", lambda: ["a server"])
    placement = offload.decide_placement(read_gguf_header(dg_tiny))
    assert (placement.mode, placement.gpu_layers, placement.overrides()) == ("gpu", 999, [])
    assert "RPC servers" in placement.reason


def _dgchat(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgchat", *args], capture_output=True, text=True, timeout=300,
                          env=os.environ | (env or {}))


def test_generate_json_reports_the_placement(llada_gguf: Path) -> None:
    args = ("generate", "-m", str(llada_gguf), "-p", "hi", "--gen-length", "8", "--steps", "2", "--json")
    res = _dgchat(*args)
    assert res.returncode == 0, res.stderr
    placement = json.loads(res.stdout)["placement"]
    assert placement["mode"] == "cpu" and placement["gpu_layers"] == 0 and placement["experts_in_ram"] == []
    assert placement["gpu_bytes"] == 0 and placement["ram_bytes"] > 0 and placement["gpu_free"] == 0
    # the older flag still parses, the new ones too
    res = _dgchat(*args, "--n-gpu-layers", "4", "--experts-on", "cpu")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["placement"]["mode"] == "cpu"  # no GPU here
    res = _dgchat(*args, "--gpu-layers", "-1")
    assert res.returncode == 2 and "must be a whole number >= 0" in res.stderr
    res = _dgchat(*args, env={"DGCHAT_GPU_MEMORY": "2x"})
    assert res.returncode != 0 and "DGCHAT_GPU_MEMORY" in res.stderr


def test_config_engine_table(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[engine]\ngpu_layers = 12\nexperts_on = "cpu"\n')
    config = load_config(path)
    assert (config.n_gpu_layers, config.experts_on) == (12, "cpu")
    path.write_text('n_gpu_layers = 12\n[engine]\ngpu_layers = 12\n')
    assert load_config(path).n_gpu_layers == 12
    for text, message in (('[engine]\nexperts_on = "ram"\n', "experts_on must be one of auto, cpu, gpu"),
                          ('[engine]\ngpu_layers = -2\n', "gpu_layers must be an integer >= 0"),
                          ('n_gpu_layers = 3\n[engine]\ngpu_layers = 4\n', "disagree")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(path)
