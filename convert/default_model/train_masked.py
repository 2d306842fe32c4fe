"""Train a small LLaDA-style masked-diffusion model on the default model's data (issue 13).

The bundled DiffusionGemma is a uniform-state model; the fast-decoding features of masked models
(`--cache prefix|dual`, `--threshold`) need a masked model whose confidences mean something. This
recipe trains one with the same data, tokenizer, chat template and training machinery as
`train_default`, in GSAI-ML's `LLaDAModelLM` layout, so the project's own converter writes it as a
cache-capable `llama` GGUF:

    python -m dgchat.convert.default_model.train_default prepare --data-dir D --sdist S --vocab-size 16384
    python -m dgchat.convert.default_model.train_masked train  --data-dir D --run-dir R [--steps N] [--max-minutes M] [--threads T]
        [--answer-length 64 --pretrain-share 0.5 --init-embedding-from assets/dgchat-tiny-plays.gguf]
    python -m dgchat.convert.default_model.train_masked export --run-dir R --data-dir D --out R/hf [--gguf R/masked.gguf]
    dgchat convert R/hf -o R/masked.gguf --cache-capable     # what `export --gguf` does
    dgchat generate -m R/masked.gguf -p "..." --cache prefix --threshold 0.9

`train` resumes from the run's latest checkpoint (rerun the same command after --max-minutes);
`--hidden/--layers/--heads/--kv-heads/--ff` size the model on a fresh run (kept in settings.json).

Model (`LLaDAModelLM` below, written here from the published architecture): token embedding
`model.transformer.wte`, blocks `model.transformer.blocks.N.{attn_norm, q_proj, k_proj, v_proj,
attn_out, ff_norm, ff_proj, up_proj, ff_out}` (pre-norm RMSNorm, RoPE by `rotate_half`, SwiGLU,
no biases), `model.transformer.ln_f`, and the LM head tied to the embedding (`weight_tying`; an
untied head is `model.transformer.ff_out`). Attention is bidirectional: no causal mask, only a
key-padding mask while training on right-padded batches. Logits are not shifted: position i
predicts token i. The mask token is the default tokenizer's `<mask>` (id 5).

Objective (LLaDA SFT, Nie et al. 2025, "Large Language Diffusion Models", sec. 2.3 / app. B): per
training window one turn is drawn as the answer; the prompt is the window up to that turn's body
(system turn, earlier turns, the answer's `<start_of_turn>NAME\\n` header), exactly what the chat
template renders with `add_generation_prompt`. The answer is the body + `<end_of_turn>`, followed by
a random number of `<eos>` tokens (0 .. `answer_length` - its length): LLaDA pads answers with
|EOS| and trains on it, so a generated canvas longer than the answer fills with end tokens (the
engine stops at the first one). Each sequence draws t ~ U(0, 1), masks each answer token with
probability p = eps + (1 - eps) t and never a prompt token; the loss is the cross-entropy at masked
positions weighted 1/p, summed per sequence, divided by its answer length (fill included) and
averaged over the batch. Held-out evaluation: the same windows, turn choices, fills and masks
every time, at t = 0.5 and t = 1 (mean nats per masked token: all answer tokens, and `_text` for
the body + `<end_of_turn>` only, without the easy fill).

Pre-training rows (`--pretrain-share F`, LLaDA's pre-training objective, sec. 2.2): with
probability F a window is taken whole, every token after <bos> maskable, the loss normalised by the
window's length. An SFT row supervises one turn (~20 tokens of a 256-token window), so SFT alone
learns the text slowly: on the plays (16k vocabulary, batch 16) held-out text loss at t = 0.5 was
6.285 after 1,000 SFT-only steps and 6.080 with half the rows pre-training
(tests/models/dgchat-tiny-plays-masked.md).

`--init-embedding-from GGUF` starts a fresh run's tied embedding from a default-model GGUF built
with the same tokenizer (the bundled DiffusionGemma), rescaled to the init std.

Batches, turn choices and noise are functions of (seed, step) (`train_default.step_rngs` /
`batch_indices`), so a resumed run replays exactly the batches an uninterrupted one sees;
checkpoints, learning-rate schedule, optimizer and JSONL log are train_default's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from dgchat.convert.api import convert
from dgchat.convert.default_model import default_tokenizer as dtok
from dgchat.convert.default_model import train_default as td
from dgchat.convert.default_model.warm_start import embedding_from_gguf
from dgchat.model_backend.errors import DgchatError

# --------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class MaskedArch:
    """The model's shape; written into config.json with GSAI-ML's key names on export."""

    vocab_size: int = dtok.VOCAB_SIZE
    d_model: int = 256
    n_layers: int = 6  # hidden 256 x 6 layers: the size of README's random fast-decoding fixture
    n_heads: int = 4
    n_kv_heads: int = 4
    mlp_hidden_size: int = 688  # ~8/3 d_model, rounded to a multiple of 16 (SwiGLU's usual width)
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-5
    max_sequence_length: int = 2048
    weight_tying: bool = True  # a 16k x 256 head would double the parameters of a model this small
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class MaskedTrain:
    """Training settings. Field names shared with `default_model_config.TrainSettings` are the ones
    train_default's lr_at / make_optimizer read."""

    seed: int = 1234
    steps: int = 3000
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 200
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eps: float = 1e-3  # mask probability p = eps + (1 - eps) t (LLaDA's forward_process)
    answer_length: int = 128  # answer + <eos> fill is drawn up to this (>= the longest turn + 1)
    # share of windows trained whole with LLaDA's pre-training objective: an answer is one turn of
    # ~20 tokens, so a batch of SFT rows alone supervises ~1/25 of the tokens it computes
    pretrain_share: float = 0.0
    eval_every: int = 250
    eval_batches: int = 8
    ckpt_every: int = 100
    log_every: int = 10


FILL = dtok.EOS  # LLaDA's |EOS| padding of answers; an end-of-generation token in the GGUF
EVAL_T = (0.5, 1.0)


# --------------------------------------------------------------------------------------------
# Model


def _torch_modules():
    """The nn.Module classes, built on first use so importing this file needs no torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, dim: int, eps: float):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (y * self.weight.float()).to(x.dtype)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], dim=-1)

    class LLaDABlock(nn.Module):
        def __init__(self, a: MaskedArch):
            super().__init__()
            d, hd = a.d_model, a.head_dim
            self.n_heads, self.n_kv, self.hd = a.n_heads, a.n_kv_heads, hd
            self.attn_norm = RMSNorm(d, a.rms_norm_eps)
            self.q_proj = nn.Linear(d, a.n_heads * hd, bias=False)
            self.k_proj = nn.Linear(d, a.n_kv_heads * hd, bias=False)
            self.v_proj = nn.Linear(d, a.n_kv_heads * hd, bias=False)
            self.attn_out = nn.Linear(a.n_heads * hd, d, bias=False)
            self.ff_norm = RMSNorm(d, a.rms_norm_eps)
            self.ff_proj = nn.Linear(d, a.mlp_hidden_size, bias=False)
            self.up_proj = nn.Linear(d, a.mlp_hidden_size, bias=False)
            self.ff_out = nn.Linear(a.mlp_hidden_size, d, bias=False)

        def forward(self, x, cos, sin, attn_mask):
            B, T, _ = x.shape
            h = self.attn_norm(x)
            q = self.q_proj(h).view(B, T, self.n_heads, self.hd).transpose(1, 2)
            k = self.k_proj(h).view(B, T, self.n_kv, self.hd).transpose(1, 2)
            v = self.v_proj(h).view(B, T, self.n_kv, self.hd).transpose(1, 2)
            q = q * cos.to(q.dtype) + rotate_half(q) * sin.to(q.dtype)
            k = k * cos.to(k.dtype) + rotate_half(k) * sin.to(k.dtype)
            if self.n_kv != self.n_heads:  # GQA: query head i reads K/V head i // (n_heads / n_kv)
                rep = self.n_heads // self.n_kv
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=False)
            x = x + self.attn_out(a.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))
            h = self.ff_norm(x)
            return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))

    class LLaDAModelLM(nn.Module):
        """GSAI-ML's LLaDAModelLM parameter layout; forward returns the final hidden states."""

        def __init__(self, a: MaskedArch):
            super().__init__()
            if a.d_model % a.n_heads or a.n_heads % a.n_kv_heads or a.head_dim % 2:
                raise DgchatError(f"d_model {a.d_model} / n_heads {a.n_heads} / n_kv_heads {a.n_kv_heads} do not divide")
            self.arch = a
            t = nn.ModuleDict({
                "wte": nn.Embedding(a.vocab_size, a.d_model),
                "blocks": nn.ModuleList(LLaDABlock(a) for _ in range(a.n_layers)),
                "ln_f": RMSNorm(a.d_model, a.rms_norm_eps),
            })
            if not a.weight_tying:
                t["ff_out"] = nn.Linear(a.d_model, a.vocab_size, bias=False)
            self.model = nn.Module()
            self.model.transformer = t
            inv = 1.0 / a.rope_theta ** (torch.arange(0, a.head_dim, 2, dtype=torch.float32) / a.head_dim)
            self.register_buffer("inv_freq", inv, persistent=False)

        def reset_parameters(self, seed: int) -> None:
            """Normal(0, init_std) weights, residual outputs scaled by 1/sqrt(2 n_layers) (GPT-2's
            init), unit norms."""
            g = torch.Generator().manual_seed(seed)
            out_std = self.arch.init_std / math.sqrt(2 * self.arch.n_layers)
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if p.ndim == 1:
                        p.fill_(1.0)
                    else:
                        std = out_std if name.endswith(("attn_out.weight", "ff_out.weight")) and ".blocks." in name \
                            else self.arch.init_std
                        p.copy_(torch.randn(p.shape, generator=g) * std)

        def forward(self, input_ids, attention_mask=None):
            """input_ids (B, T) -> hidden states (B, T, d_model). attention_mask (B, T), True on real
            tokens: keys outside it are never attended (right-padded training batches only)."""
            t = self.model.transformer
            T = input_ids.shape[1]
            pos = torch.arange(T, device=input_ids.device, dtype=torch.float32)
            freqs = pos[:, None] * self.inv_freq[None]
            emb = torch.cat([freqs, freqs], dim=-1)
            cos, sin = emb.cos()[None, None], emb.sin()[None, None]
            mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
            x = t["wte"](input_ids)
            for block in t["blocks"]:
                x = block(x, cos, sin, mask)
            return t["ln_f"](x)

        def logits(self, hidden):
            t = self.model.transformer
            head = t["wte"].weight if self.arch.weight_tying else t["ff_out"].weight
            return F.linear(hidden, head)

    return LLaDAModelLM


def build_model(arch: MaskedArch, seed: int = 0):
    model = _torch_modules()(arch)
    model.reset_parameters(seed)
    return model


def init_embedding(model, gguf_path: Path, tokenizer_path: Path) -> None:
    """Start the (tied) token embedding from a default-model GGUF's: the bundled DiffusionGemma's
    rows already place the plays' tokens; the rest of the model starts from scratch. Gemma scales
    its input embedding by sqrt(d_model) and LLaDA does not, so rows are rescaled to LLaDA's init
    std (the tied head reads them too, and the first RMSNorm makes the scale moot at the input)."""
    import torch

    wte = model.model.transformer["wte"].weight
    emb = embedding_from_gguf(gguf_path, tokenizer_path, wte.shape[0])
    if emb.shape != tuple(wte.shape):
        raise DgchatError(f"--init-embedding-from: {gguf_path.name} has {emb.shape[1]}-wide rows, the model {wte.shape[1]}")
    emb *= model.arch.init_std / max(float(emb.std()), 1e-12)
    with torch.no_grad():
        wte.copy_(torch.from_numpy(emb))


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------
# Batches and noise


def make_batch(data: td.Windows, indices, answer_length: int, rng: np.random.Generator,
               pretrain_share: float = 0.0) -> dict[str, np.ndarray]:
    """Prompt + answer + <eos> fill per window, right-padded with <pad>; with probability
    `pretrain_share` a window is instead taken whole, every token after <bos> maskable (LLaDA's
    pre-training rows: no prompt, no fill).

    ids (B, T); valid: real tokens; answer: answer tokens incl. fill (the maskable part); text:
    answer body + <end_of_turn> (no fill); answer_len (B,): answer tokens incl. fill.
    """
    seqs, starts, text_ends = [], [], []
    for i in indices:
        ids, spans = data.ids(i), data.spans(i)
        # drawn only when asked for, so a run without pre-training rows replays the same batches
        if pretrain_share > 0 and rng.random() < pretrain_share:
            seqs.append(np.asarray(ids, dtype=np.int64))
            starts.append(1)
            text_ends.append(len(ids))
            continue
        start, end = (int(v) for v in spans[rng.integers(len(spans))])
        body = ids[start:end + 1]  # ids[end] is the turn's <end_of_turn>
        total = int(rng.integers(len(body), max(len(body), answer_length) + 1))
        seqs.append(np.concatenate([ids[:start], body, np.full(total - len(body), FILL, dtype=np.int64)]))
        starts.append(start)
        text_ends.append(end + 1)
    B, T = len(seqs), max(len(s) for s in seqs)
    out = {"ids": np.full((B, T), dtok.PAD, dtype=np.int64), "valid": np.zeros((B, T), dtype=bool),
           "answer": np.zeros((B, T), dtype=bool), "text": np.zeros((B, T), dtype=bool),
           "answer_len": np.zeros(B, dtype=np.int64)}
    for b, (s, st, te) in enumerate(zip(seqs, starts, text_ends)):
        out["ids"][b, :len(s)] = s
        out["valid"][b, :len(s)] = True
        out["answer"][b, st:len(s)] = True
        out["text"][b, st:te] = True
        out["answer_len"][b] = len(s) - st
    return out


def draw_noise(batch: dict[str, np.ndarray], gen, eps: float, t_fixed: float | None = None):
    """(p (B,), masked (B, T)): the mask probability of each sequence and which answer tokens are
    masked. Drawn on the CPU generator, so a run gives the same draws on any device."""
    import torch

    B, T = batch["ids"].shape
    t = torch.rand(B, generator=gen) if t_fixed is None else torch.full((B,), float(t_fixed))
    p = eps + (1 - eps) * t
    draw = torch.rand((B, T), generator=gen)
    masked = (draw < p[:, None]) & torch.as_tensor(batch["answer"])
    return p, masked


def _chunked_ce(model, hidden, targets, chunk: int = 1024):
    """Per-token CE of hidden rows (N, H), the head's logits recomputed in the backward pass chunk
    by chunk, so an (N x vocab) tensor never exists for the whole batch."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    def piece(h, t):
        return F.cross_entropy(model.logits(h).float(), t, reduction="none")

    if hidden.shape[0] == 0:  # nothing masked: an empty loss that still backpropagates
        return piece(hidden, targets)
    parts = []
    for i in range(0, hidden.shape[0], chunk):
        h, t = hidden[i:i + chunk], targets[i:i + chunk]
        parts.append(checkpoint(piece, h, t, use_reentrant=False) if torch.is_grad_enabled() else piece(h, t))
    return torch.cat(parts)


def masked_losses(model, batch: dict[str, np.ndarray], p, masked, device) -> tuple[Any, dict[str, Any]]:
    """LLaDA's SFT loss and per-token CE sums of one batch (see the module docstring)."""
    import torch

    ids = torch.as_tensor(batch["ids"], device=device)
    valid = torch.as_tensor(batch["valid"], device=device)
    masked = masked.to(device)
    noisy = torch.where(masked, torch.full_like(ids, dtok.MASK), ids)
    hidden = model(noisy, attention_mask=None if bool(valid.all()) else valid)
    rows, cols = masked.nonzero(as_tuple=True)
    ce = _chunked_ce(model, hidden[rows, cols], ids[rows, cols])
    p, answer_len = p.to(device), torch.as_tensor(batch["answer_len"], device=device)
    loss = (ce / (p[rows] * answer_len[rows])).sum() / ids.shape[0]
    text = torch.as_tensor(batch["text"], device=device)[rows, cols]
    return loss, {"ce_sum": float(ce.detach().sum()), "masked": int(rows.numel()),
                  "ce_text_sum": float(ce.detach()[text].sum()), "masked_text": int(text.sum()),
                  "tokens": int(valid.sum())}


def evaluate(model, val: td.Windows, s: MaskedTrain, device) -> dict[str, float]:
    """Mean CE per masked answer token at fixed t, on fixed held-out windows, turns, fills and masks."""
    import torch

    model.eval()
    n = min(len(val), s.eval_batches * s.batch_size)
    order = np.random.default_rng(4242).permutation(len(val))[:n]
    sums: dict[str, list[float]] = {}
    with torch.no_grad():
        for k in range(0, n, s.batch_size):
            _, rng = td.step_rngs(999, k, salt=1)
            batch = make_batch(val, order[k:k + s.batch_size], s.answer_length, rng)
            for j, t in enumerate(EVAL_T):
                gen, _ = td.step_rngs(999, k, salt=2 + j)
                p, masked = draw_noise(batch, gen, s.eps, t_fixed=t)
                _, info = masked_losses(model, batch, p, masked, device)
                key = f"t{t:g}".replace(".", "")
                for name, num, den in ((key, "ce_sum", "masked"), (key + "_text", "ce_text_sum", "masked_text")):
                    acc = sums.setdefault(name, [0.0, 0.0])
                    acc[0] += info[num]
                    acc[1] += info[den]
    model.train()
    return {k: v[0] / max(v[1], 1.0) for k, v in sums.items()}


# --------------------------------------------------------------------------------------------
# Training


def run_arch(run_dir: Path) -> MaskedArch:
    return MaskedArch(**json.loads((run_dir / "settings.json").read_text())["arch"])


def train(data_dir: Path, run_dir: Path, *, device: str = "cpu", threads: int | None = 2,
          max_minutes: float | None = None, overrides: dict[str, Any] | None = None,
          arch: MaskedArch | None = None, precision: str = "auto",
          init_embedding_from: Path | None = None) -> dict[str, Any]:
    """Train (or resume) the run in `run_dir`. threads: a torch thread count, 0 to adapt to the
    machine's load (train_default.adapt_threads), None to leave torch's setting alone.
    init_embedding_from: a default-model GGUF whose token embedding a fresh run starts from."""
    import torch

    auto_threads = threads == 0
    if auto_threads:
        torch.set_num_threads(2 if (os.cpu_count() or 1) >= 2 else 1)
    elif threads:
        torch.set_num_threads(threads)
    s = replace(MaskedTrain(), **(overrides or {}))
    meta = json.loads((data_dir / "meta.json").read_text())
    arch = arch or replace(MaskedArch(), vocab_size=int(meta.get("vocab_size", dtok.VOCAB_SIZE)))
    train_data, val_data = td.Windows(data_dir / "train.npz"), td.Windows(data_dir / "val.npz")
    if len(train_data) < s.batch_size:
        raise DgchatError(f"{len(train_data)} training windows are fewer than one batch of {s.batch_size}")
    run_dir.mkdir(parents=True, exist_ok=True)
    log = td.JsonlLog(run_dir / "log.jsonl")
    dev = torch.device(device)

    precision = td.resolve_precision(device, precision)
    settings = {"recipe": "masked", "precision": precision, "train": asdict(s), "arch": asdict(arch),
                "data_meta_sha256": td._file_sha256(data_dir / "meta.json")}
    td.pin_run_settings(run_dir, settings)

    model = build_model(arch, s.seed).to(dev)
    model.train()
    optimizer = td.make_optimizer(model, s)
    state: dict[str, Any] = {"step": 0, "tokens": 0, "masked_tokens": 0, "train_seconds": 0.0}
    ckpt = td.latest_checkpoint(run_dir)
    if ckpt is not None:
        state = td.load_checkpoint(ckpt, model, optimizer)
        log.write({"kind": "resume", "step": state["step"], "checkpoint": ckpt.name})
    else:
        if init_embedding_from is not None:
            init_embedding(model, init_embedding_from, data_dir / "tokenizer.json")
        log.write({"kind": "start", "recipe": "masked", "params": count_params(model), "device": device,
                   "threads": torch.get_num_threads(), "train_windows": len(train_data),
                   "val_windows": len(val_data), "init_embedding_from": init_embedding_from and
                   {"file": init_embedding_from.name, "sha256": td._file_sha256(init_embedding_from)}})

    t_start = time.time()
    window_t0, window_tok, window_steps = time.time(), 0, 0
    acc: dict[str, float] = {}
    while state["step"] < s.steps:
        step = state["step"]
        for g in optimizer.param_groups:
            g["lr"] = td.lr_at(step, s)
        if auto_threads:
            td.adapt_threads()
        gen, rng = td.step_rngs(s.seed, step)
        batch = make_batch(train_data, td.batch_indices(len(train_data), s.batch_size, s.seed, step),
                           s.answer_length, rng, s.pretrain_share)
        p, masked = draw_noise(batch, gen, s.eps)
        step_t0 = time.time()
        with td.autocast(dev, precision):
            loss, info = masked_losses(model, batch, p, masked, dev)
        gnorm = td.apply_gradients(model, optimizer, loss, s.grad_clip, step)
        state["step"] = step + 1
        state["tokens"] += info["tokens"]
        state["masked_tokens"] += info["masked"]
        state["train_seconds"] += time.time() - step_t0
        window_tok += info["tokens"]
        window_steps += 1
        for k, v in (("loss", float(loss.detach())), ("gnorm", float(gnorm)),
                     ("ce", info["ce_sum"] / max(info["masked"], 1))):
            acc[k] = acc.get(k, 0.0) + v

        step = state["step"]
        if step % s.log_every == 0 or step == s.steps:
            dt = time.time() - window_t0
            rec = {"kind": "train", "step": step, "lr": td.lr_at(step - 1, s),
                   **{k: round(v / window_steps, 4) for k, v in acc.items()},
                   "tok_per_s": round(window_tok / dt, 1), "s_per_step": round(dt / window_steps, 3),
                   "threads": torch.get_num_threads(), "elapsed_min": round((time.time() - t_start) / 60, 2)}
            log.write(rec)
            print(json.dumps(rec), flush=True)
            acc, window_t0, window_tok, window_steps = {}, time.time(), 0, 0
        if step % s.eval_every == 0 or step == s.steps:
            with td.autocast(dev, precision):
                ev = evaluate(model, val_data, s, dev)
            rec = {"kind": "val", "step": step, **{k: round(v, 4) for k, v in ev.items()}}
            log.write(rec)
            print(json.dumps(rec), flush=True)
        stop = max_minutes is not None and (time.time() - t_start) / 60 > max_minutes and step < s.steps
        if step % s.ckpt_every == 0 or step == s.steps or stop:
            td.save_checkpoint(run_dir, model, optimizer, state)
        if stop:
            td.log_stopped(log, step, max_minutes)
            return state
    td.log_done(log, state)
    return state


# --------------------------------------------------------------------------------------------
# Export


def llada_config(arch: MaskedArch) -> dict[str, Any]:
    """config.json with the keys and values of GSAI-ML's LLaDA checkpoints (configuration_llada.py)."""
    return {
        "architectures": ["LLaDAModelLM"], "model_type": "llada", "block_type": "llama",
        "activation_type": "silu", "layer_norm_type": "rms", "layer_norm_with_affine": True,
        "bias_for_layer_norm": False, "attention_layer_norm": False, "alibi": False, "rope": True,
        "rope_full_precision": True, "rope_theta": arch.rope_theta, "rms_norm_eps": arch.rms_norm_eps,
        "d_model": arch.d_model, "n_heads": arch.n_heads, "n_kv_heads": arch.n_kv_heads,
        "multi_query_attention": None, "n_layers": arch.n_layers, "mlp_hidden_size": arch.mlp_hidden_size,
        "include_bias": False, "include_qkv_bias": False, "input_emb_norm": False, "scale_logits": False,
        "clip_qkv": None, "weight_tying": arch.weight_tying, "embedding_size": arch.vocab_size,
        "vocab_size": arch.vocab_size, "max_sequence_length": arch.max_sequence_length,
        "mask_token_id": dtok.MASK, "bos_token_id": dtok.BOS, "eos_token_id": dtok.EOS,
        "pad_token_id": dtok.PAD, "use_cache": False,
        "init_std": arch.init_std,
    }


def generation_config() -> dict[str, Any]:
    """generation_config.json: the converter's end-of-generation ids (first: the turn end)."""
    return {"bos_token_id": dtok.BOS, "eos_token_id": [dtok.END_OF_TURN, dtok.EOS], "pad_token_id": dtok.PAD,
            "mask_token_id": dtok.MASK}


def export_hf(run_dir: Path, data_dir: Path, out_dir: Path, checkpoint: Path | None = None) -> Path:
    """Write a HF-style LLaDA folder (config.json, model.safetensors, tokenizer and generation
    config) from a training checkpoint (default: the latest), atomically."""
    from safetensors.torch import save_file

    ckpt = checkpoint or td.latest_checkpoint(run_dir)
    if ckpt is None:
        raise DgchatError(f"no checkpoint in {run_dir}")
    arch = run_arch(run_dir)
    model = build_model(arch)
    state = td.load_checkpoint(ckpt, model)
    tmp = td.export_staging_dir(out_dir)
    tmp.mkdir(parents=True)
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    td._atomic_json(tmp / "config.json", llada_config(arch))
    td._atomic_json(tmp / "generation_config.json", generation_config())
    return td.publish_export(tmp, out_dir, data_dir, state)


def load_hf(folder: Path):
    """An exported folder back as the torch module (the reference forward for its GGUF)."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    arch = MaskedArch(vocab_size=cfg["vocab_size"], d_model=cfg["d_model"], n_layers=cfg["n_layers"],
                      n_heads=cfg["n_heads"], n_kv_heads=cfg["n_kv_heads"] or cfg["n_heads"],
                      mlp_hidden_size=cfg["mlp_hidden_size"], rope_theta=cfg["rope_theta"],
                      rms_norm_eps=cfg["rms_norm_eps"], max_sequence_length=cfg["max_sequence_length"],
                      weight_tying=cfg["weight_tying"], init_std=cfg.get("init_std", 0.02))
    model = build_model(arch)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dgchat.convert.default_model.train_masked", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train", help="train (resumes from the run's latest checkpoint)")
    p.add_argument("--data-dir", type=Path, required=True, help="made by `train_default prepare`")
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="0 = adapt to the machine's load (default)")
    p.add_argument("--max-minutes", type=float)
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: bf16 where the device multiplies bf16 natively (a GPU, AVX512-BF16/AMX), else fp32")
    for flag in ("steps", "batch-size", "eval-every", "ckpt-every", "answer-length"):
        p.add_argument(f"--{flag}", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--pretrain-share", type=float, help="share of windows trained whole (LLaDA pre-training rows)")
    p.add_argument("--init-embedding-from", type=Path, metavar="GGUF",
                   help="a fresh run starts its token embedding from this default-model GGUF's (e.g. the bundled one)")
    for flag, field in (("hidden", "d_model"), ("layers", "n_layers"), ("heads", "n_heads"),
                        ("kv-heads", "n_kv_heads"), ("ff", "mlp_hidden_size")):
        p.add_argument(f"--{flag}", type=int, dest=f"arch_{field}", help=f"model {field} (a fresh run only)")
    p = sub.add_parser("export", help="write a HF-style LLaDA folder (and optionally its cache-capable GGUF)")
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--gguf", type=Path, help="also convert to this cache-capable (`llama`) GGUF")
    args = ap.parse_args(argv)

    if args.cmd == "train":
        overrides = {k: getattr(args, k) for k in ("steps", "batch_size", "eval_every", "ckpt_every",
                                                   "answer_length", "lr", "pretrain_share") if getattr(args, k) is not None}
        sizes = {k[5:]: v for k, v in vars(args).items() if k.startswith("arch_") and v is not None}
        if "n_heads" in sizes:
            sizes.setdefault("n_kv_heads", sizes["n_heads"])  # no GQA unless asked for
        arch = None  # default: MaskedArch with the data's vocabulary
        if (args.run_dir / "settings.json").exists():
            arch = run_arch(args.run_dir)
            if replace(arch, **sizes) != arch:
                ap.error(f"{args.run_dir} was started with other sizes; sizes apply to a fresh run only")
        elif sizes:
            meta = json.loads((args.data_dir / "meta.json").read_text())
            arch = replace(MaskedArch(), vocab_size=int(meta.get("vocab_size", dtok.VOCAB_SIZE)), **sizes)
        train(args.data_dir, args.run_dir, device=args.device, threads=args.threads, max_minutes=args.max_minutes,
              overrides=overrides, arch=arch, precision=args.precision, init_embedding_from=args.init_embedding_from)
    elif args.cmd == "export":
        out = export_hf(args.run_dir, args.data_dir, args.out, args.checkpoint)
        print(out)
        if args.gguf:
            res = convert(out, args.gguf, cache_capable=True)
            print(f"{res.output} ({res.gguf_arch}, {res.n_bytes} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
