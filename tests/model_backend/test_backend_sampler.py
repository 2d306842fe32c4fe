"""The samplers' vocabulary-wide work on the backend (the engine's diffusion head, patch 0006)
against the numpy samplers, which stay the specification.

- the head's statistics equal `sampling.row_stats` of the very same logits for every filter,
  bias and temperature combination, on a small (bundled model, 16,384 tokens) and a realistic
  (32,768 tokens) vocabulary;
- masked generations (every algorithm, threshold, batched) give the same tokens on both paths;
- DiffusionGemma: with self-conditioning off whole generations give the same tokens; with it on,
  every step of whole generations is checked against the host (statistics, the signal kept for the
  next step, the decoder input built from it), because a ~1e-6 difference in the signal (a matrix
  product summed in another order) may later flip a discrete choice and the generations part;
- the CPU top-k form of the soft embedding against the exact one; `--json` says which path ran;
  the backend path never builds the float32 embedding copy; a stock engine falls back to numpy.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from dgchat.model_backend import llamacpp as L
from dgchat.model_backend import sampling
from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.params import DiffusionParams
from fixtures.backend_oracle import DgStepOracle, OracleReport, compare_stats
# the check scripts set every layer on the device
from fixtures.device import GPU_LAYERS, input_paths_tolerance, offload_backend, tie_share
from fixtures.wide_vocab import write_wide_vocab_gguf

pytestmark = pytest.mark.skipif(not L.engine_info().backend_sampler,
                                reason="needs dgchat's engine with the diffusion head (patch level 3)")

BUNDLED = Path(__file__).resolve().parents[2] / "assets" / "dgchat-tiny-plays.gguf"
PROMPT = "Good evening. Have you a bed for the night?"


@pytest.fixture(scope="module")
def wide_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_wide_vocab_gguf(tmp_path_factory.mktemp("wide") / "llada-32k.gguf", 32768)


@pytest.fixture(scope="module")
def bundled() -> DiffusionEngine:
    engine = load_engine(BUNDLED)
    yield engine
    engine.close()


def _final(engine, prompt, params, **kw) -> FinalEvent:
    events = [e for e in engine.generate(prompt, params, **kw) if isinstance(e, FinalEvent)]
    return events[0]


SPECS = [
    dict(temperature=0.0, top_k=0, top_p=1.0),  # greedy
    dict(temperature=0.8, top_k=0, top_p=1.0),
    dict(temperature=0.7, top_k=40, top_p=1.0, margin=True),
    dict(temperature=1.0, top_k=0, top_p=0.9),
    dict(temperature=0.5, top_k=50, top_p=0.8, margin=True),
    dict(temperature=1.3, top_k=0, top_p=1.0, bias=((3, 2.5), (7, -100.0), (11, -1.5))),
]


@pytest.mark.parametrize("which", ["bundled", "wide"])
@pytest.mark.parametrize("spec", range(len(SPECS)))
def test_head_statistics_equal_the_host_on_the_same_logits(which, spec, wide_gguf) -> None:
    cfg = dict(SPECS[spec])
    bias = cfg.pop("bias", ())
    path = BUNDLED if which == "bundled" else wide_gguf
    model = L.LlamaModel(path, n_gpu_layers=GPU_LAYERS)
    ctx = L.LlamaContext(model, n_ctx=256, max_tokens=128, n_seq_max=2, n_threads=2)
    try:
        ctx.configure_head(L.HeadSetup())
        ctx.set_causal(False)
        rng = np.random.default_rng(spec)
        tokens = rng.integers(0, min(model.n_vocab, 400), 64).astype(np.int32)
        seqs = np.repeat([0, 1], 32).astype(np.int32)
        pos = np.tile(np.arange(32), 2)
        ids, values = np.array([b[0] for b in bias], np.int64), np.array([b[1] for b in bias], np.float32)
        # two sequences with different biases (the second without): two rows of the bias table
        specs = [sampling.SampleSpec(cfg["temperature"], cfg["top_k"], cfg["top_p"],
                                     sampling.draw_uniform(32, cfg["temperature"], rng), cfg.get("margin", False),
                                     bias_ids=b_ids, bias_values=b_vals)
                 for b_ids, b_vals in ((ids, values), (ids[:0], values[:0]))]
        from dgchat.model_backend.logits_source import head_request

        head = head_request(ctx, specs, np.repeat([0, 1], 32), keep_logits=True)
        stats, logits = ctx.decode_tokens(tokens, pos, seq_ids=seqs, outputs=np.arange(64), head=head)
        report = OracleReport()
        for k, part in enumerate(stats.split([32, 32])):
            compare_stats(part, specs[k], np.array(logits[32 * k : 32 * (k + 1)]), report)
        assert report.rows == 64 and report.ties <= 2
        if bias:  # the ban holds on the backend
            assert not np.isin(stats.drawn[:32], [7]).any() and not np.isin(stats.argmax[:32], [7]).any()
    finally:
        ctx.close()
        model.close()


# engine/patches/0011: on a CPU the head runs as one kernel where no top-k/top-p filter applies; with
# DGCHAT_FUSED_HEAD=0 (read when a head is set up) as the graph of separate nodes it replaces
ONE_PASS_SPECS = [
    dict(temperature=0.0, margin=True),
    dict(temperature=0.8),
    dict(temperature=1.3, margin=True, bias=((3, 2.5), (7, -100.0), (11, -1.5))),
    dict(temperature=0.2, bias=((0, -1.0),)),  # cold: many subnormal probabilities, a pad bias
]


def _head_stats_both_ways(monkeypatch, path: Path, spec: dict, n_rows: int = 48):
    cfg = dict(spec)
    bias = cfg.pop("bias", ())
    ids, values = np.array([b[0] for b in bias], np.int64), np.array([b[1] for b in bias], np.float32)
    out = {}
    for fused in ("1", "0"):
        monkeypatch.setenv("DGCHAT_FUSED_HEAD", fused)
        model = L.LlamaModel(path, n_gpu_layers=GPU_LAYERS)
        ctx = L.LlamaContext(model, n_ctx=256, max_tokens=128, n_seq_max=2, n_threads=2)
        try:
            ctx.configure_head(L.HeadSetup())
            ctx.set_causal(False)
            rng = np.random.default_rng(7)
            tokens = rng.integers(0, min(model.n_vocab, 400), n_rows).astype(np.int32)
            specs = [sampling.SampleSpec(cfg["temperature"], 0, 1.0, sampling.draw_uniform(n_rows // 2, cfg["temperature"], rng),
                                         cfg.get("margin", False), bias_ids=b_ids, bias_values=b_vals)
                     for b_ids, b_vals in ((ids, values), (ids[:0], values[:0]))]
            from dgchat.model_backend.logits_source import head_request

            head = head_request(ctx, specs, np.repeat([0, 1], n_rows // 2), keep_logits=True)
            seqs = np.repeat([0, 1], n_rows // 2).astype(np.int32)
            stats, logits = ctx.decode_tokens(tokens, np.tile(np.arange(n_rows // 2), 2), seq_ids=seqs,
                                              outputs=np.arange(n_rows), head=head)
            out[fused] = (stats, np.array(logits), specs)
        finally:
            ctx.close()
            model.close()
    return out["1"], out["0"]


@pytest.mark.skipif(GPU_LAYERS > 0, reason="the one-pass kernel is the CPU's")
@pytest.mark.parametrize("which", ["bundled", "wide"])
@pytest.mark.parametrize("spec", range(len(ONE_PASS_SPECS)))
def test_one_pass_head_gives_the_graphs_numbers(monkeypatch, which, spec, wide_gguf) -> None:
    """The same probabilities and draws as the graph of nodes (bit for bit: the same float arithmetic),
    the entropy to double rounding, and both the host's statistics."""
    path = BUNDLED if which == "bundled" else wide_gguf
    (one, logits, specs), (nodes, logits_n, _) = _head_stats_both_ways(monkeypatch, path, ONE_PASS_SPECS[spec])
    np.testing.assert_array_equal(logits, logits_n)
    np.testing.assert_array_equal(one.drawn, nodes.drawn)
    np.testing.assert_array_equal(one.argmax, nodes.argmax)
    np.testing.assert_array_equal(one.p_drawn, nodes.p_drawn)
    np.testing.assert_array_equal(one.p_argmax, nodes.p_argmax)
    # the graph takes p(second) as p(top 2) - p(argmax), a float difference of numbers up to 1
    np.testing.assert_allclose(one.p_second, nodes.p_second, rtol=1e-6, atol=2 * np.finfo(np.float32).eps)
    np.testing.assert_allclose(one.entropy, nodes.entropy, rtol=1e-5, atol=1e-6)
    # two different computations ran: the kernel sums the entropy in double, the graph in float
    assert np.any(one.entropy != nodes.entropy)
    report = OracleReport()
    half = logits.shape[0] // 2
    for k, part in enumerate(one.split([half, half])):
        compare_stats(part, specs[k], logits[half * k : half * (k + 1)], report)
    assert report.rows == logits.shape[0] and report.ties <= 2


@pytest.mark.skipif(GPU_LAYERS > 0, reason="the one-pass kernel is the CPU's")
def test_one_pass_head_gives_the_same_generations(monkeypatch) -> None:
    """Self-conditioned DiffusionGemma generations are the same tokens, step for step, whichever form
    of the head ran: its probabilities, and so the self-conditioning signal, are the same floats."""
    runs = {}
    for fused in ("1", "0"):
        monkeypatch.setenv("DGCHAT_FUSED_HEAD", fused)
        engine = load_engine(BUNDLED, n_threads=2)
        try:
            prompt = engine.chat_prompt([{"role": "user", "content": PROMPT}])
            runs[fused] = [_final(engine, prompt, DiffusionParams(seed=seed, max_tokens=64, **temps))
                           for seed, temps in ((0, {}), (1, {}), (2, {"t_min": 0.1, "t_max": 0.3}))]
        finally:
            engine.close()
    for a, b in zip(runs["1"], runs["0"]):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        assert a.stats.steps == b.stats.steps and a.stats.sampler_on == "backend"


ALGORITHMS = [
    dict(algorithm="confidence", temperature=0.0),
    dict(algorithm="confidence", temperature=0.8, top_k=40, top_p=0.95),
    dict(algorithm="entropy", temperature=0.5, top_p=0.9),
    dict(algorithm="margin", temperature=0.0),
    dict(algorithm="random", temperature=0.7),
    dict(algorithm="origin", temperature=0.9),
    dict(algorithm="confidence", temperature=0.0, threshold=0.3, block_length=16),
]


@pytest.mark.parametrize("cfg", range(len(ALGORITHMS)))
def test_masked_generations_are_the_same_tokens_on_both_paths(cfg, wide_gguf, llama_nc_gguf) -> None:
    for path in (wide_gguf, llama_nc_gguf):  # no KV memory (llada) and with it (prefix cache)
        with load_engine(path, n_threads=2) as engine:
            prompt = engine.encode("Halt, traveller! None may pass the gate after dark.")
            base = dict(gen_length=32, steps=16, max_tokens=32, seed=cfg + 3, logit_bias=((5, 1.0),),
                        **ALGORITHMS[cfg])
            host = _final(engine, prompt, DiffusionParams(sampler_on="host", **base))
            report = OracleReport()
            engine.step_check = lambda reqs, stats, logits: [
                compare_stats(part, r.sample, np.array(lg), report)
                for r, part, lg in zip(reqs, stats.split([r.rows.size for r in reqs]),
                                       np.split(np.asarray(logits), np.cumsum([r.rows.size for r in reqs])[:-1]))]
            backend = _final(engine, prompt, DiffusionParams(sampler_on="backend", **base))
            assert host.stats.sampler_on == "host" and backend.stats.sampler_on == "backend"
            assert report.rows > 0 and report.ties <= max(1, report.rows // 100)
            if report.ties == 0:  # a float tie at a boundary may part the generations, nothing else
                np.testing.assert_array_equal(backend.tokens, host.tokens)


def test_masked_batch_on_the_backend_matches_single_generations(llama_nc_gguf) -> None:
    """Two sequences decoded together give each the generation it gets alone: the first step's logits
    of each sequence agree to rounding (a batch changes the attention's shapes: 1.2e-3 of logits up to
    ~14 on the CPU with its default f16 cache, 6.7e-6 on lavapipe), and on the CPU backend the tokens
    are the same. A GPU backend picks kernels, tiles and split-k by shape (ggml-vulkan: mul_mat_vec or
    mul_mm, f16 copies of non-contiguous operands): on lavapipe temperature sampling then parts one of
    the two generations after a few steps, which is not checked there."""
    with load_engine(llama_nc_gguf, n_threads=2) as engine:
        first_step: list[list[np.ndarray]] = []  # the first decode's logits, per request

        def keep_first(reqs, stats, logits) -> None:
            if not first_step:
                first_step.append(np.split(np.array(logits), np.cumsum([r.rows.size for r in reqs])[:-1]))

        engine.step_check = keep_first
        prompts = [engine.encode("Halt, traveller!"), engine.encode("Good morrow, friend. The king sleeps.")]
        params = [DiffusionParams(gen_length=32, steps=16, seed=s, temperature=0.6, top_k=30) for s in (1, 2)]
        singles, single_logits = [], []
        for p, q in zip(prompts, params):
            first_step.clear()
            singles.append(_final(engine, p, q).tokens)
            single_logits.append(first_step[0][0])
        first_step.clear()
        batched: dict[int, np.ndarray] = {}
        for i, event in engine.generate_batch(prompts, params):
            if isinstance(event, FinalEvent):
                batched[i] = event.tokens
                assert event.stats.sampler_on == "backend"
        assert len(first_step[0]) == 2  # both sequences in the first decode
        for i in range(2):
            scale = float(np.abs(single_logits[i]).max())
            np.testing.assert_allclose(first_step[0][i], single_logits[i], rtol=0, atol=1e-3 * scale)
            if offload_backend() == "CPU":
                np.testing.assert_array_equal(batched[i], singles[i])


def _without_self_conditioning(engine: DiffusionEngine) -> None:
    sc = engine.selfcond
    engine.selfcond = dataclasses.replace(sc, down=np.zeros_like(sc.down))  # the MLP's output is 0


def test_dg_without_self_conditioning_same_tokens_on_both_paths(bundled, dg_tiny, monkeypatch) -> None:
    """Without self-conditioning both paths sample the same model's logits. On the CPU backend those
    logits are the same bit for bit, so the generations are the same tokens. A GPU backend rounds the
    products' operands (fixtures/device.py, input_paths_tolerance): a draw later flips and the
    generations part (lavapipe: seed 1 parts 13 of 64 tokens), so there every backend step is checked
    against the host sampler on its own logits instead, and the first step's logits of the two paths
    must agree to the rounding."""
    host_first: list[np.ndarray] = []
    decode_embeddings = L.LlamaContext.decode_embeddings

    def keep_first(self, *args, **kwargs):
        out = decode_embeddings(self, *args, **kwargs)
        if not host_first:
            host_first.append(np.array(out, dtype=np.float32, copy=True))
        return out

    monkeypatch.setattr(L.LlamaContext, "decode_embeddings", keep_first)
    on_cpu = offload_backend() == "CPU"
    for engine, seeds in ((bundled, range(6)), (dg_tiny, range(3))):
        saved = engine.selfcond
        _without_self_conditioning(engine)
        try:
            prompt = engine.chat_prompt([{"role": "user", "content": PROMPT}])
            for seed in seeds:
                params = dict(seed=seed, max_tokens=64, logit_bias=((9, 1.5),), pad_bias=-1.0 if seed % 2 else 0.0)
                host_first.clear()
                host = _final(engine, prompt, DiffusionParams(sampler_on="host", **params))
                oracle = DgStepOracle(engine, check_inputs=0)
                backend_first: list[np.ndarray] = []

                def check(source, items, stats, logits, oracle=oracle, backend_first=backend_first) -> None:
                    if not backend_first:
                        backend_first.append(np.array(logits, dtype=np.float32, copy=True))
                    oracle(source, items, stats, logits)

                engine.step_check = None if on_cpu else check
                try:
                    backend = _final(engine, prompt, DiffusionParams(sampler_on="backend", **params))
                finally:
                    engine.step_check = None
                if on_cpu:
                    np.testing.assert_array_equal(backend.tokens, host.tokens, err_msg=f"seed {seed}")
                    assert backend.stats.steps == host.stats.steps
                else:
                    assert oracle.report.steps == backend.stats.steps
                    bound = input_paths_tolerance(float(np.abs(host_first[0]).max()))
                    np.testing.assert_allclose(backend_first[0], host_first[0], rtol=0, atol=bound,
                                               err_msg=f"seed {seed}")
        finally:
            engine.selfcond = saved


@pytest.fixture(scope="module")
def dg_tiny(tmp_path_factory: pytest.TempPathFactory) -> DiffusionEngine:
    pytest.importorskip("torch")
    from fixtures.dg_cache import converted

    engine = load_engine(converted(tmp_path_factory.mktemp("dg-backend"), "sw8"), n_threads=2)
    yield engine
    engine.close()


# the last case runs cold (T 0.3 -> 0.1): many probabilities are float32 subnormals, which both paths
# flush before the soft embedding (engine/patches/0010); the steps must still agree as in the others
# (the flush changes no result, so this checks that it is harmless, not that it happens)
@pytest.mark.parametrize("seed, temps", [(0, {}), (1, {}), (2, {"t_min": 0.1, "t_max": 0.3})])
def test_dg_every_backend_step_is_the_numpy_step(bundled, dg_tiny, seed, temps) -> None:
    for engine in (bundled, dg_tiny):
        oracle = DgStepOracle(engine, check_inputs=3)
        engine.step_check = oracle
        try:
            prompt = engine.chat_prompt([{"role": "user", "content": PROMPT}])
            params = DiffusionParams(seed=seed, max_tokens=96, sampler_on="backend", logit_bias=((9, 1.5),),
                                     pad_bias=-1.5, **temps)
            final = _final(engine, prompt, params)
        finally:
            engine.step_check = None
        report = oracle.report
        assert final.stats.sampler_on == "backend" and final.stats.soft_embedding == "exact"
        assert report.steps == final.stats.steps and report.rows >= final.stats.steps * 8
        if GPU_LAYERS == 0:  # on the CPU the graph's decoder input is numpy's, bit for bit
            assert report.max_input_logit_err == 0.0
        assert report.ties <= max(2, report.rows * tie_share())


def test_dg_batch_every_step_checked(bundled) -> None:
    oracle = DgStepOracle(bundled, check_inputs=2)
    bundled.step_check = oracle
    try:
        prompts = [bundled.chat_prompt([{"role": "user", "content": t}]) for t in (PROMPT, "Who goes there?")]
        params = [DiffusionParams(seed=s, max_tokens=64) for s in (4, 5)]
        finals = [e for _, e in bundled.generate_batch(prompts, params) if isinstance(e, FinalEvent)]
    finally:
        bundled.step_check = None
    assert len(finals) == 2 and oracle.report.rows > 0


def test_soft_embedding_top_k_form_against_the_exact_product(bundled) -> None:
    """The CPU form for large vocabularies (each row's 256 most likely tokens) on a vocabulary small
    enough for the exact product: the signals differ by at most the dropped probability mass times
    the largest embedding row, and less than the exact signal itself."""
    engine = bundled
    model = engine.model
    sc = engine.selfcond
    prompt = engine.chat_prompt([{"role": "user", "content": PROMPT}])
    rng = np.random.default_rng(0)
    canvas = rng.integers(0, model.n_vocab, 32).astype(np.int32)
    u = rng.random(32).astype(np.float32)
    signals = {}
    for k in (None, 256):
        ctx = L.LlamaContext(model, n_ctx=512, max_tokens=128, n_threads=2)
        try:
            ctx.configure_head(engine.head_setup(34, k))
            ctx.set_causal(True)
            ctx.decode_tokens(prompt, np.arange(prompt.size), outputs=[])
            ctx.set_causal(False)
            pos = np.arange(prompt.size, prompt.size + 32)
            slots = np.arange(2, 34, dtype=np.int32)
            stats, logits = ctx.decode_tokens(canvas, pos, head=L.HeadRequest(
                inv_temp=np.full(32, 1 / 0.8, np.float32), uniform=u, sc_write=slots,
                sc_read=np.zeros(32, np.int32), keep_logits=True))
            signals[k] = ctx.read_head_signal(slots)
            processed = np.array(logits) / np.float32(0.8)
        finally:
            ctx.close()
    exact, topk = signals[None], signals[256]
    p = np.exp(processed - processed.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dropped = 1.0 - np.sort(p, axis=1)[:, -256:].sum(1)
    soft_err = np.abs(sc.soft_embeddings(engine.embedding, processed, 256)
                      - sc.soft_embeddings(engine.embedding, processed)).max(1)
    bound = dropped * np.abs(engine.embedding).max() * sc.embed_scale * np.sqrt(model.n_embd)
    assert (soft_err <= bound + 1e-5).all()
    assert 0 < np.abs(topk - exact).max() < np.abs(exact).max()
    # and the numpy top-k form is what the head computes
    np.testing.assert_allclose(topk, sc.signal(sc.soft_embeddings(engine.embedding, processed, 256)),
                               rtol=1e-4, atol=1e-4 * np.abs(exact).max())


def test_backend_path_never_builds_the_float32_embedding() -> None:
    with load_engine(BUNDLED, n_threads=2) as engine:
        prompt = engine.chat_prompt([{"role": "user", "content": PROMPT}])
        final = _final(engine, prompt, DiffusionParams(max_tokens=32))
        assert final.stats.sampler_on == "backend"
        assert engine._embedding is None  # token_embd stays quantized, inside llama.cpp
        _final(engine, prompt, DiffusionParams(max_tokens=8, autoregressive=True))
        assert engine._embedding is None


def test_stock_engine_falls_back_to_numpy(llama_nc_gguf) -> None:
    with load_engine(BUNDLED, n_threads=2) as engine:
        engine.backend_sampler = False  # what a plain PyPI llama-cpp-python reports
        prompt = engine.chat_prompt([{"role": "user", "content": PROMPT}])
        final = _final(engine, prompt, DiffusionParams(max_tokens=32))
        assert final.stats.sampler_on == "host" and final.tokens.size > 0
        with pytest.raises(InvalidParameterError, match="sampler-on backend"):
            engine.resolve(DiffusionParams(sampler_on="backend"))
    with load_engine(llama_nc_gguf, n_threads=2) as engine:
        engine.backend_sampler = False
        final = _final(engine, engine.encode("Halt!"), DiffusionParams(gen_length=16, steps=8))
        assert final.stats.sampler_on == "host"


def test_generate_json_says_where_the_sampler_ran() -> None:
    import contextlib
    import io

    from dgchat.cli import main

    for where in ("backend", "host"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["generate", "-m", str(BUNDLED), "-p", PROMPT, "--json", "--max-tokens", "32",
                       "--sampler-on", where])
        assert rc in (0, None)
        stats = json.loads(buf.getvalue())["stats"]
        assert stats["sampler_on"] == where and stats["soft_embedding"] == "exact"
