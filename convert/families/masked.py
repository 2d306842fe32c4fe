"""What the masked-diffusion families (LLaDA, Dream, LLaDA-MoE, RND1) have in common.

A family module (llada.py, dream.py, llada_moe.py, rnd1.py) reads its config.json into `Hparams`,
names its tensors, and describes itself with a `Family`. This module does the rest, the same way
for all of them:

- the llama.cpp hyper-parameter keys, under the family's own architecture (`llada`, `dream`,
  `llada-moe`, `rnd1`: llama.cpp keeps no KV memory for these) or, with `--cache-capable`, under
  an architecture with a KV cache whose graph computes the same function (`llama`, `qwen2`,
  `hy_v3`, `qwen3moe`), with `{arch}.attention.causal = false`;
- the tokenizer (byte-level BPE), the mask token, `diffusion.shift_logits`;
- dgchat's keys: `dgchat.family`, `dgchat.preset` (which sampler family a cache-capable file
  belongs to), and the family's published sampler settings as `dgchat.steps`, `dgchat.gen_length`,
  ... (read by `dgchat.model_backend.model_info`), with their source in `dgchat.defaults_source`;
- tensor plumbing: streaming one tensor at a time from the memory-mapped shards, stacking
  per-expert MoE weights into llama.cpp's 3-D expert tensors, strict "every tensor used" checks.
"""

from __future__ import annotations

import math

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType

from dgchat.convert.checkpoint import Checkpoint
from dgchat.convert.errors import ConvertError
from dgchat.convert.tokenizer_gguf import Vocab, read_hf_tokenizer
from dgchat.convert.writer import GGUFPlan, TensorPlan, encode, finish_plan, pick_type

Q = GGMLQuantizationType
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Family:
    """Constants of one family. `defaults` are written as `dgchat.<key>` sampler defaults."""

    name: str  # dgchat.family, also the `dgchat convert` family label
    gguf_arch: str  # llama.cpp's diffusion architecture (no KV memory)
    cache_arch: str  # an architecture with a KV cache computing the same function
    shift_logits: bool  # position i predicts token i + 1 (Dream, RND1) or token i (LLaDA)
    preset: str  # dgchat.preset: the sampler family dgchat uses for a cache-capable file
    defaults: dict[str, Any]
    defaults_source: str
    mask_texts: tuple[str, ...] = ()  # token texts that are the mask token, when config.json has no id
    mask_id: int | None = None  # last resort: the id llama.cpp's converter hard-codes for the family
    pre_aliases: dict[str, str] = field(default_factory=dict)  # detected pre-tokenizer -> family name
    add_bos: bool | None = None  # forced tokenizer.ggml.add_bos_token; None: from the tokenizer files
    # extra keys / tensors the cache-capable architecture needs (e.g. hy_v3's shared expert)
    cache_extras: Callable[[GGUFPlan, "Hparams"], None] | None = None

    def arch(self, cache_capable: bool) -> str:
        return self.cache_arch if cache_capable else self.gguf_arch


@dataclass
class Hparams:
    n_vocab: int  # embedding rows (may exceed the tokenizer's size; padded with unused tokens)
    hidden: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ff: int  # dense MLP width (for MoE families: the expert width)
    rope_theta: float
    rms_eps: float
    context_length: int
    tied: bool
    n_expert: int = 0
    n_expert_used: int = 0
    expert_ff: int = 0

    def checked(self) -> Hparams:
        """These hparams, after check_sizes (what a family's plan_from_hf uses; a GGUF remap's
        placeholders for unused fields are not checked)."""
        check_sizes(self.__dict__)
        return self


# config.json sizes that drive the converter's loops and the written GGUF's allocations; the bounds
# are far above real models and the same as dgchat.model_backend.model_check's for the GGUF
_SIZE_BOUNDS = {
    "n_vocab": (1, 1 << 22), "vocab_size": (1, 1 << 22), "hidden": (1, 1 << 16), "hidden_size": (1, 1 << 16),
    "n_layer": (1, 512), "n_head": (1, 1024), "n_head_kv": (1, 1024), "head_dim": (1, 4096),
    "head_dim_swa": (1, 4096), "head_dim_full": (1, 4096), "ff": (1, 1 << 20), "intermediate_size": (1, 1 << 20),
    "context_length": (1, 1 << 24), "n_expert": (0, 1024), "n_expert_used": (0, 1024), "expert_ff": (0, 1 << 20),
    "sliding_window": (1, 1 << 24), "canvas_length": (1, 8192), "full_rope_pairs": (0, 2048),
}


def check_sizes(values: dict[str, Any]) -> None:
    """ConvertError naming the first config size that is not an integer in range, or a float key
    (rope_theta*, rms_eps / rms_norm_eps, softcap) that is not a finite positive number."""
    for key, value in values.items():
        if key in _SIZE_BOUNDS:
            lo, hi = _SIZE_BOUNDS[key]
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ConvertError(f"config.json: {key} = {value!r:.40} is not an integer in [{lo}, {hi}]")
        elif key.startswith("rope_theta") or key in ("rms_eps", "rms_norm_eps", "softcap"):
            if value is None and key == "softcap":
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0 or value > 1e30:
                raise ConvertError(f"config.json: {key} = {value!r:.40} is not a finite number > 0")


# -- config.json helpers ------------------------------------------------------------------------


def require(cfg: dict[str, Any], key: str, *alts: str) -> Any:
    for k in (key, *alts):
        if cfg.get(k) is not None:
            return cfg[k]
    raise ConvertError(f"config.json: {key} is missing")


def refuse(cond: bool, what: str) -> None:
    """Raise for a config option llama.cpp's graph for this family does not implement."""
    if cond:
        raise ConvertError(f"config.json: {what} is not supported (llama.cpp has no graph for it)")


def no_rope_scaling(cfg: dict[str, Any]) -> None:
    scaling = cfg.get("rope_scaling")
    if scaling not in (None, False, {}):
        raise ConvertError(f"config.json: rope_scaling {scaling!r} is not supported")
    refuse(float(cfg.get("partial_rotary_factor", 1.0) or 1.0) != 1.0, "partial_rotary_factor != 1")


def token_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


# -- metadata -------------------------------------------------------------------------------------


def write_arch_kv(plan: GGUFPlan, arch: str, hp: Hparams, *, non_causal: bool = True,
                  explicit_head_dim: bool = False) -> None:
    """The hyper-parameter keys llama.cpp's loader reads (llama_model_base::load_hparams), plus
    `attention.causal = false` (every masked family attends bidirectionally; block diffusion,
    `non_causal=False`, is a causal LM until the engine switches attention). `explicit_head_dim`:
    write the head size even where it is n_embd / n_head (the config named it)."""
    a = arch
    for key, value in (("context_length", hp.context_length), ("embedding_length", hp.hidden),
                       ("block_count", hp.n_layer), ("feed_forward_length", hp.ff),
                       ("attention.head_count", hp.n_head), ("attention.head_count_kv", hp.n_head_kv)):
        plan.u32(f"{a}.{key}", value)
    if explicit_head_dim or hp.head_dim * hp.n_head != hp.hidden:  # llama.cpp's default: n_embd / n_head
        for key in ("attention.key_length", "attention.value_length"):
            plan.u32(f"{a}.{key}", hp.head_dim)
    plan.u32(f"{a}.rope.dimension_count", hp.head_dim)
    plan.f32(f"{a}.rope.freq_base", hp.rope_theta)
    plan.f32(f"{a}.attention.layer_norm_rms_epsilon", hp.rms_eps)
    plan.u32(f"{a}.vocab_size", hp.n_vocab)
    if non_causal:
        plan.boolean(f"{a}.attention.causal", False)
    if hp.n_expert:
        plan.u32(f"{a}.expert_count", hp.n_expert)
        plan.u32(f"{a}.expert_used_count", hp.n_expert_used)
        plan.u32(f"{a}.expert_feed_forward_length", hp.expert_ff)


def write_dgchat_kv(plan: GGUFPlan, fam: Family, source: str, *, shift_logits: bool = True) -> None:
    """diffusion.shift_logits (unless `shift_logits` is False: the source file already says),
    dgchat's identification keys and the family's sampler defaults."""
    if shift_logits:
        plan.boolean("diffusion.shift_logits", fam.shift_logits)
    plan.u32("dgchat.format", FORMAT_VERSION)
    plan.string("dgchat.family", fam.name)
    plan.string("dgchat.source", source)
    plan.string("dgchat.preset", fam.preset)
    for key, value in fam.defaults.items():
        if isinstance(value, bool):
            plan.boolean(f"dgchat.{key}", value)
        elif isinstance(value, int):
            plan.u32(f"dgchat.{key}", value)
        elif isinstance(value, float):
            plan.f32(f"dgchat.{key}", value)
        else:
            plan.string(f"dgchat.{key}", str(value))
    plan.string("dgchat.defaults_source", fam.defaults_source)


def read_vocab(ckpt: Checkpoint, fam: Family, n_vocab: int) -> Vocab:
    """tokenizer.json -> GGUF vocabulary, with the family's mask token and end-of-generation ids."""
    cfg = ckpt.config
    gen = ckpt.generation_config or {}
    eos_ids = token_ids(gen.get("eos_token_id", cfg.get("eos_token_id")))
    fallback = {
        "bos": gen.get("bos_token_id", cfg.get("bos_token_id")),
        "eos": eos_ids[0] if eos_ids else None,
        "pad": gen.get("pad_token_id", cfg.get("pad_token_id")),
        "eot": eos_ids[1] if len(eos_ids) > 1 else None,
    }
    vocab = read_hf_tokenizer(ckpt.folder, n_vocab=n_vocab, spm_model="llama", fallback_ids=fallback,
                              pre_aliases=fam.pre_aliases)
    if vocab.model != "gpt2":
        raise ConvertError(f"{ckpt.folder}: {fam.name} checkpoints use a byte-level BPE tokenizer; this one is not")
    if eos_ids:
        vocab.special["eos"] = eos_ids[0]
    for role, tok in list(vocab.special.items()):
        if not 0 <= tok < n_vocab:
            raise ConvertError(f"{ckpt.folder}: {role} token id {tok} is outside the vocabulary ({n_vocab})")
    mask = cfg.get("mask_token_id")
    if mask is None:
        mask = vocab.special.get("mask")
    if mask is None:
        mask = next((vocab.tokens.index(t) for t in fam.mask_texts if t in vocab.tokens), None)
    if mask is None and fam.mask_id is not None and fam.mask_id < n_vocab:
        mask = fam.mask_id
    if mask is None:
        raise ConvertError(f"{ckpt.folder}: no mask token (config.json mask_token_id, tokenizer_config.json mask_token)")
    if not 0 <= int(mask) < n_vocab:
        raise ConvertError(f"config.json: mask_token_id {mask} is outside the vocabulary ({n_vocab})")
    vocab.special["mask"] = int(mask)
    if fam.add_bos is not None:
        vocab.add_bos = fam.add_bos
    return vocab


# -- tensors --------------------------------------------------------------------------------------


def rope_pairs(n_head: int) -> Callable[[np.ndarray], np.ndarray]:
    """Reorder Q/K rows from the rotate-half layout (pairs (i, i + d/2) of each head, as the
    checkpoints' RoPE rotates them) to adjacent pairs (2i, 2i + 1), which llama.cpp's "normal"
    RoPE rotates. Fact from llama.cpp conversion/llada.py (`LLaDAModel.permute`, applied to
    q_proj/k_proj weights and biases). Works on bf16 bit patterns too: rows only move."""

    def apply(w: np.ndarray) -> np.ndarray:
        rows = w.shape[0]
        if rows % (2 * n_head):
            raise ConvertError(f"cannot split {rows} rows into {n_head} RoPE heads")
        return np.ascontiguousarray(
            w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        )

    return apply


class Builder:
    """Collects a plan's tensors from a checkpoint, remembering which source tensors were used."""

    def __init__(self, ckpt: Checkpoint, plan: GGUFPlan, outtype: str) -> None:
        self.ckpt = ckpt
        self.plan = plan
        self.outtype = outtype
        self.used: set[str] = set()

    def add(self, src: str, dst: str, shape: Sequence[int], *, transform: Callable[[np.ndarray], np.ndarray] | None = None,
            keep_f32: bool = False) -> None:
        ckpt = self.ckpt
        shape = tuple(int(d) for d in shape)
        ckpt.load(src, shape)  # shape check before anything is written (a view: reads nothing)
        dtype = ckpt.info(src).dtype
        qtype = pick_type(self.outtype, dtype, shape, keep_f32=keep_f32)

        def produce() -> np.ndarray:
            data = ckpt.load(src)
            if transform is not None:
                data = transform(data)
            return encode(data, dtype, qtype)

        self.plan.tensors.append(TensorPlan(dst, shape, qtype, produce, release=lambda: ckpt.release(src)))
        self.used.add(src)

    def add_experts(self, srcs: Sequence[str], dst: str, shape_each: Sequence[int], *, keep_f32: bool = False) -> None:
        """Per-expert 2-D weights -> one (n_expert, rows, cols) tensor (llama.cpp's `*_exps`)."""
        ckpt = self.ckpt
        shape_each = tuple(int(d) for d in shape_each)
        dtypes = set()
        for s in srcs:
            ckpt.load(s, shape_each)
            dtypes.add(ckpt.info(s).dtype)
        if len(dtypes) != 1:
            raise ConvertError(f"checkpoint: the experts of {dst} have mixed dtypes ({', '.join(sorted(dtypes))})")
        dtype = dtypes.pop()
        shape = (len(srcs), *shape_each)
        qtype = pick_type(self.outtype, dtype, shape, keep_f32=keep_f32)

        def produce() -> np.ndarray:
            first = ckpt.load(srcs[0])
            out = np.empty(shape, dtype=first.dtype)
            for i, s in enumerate(srcs):
                out[i] = ckpt.load(s)
                ckpt.release(s)
            return encode(out, dtype, qtype)

        self.plan.tensors.append(TensorPlan(dst, shape, qtype, produce))
        self.used.update(srcs)

    def check_all_used(self, family: str, ignore: Callable[[str], bool] | None = None) -> None:
        for name in self.ckpt.tensors:
            if name in self.used or (ignore is not None and ignore(name)):
                continue
            raise ConvertError(f"checkpoint: unexpected tensor {name} (an unsupported {family} variant?)")


def zeros(name: str, shape: Sequence[int], qtype: GGMLQuantizationType = Q.F16) -> TensorPlan:
    arr_shape = tuple(int(d) for d in shape)
    dtype = np.float16 if qtype == Q.F16 else np.float32
    return TensorPlan(name, arr_shape, qtype, lambda: np.zeros(arr_shape, dtype=dtype))


def finish(plan: GGUFPlan, ckpt: Checkpoint, fam: Family, hp: Hparams, cache_capable: bool, name: str) -> GGUFPlan:
    """Everything after the tensors: keys, tokenizer, dgchat keys, cache-arch extras."""
    arch = fam.arch(cache_capable)
    write_arch_kv(plan, arch, hp)
    if cache_capable and fam.cache_extras is not None:
        fam.cache_extras(plan, hp)
    read_vocab(ckpt, fam, hp.n_vocab).write(plan)
    write_dgchat_kv(plan, fam, "hf-safetensors")
    if cache_capable:
        plan.notes.append(f"cache-capable: written as `{arch}` with attention.causal = false "
                          f"(the same weights as `{fam.gguf_arch}`, plus a KV cache)")
    finish_plan(plan, name)
    return plan

