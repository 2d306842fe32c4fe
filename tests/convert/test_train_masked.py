"""The masked-diffusion sibling's recipe (convert/default_model/train_masked.py, issue 13): its LLaDA-layout model,
the LLaDA SFT masking, training/resume, and export -> `dgchat convert --cache-capable` -> engine.

Everything runs on tiny models (hidden 64, 2 layers, a 300-entry tokenizer trained on two
synthetic plays) at one torch thread."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from dgchat.convert.default_model import default_tokenizer as dtok
from dgchat.convert.default_model import train_default as td
from dgchat.convert.default_model import train_masked as tm
from dgchat.model_backend.errors import DgchatError
from fixtures.convert_reference import llada_logits
from fixtures.recipe_samples import tiny_recipe_data, tiny_text_arch

torch = pytest.importorskip("torch")

TINY = tm.MaskedArch(vocab_size=300, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden_size=96,
                     max_sequence_length=512)
# init_std 0.15: logits of a few units, so the GGUF comparison is not between near-zero numbers
TINY_EXPORT = replace(TINY, init_std=0.15)
TINY_STEPS = {"steps": 6, "batch_size": 2, "warmup_steps": 2, "eval_every": 3, "ckpt_every": 3, "log_every": 1,
              "eval_batches": 1, "answer_length": 48}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_recipe_data(tmp_path_factory.mktemp("masked_data"))


def _train(data: Path, run: Path, arch: tm.MaskedArch = TINY, **kw):
    return tm.train(data, run, threads=1, overrides={**TINY_STEPS, **kw.pop("overrides", {})}, arch=arch,
                    precision="fp32", **kw)


def _weights64(model) -> dict[str, np.ndarray]:
    return {k: v.detach().double().numpy() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# The model


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_forward_is_llada_modeling_code_bidirectional(tied: bool) -> None:
    """Same logits as the numpy forward written from GSAI-ML's modeling_llada.py, on the checkpoint
    names of config.json; every position sees every other one."""
    arch = replace(TINY, weight_tying=tied, init_std=0.15)
    model = tm.build_model(arch, seed=3).eval()
    with torch.no_grad():  # norms off their identity init, so a misplaced norm cannot hide
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    names = set(model.state_dict())
    P = "model.transformer."
    assert {P + "wte.weight", P + "ln_f.weight", P + "blocks.1.q_proj.weight", P + "blocks.1.ff_out.weight",
            P + "blocks.0.up_proj.weight", P + "blocks.0.attn_out.weight"} <= names
    assert (P + "ff_out.weight" in names) == (not tied)
    tokens = np.array([2, 3, 40, 77, 120, 5, 5, 5, 5, 9, 250, 4], dtype=np.int64)
    with torch.no_grad():
        ours = model.logits(model(torch.tensor(tokens)[None]))[0].double().numpy()
    ref = llada_logits(tm.llada_config(arch), _weights64(model), tokens)
    assert np.abs(ref).max() > 2
    assert np.abs(ours - ref).max() < 1e-4
    # bidirectional: changing the last token changes the first position's logits
    changed = tokens.copy()
    changed[-1] = 100
    with torch.no_grad():
        other = model.logits(model(torch.tensor(changed)[None]))[0].double().numpy()
    assert np.abs(other[0] - ours[0]).max() > 1e-3


def test_padding_mask_hides_padding() -> None:
    model = tm.build_model(replace(TINY, init_std=0.15), seed=0).eval()
    short = torch.tensor([[2, 3, 50, 60, 5, 5, 4]])
    padded = torch.cat([short, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    mask = torch.arange(padded.shape[1])[None] < short.shape[1]
    with torch.no_grad():
        alone = model(short)
        batched = model(padded, attention_mask=mask)
        unmasked = model(padded)
    torch.testing.assert_close(batched[:, :7], alone, atol=1e-5, rtol=1e-4)
    assert (unmasked[:, :7] - alone).abs().max() > 1e-3  # the padding would leak without the mask


# ---------------------------------------------------------------------------------------------
# Batches, masking, loss


def test_batch_layout_prompt_answer_fill(tiny_data: Path) -> None:
    data = td.Windows(tiny_data / "train.npz")
    idx = np.arange(len(data))
    batch = tm.make_batch(data, idx, 48, np.random.default_rng(0))
    again = tm.make_batch(data, idx, 48, np.random.default_rng(0))
    assert all(np.array_equal(batch[k], again[k]) for k in batch)  # a function of the rng
    for b, i in enumerate(idx):
        ids, spans = data.ids(i), data.spans(i)
        n = int(batch["valid"][b].sum())
        start = int(np.argmax(batch["answer"][b]))
        assert start in spans[:, 0]
        end = int(spans[spans[:, 0] == start][0, 1])
        row = batch["ids"][b]
        # prompt: the window up to the answer's body (its header included), as rendered for generation
        assert np.array_equal(row[:start], ids[:start]) and row[start - 1] == ids[start - 1]
        assert np.array_equal(row[start:end + 1], ids[start:end + 1]) and row[end] == dtok.END_OF_TURN
        assert (row[end + 1:n] == tm.FILL).all() and (row[n:] == dtok.PAD).all()
        assert n - start <= max(48, end + 1 - start) and batch["answer_len"][b] == n - start
        assert np.array_equal(np.flatnonzero(batch["text"][b]), np.arange(start, end + 1))
        assert not batch["answer"][b, :start].any() and batch["answer"][b, start:n].all()
    # fills vary: the model must learn to end answers before a canvas's end, at any canvas length
    fills = [tm.make_batch(data, idx[:1], 48, np.random.default_rng(s))["answer_len"][0] for s in range(12)]
    assert len(set(fills)) > 3


def test_pretraining_rows_take_whole_windows(tiny_data: Path) -> None:
    data = td.Windows(tiny_data / "train.npz")
    idx = np.arange(len(data))
    whole = tm.make_batch(data, idx, 48, np.random.default_rng(0), pretrain_share=1.0)
    for b, i in enumerate(idx):
        ids = data.ids(i)
        n = int(whole["valid"][b].sum())
        assert n == len(ids) and np.array_equal(whole["ids"][b, :n], ids)  # no fill: the window as it is
        assert not whole["answer"][b, 0] and whole["answer"][b, 1:n].all()  # all but <bos> maskable
        assert whole["answer_len"][b] == n - 1
    # share 0 draws nothing extra: the batches of a run without pre-training rows are unchanged
    plain = tm.make_batch(data, idx, 48, np.random.default_rng(3))
    zero = tm.make_batch(data, idx, 48, np.random.default_rng(3), pretrain_share=0.0)
    assert all(np.array_equal(plain[k], zero[k]) for k in plain)
    rows = [tm.make_batch(data, idx[:1], 48, np.random.default_rng(s), pretrain_share=0.5)["answer"][0, 1]
            for s in range(40)]
    assert 5 < sum(rows) < 35  # about half the draws are whole windows (position 1 is maskable)


def test_masking_never_touches_the_prompt_and_follows_t(tiny_data: Path) -> None:
    data = td.Windows(tiny_data / "train.npz")
    idx = np.resize(np.arange(len(data)), 64)
    batch = tm.make_batch(data, idx, 48, np.random.default_rng(1))
    answer = torch.as_tensor(batch["answer"])
    gen = torch.Generator().manual_seed(0)
    p, masked = tm.draw_noise(batch, gen, eps=1e-3)
    assert not (masked & ~answer).any()  # prompt and padding never masked
    share = masked.sum(1) / answer.sum(1)
    assert float((share - p).abs().mean()) < 0.08  # each sequence's masked share is its own p
    assert float(torch.corrcoef(torch.stack([share, p]))[0, 1]) > 0.9
    assert float(p.min()) >= 1e-3 and float(p.max()) <= 1.0
    for t in (0.3, 1.0):
        p, masked = tm.draw_noise(batch, torch.Generator().manual_seed(1), eps=1e-3, t_fixed=t)
        assert not (masked & ~answer).any()
        assert abs(float(masked.sum() / answer.sum()) - (1e-3 + (1 - 1e-3) * t)) < 0.03


def test_loss_is_llada_sft_weighting(tiny_data: Path) -> None:
    """sum over masked tokens of CE / p, per sequence divided by its answer length, mean over sequences."""
    import torch.nn.functional as F

    data = td.Windows(tiny_data / "train.npz")
    batch = tm.make_batch(data, np.arange(min(3, len(data))), 48, np.random.default_rng(2))
    p, masked = tm.draw_noise(batch, torch.Generator().manual_seed(2), eps=1e-3)
    model = tm.build_model(replace(TINY, init_std=0.15), seed=1).eval()
    with torch.no_grad():
        loss, info = tm.masked_losses(model, batch, p, masked, "cpu")
        ids = torch.as_tensor(batch["ids"])
        expect = 0.0
        for b in range(ids.shape[0]):
            n = int(batch["valid"][b].sum())
            noisy = torch.where(masked[b, :n], dtok.MASK, ids[b, :n])
            ce = F.cross_entropy(model.logits(model(noisy[None]))[0], ids[b, :n], reduction="none")
            expect += float((ce[masked[b, :n]] / p[b]).sum()) / int(batch["answer_len"][b])
        expect /= ids.shape[0]
    assert info["masked"] == int(masked.sum()) > 0
    assert abs(float(loss) - expect) < 1e-4 * max(1.0, expect)


# ---------------------------------------------------------------------------------------------
# Training, resume, export, conversion, generation


@pytest.fixture(scope="module")
def trained_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("masked_run") / "full"
    torch.set_num_threads(1)
    state = _train(tiny_data, run, arch=TINY_EXPORT)
    assert state["step"] == 6
    return run


def test_training_logs_checkpoints_and_resumes_exactly(tiny_data: Path, trained_run: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    log = [json.loads(line) for line in (trained_run / "log.jsonl").read_text().splitlines()]
    assert {"start", "train", "val", "done"} <= {r["kind"] for r in log}
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in log if r["kind"] == "train")
    val = [r for r in log if r["kind"] == "val"]
    assert [r["step"] for r in val] == [3, 6]
    assert {"t05", "t05_text", "t1", "t1_text"} <= set(val[0])
    assert not list((trained_run / "checkpoints").glob("*.tmp*"))

    # stopped after one step (as --max-minutes does), then resumed: the uninterrupted run's weights
    part = tmp_path / "part"
    state = _train(tiny_data, part, arch=TINY_EXPORT, max_minutes=0.0)
    assert state["step"] == 1 and (part / "checkpoints" / "latest").read_text().strip() == "step-0000001"
    assert _train(tiny_data, part, arch=TINY_EXPORT)["step"] == 6
    a = load_file(str(trained_run / "checkpoints" / "step-0000006" / "model.safetensors"))
    b = load_file(str(part / "checkpoints" / "step-0000006" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)
    with pytest.raises(DgchatError, match="different settings"):
        _train(tiny_data, part, arch=TINY_EXPORT, overrides={"lr": 1.0})


def test_loss_goes_down_on_a_repeated_tiny_dataset(tiny_data: Path, tmp_path: Path) -> None:
    """20 steps over the same few windows: the fixed-noise masked loss on them falls well below its start."""
    s = replace(tm.MaskedTrain(), **{**TINY_STEPS, "eval_batches": 4})
    train_windows = td.Windows(tiny_data / "train.npz")
    before = tm.evaluate(tm.build_model(TINY, s.seed), train_windows, s, "cpu")
    run = tmp_path / "fit"
    _train(tiny_data, run, overrides={"steps": 20, "lr": 1e-2, "eval_every": 20, "ckpt_every": 20})
    model = tm.build_model(TINY)
    td.load_checkpoint(td.latest_checkpoint(run), model)
    after = tm.evaluate(model, train_windows, s, "cpu")
    assert before["t05"] > np.log(300) - 0.5  # starts near uniform over the vocabulary
    assert after["t05"] < before["t05"] - 1.0 and after["t1"] < before["t1"] - 1.0, (before, after)
    assert after["t05_text"] < before["t05_text"] - 0.5, (before, after)  # the words, not only the <eos> fill


@pytest.fixture(scope="module")
def exported(trained_run: Path, tiny_data: Path) -> tuple[Path, Path]:
    from dgchat.convert import convert

    folder = tm.export_hf(trained_run, tiny_data, trained_run / "hf")
    res = convert(folder, trained_run / "masked.gguf", cache_capable=True)
    assert res.family == "llada" and res.gguf_arch == "llama"
    return folder, res.output


def test_export_is_a_llada_checkpoint(exported: tuple[Path, Path]) -> None:
    folder, _ = exported
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (folder / name).is_file()
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LLaDAModelLM"] and cfg["mask_token_id"] == dtok.MASK == 5
    assert cfg["d_model"] == TINY.d_model and cfg["n_kv_heads"] == TINY.n_kv_heads and cfg["weight_tying"]
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [dtok.END_OF_TURN, dtok.EOS]
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == dtok.CHAT_TEMPLATE


def test_cache_capable_gguf_logits_match_the_torch_model(exported: tuple[Path, Path], tiny_data: Path) -> None:
    from dgchat.model_backend.gguf_file import read_gguf_header
    from dgchat.model_backend.llamacpp import LlamaContext, LlamaModel
    from dgchat.model_backend.model_info import inspect_header

    folder, gguf = exported
    header = read_gguf_header(gguf)
    assert header.architecture == "llama" and header.metadata["llama.attention.causal"] is False
    assert inspect_header(header).has_kv_memory
    tok = dtok.load_tokenizer(tiny_data / "tokenizer.json")
    msgs = [{"role": "system", "name": "Horatio", "content": "You are HORATIO. Scene: Elsinore."},
            {"role": "user", "name": "Bernardo", "content": "Who's there?"}]
    prompt = tok.encode(dtok.render_chat(msgs, add_generation_prompt=True), add_special_tokens=False).ids
    tokens = np.array(prompt + [dtok.MASK] * 12, dtype=np.int32)
    with LlamaModel(gguf, n_gpu_layers=0) as m:
        assert m.mask == dtok.MASK
        text = dtok.render_chat(msgs, add_generation_prompt=True)
        assert m.tokenize(text, add_special=False, parse_special=True).tolist() == prompt
        ctx = LlamaContext(m, n_ctx=256, max_tokens=256, exact_kv=True, n_threads=1)
        ctx.set_causal(False)
        out = ctx.decode_tokens(tokens, np.arange(tokens.size)).copy()
        ctx.close()
    model = tm.load_hf(folder)
    with torch.no_grad():
        ref = model.logits(model(torch.tensor(tokens, dtype=torch.long)[None]))[0].numpy()
    assert out.shape == ref.shape == (tokens.size, TINY.vocab_size)
    assert np.abs(ref).max() > 2 and ref.std(axis=0).max() > 0.1
    assert np.abs(out - ref).max() < 1e-4 * max(1.0, float(np.abs(ref).max()))


def test_engine_generates_with_prefix_cache_and_threshold(exported: tuple[Path, Path]) -> None:
    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.events import FinalEvent
    from dgchat.model_backend.params import DiffusionParams

    _, gguf = exported
    with load_engine(gguf, precise=True, n_threads=1) as engine:
        assert engine.info.has_kv_memory
        # the turn end stops an answer, and so does the <eos> fill after it
        assert engine.is_end(dtok.END_OF_TURN) and engine.is_end(tm.FILL) and not engine.is_end(dtok.MASK)
        prompt = engine.chat_prompt([{"role": "user", "name": "Bernardo", "content": "Who's there?"}])
        assert int((prompt == dtok.BOS).sum()) == 1 and prompt[0] == dtok.BOS  # the template's <bos>, once
        assert engine.resolve(DiffusionParams()).cache == "prefix"  # what `--cache auto` picks for this file
        base = DiffusionParams(gen_length=16, steps=16, block_length=8, seed=1, temperature=0.0, top_p=1.0)
        for params in (base.updated(cache="prefix"), base.updated(cache="prefix", threshold=0.9),
                       base.updated(cache="none")):
            final = [e for e in engine.generate(prompt, params) if isinstance(e, FinalEvent)][0]
            assert 0 < final.stats.steps <= 16
            assert final.stop_reason in ("eos", "max_tokens")
            assert dtok.MASK not in final.tokens.tolist()


def test_cli_trains_sized_model_and_exports_gguf(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "cli"
    common = ["--data-dir", str(tiny_data), "--run-dir", str(run)]
    sizes = ["--hidden", "32", "--layers", "1", "--heads", "2", "--ff", "64"]
    assert tm.main(["train", *common, "--steps", "2", "--batch-size", "2", "--threads", "1", "--precision", "fp32",
                    "--answer-length", "48", *sizes]) == 0
    arch = tm.run_arch(run)
    assert (arch.d_model, arch.n_layers, arch.n_heads, arch.n_kv_heads, arch.mlp_hidden_size) == (32, 1, 2, 2, 64)
    assert arch.vocab_size == 300  # from the data dir's meta.json
    with pytest.raises(SystemExit):  # sizes are fixed once a run exists
        tm.main(["train", *common, "--steps", "2", "--batch-size", "2", "--threads", "1", "--hidden", "48"])
    gguf = tmp_path / "cli.gguf"
    assert tm.main(["export", "--run-dir", str(run), "--data-dir", str(tiny_data), "--out", str(tmp_path / "hf"),
                    "--gguf", str(gguf)]) == 0
    from dgchat.model_backend.gguf_file import read_gguf_header

    header = read_gguf_header(gguf)
    assert header.architecture == "llama" and header.metadata["llama.block_count"] == 1
    assert header.metadata["llama.embedding_length"] == 32
    assert json.loads((tmp_path / "hf" / "training_state.json").read_text())["step"] == 2


def test_init_embedding_starts_from_a_default_model_gguf(tiny_data: Path, tmp_path: Path) -> None:
    """--init-embedding-from: the fresh run's tied embedding is the DiffusionGemma GGUF's, rescaled
    to LLaDA's init std (rows keep their directions); a GGUF of another tokenizer is refused."""
    from dgchat.convert.api import convert
    from dgchat.convert.default_model.warm_start import embedding_from_gguf

    dg_arch = tiny_text_arch()
    dg_run = tmp_path / "dg"
    td.train(tiny_data, dg_run, threads=None, arch=dg_arch, precision="fp32",
             overrides={"steps": 1, "batch_size": 2, "warmup_steps": 1, "eval_every": 10, "ckpt_every": 1,
                        "sample_every": 10, "log_every": 1, "eval_batches": 1})
    gguf = convert(td.export_hf(dg_run, tiny_data, tmp_path / "dg-hf"), tmp_path / "dg.gguf", outtype="f32").output
    source = embedding_from_gguf(gguf, tiny_data / "tokenizer.json", 300)

    run = tmp_path / "masked"
    _train(tiny_data, run, overrides={"steps": 1, "ckpt_every": 1}, init_embedding_from=gguf)
    start = json.loads((run / "log.jsonl").read_text().splitlines()[0])
    assert start["kind"] == "start" and start["init_embedding_from"]["file"] == "dg.gguf"
    fresh = tm.build_model(TINY)
    tm.init_embedding(fresh, gguf, tiny_data / "tokenizer.json")
    wte = fresh.model.transformer["wte"].weight.detach().numpy()
    assert wte.std() == pytest.approx(TINY.init_std, rel=1e-4)
    ratio = wte / source
    assert np.allclose(ratio, ratio.flat[0], rtol=1e-4)  # one scale for every entry: directions kept
    random = tm.build_model(TINY).model.transformer["wte"].weight.detach().numpy()
    assert not np.allclose(wte, random)

    other = tmp_path / "other"  # a tokenizer whose ids differ from the GGUF's
    other.mkdir()
    tj = json.loads((tiny_data / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(DgchatError, match="must extend the old one"):
        tm.init_embedding(tm.build_model(TINY), gguf, other / "tokenizer.json")
