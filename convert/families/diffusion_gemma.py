"""DiffusionGemma (transformers `DiffusionGemmaForBlockDiffusion`) -> a `gemma4` GGUF.

DiffusionGemma is a Gemma 4 MoE backbone used twice with shared weights: a causal encoder pass
(prompt and committed canvases, writes the KV cache) and a bidirectional decoder pass over the
canvas (reads the cache). The two passes differ only in their per-layer `layer_scalar` buffers;
the decoder also has a self-conditioning MLP applied to its input embeddings.

The output is a plain `gemma4` GGUF that stock llama.cpp loads (its loader rejects tensors it does
not know, so nothing extra is stored as a tensor). Everything else dgchat needs lives under
`dgchat.*` metadata keys; docs/diffusion-gemma-gguf.md is the reference for the layout.

Facts used from other projects (no code copied): the gemma4 GGUF tensor/key names and the
proportional-RoPE `rope_freqs` encoding (1.0 for rotated pairs, 1e30 for the rest) follow
llama.cpp's gemma4 loader (src/models/gemma4.cpp, conversion/gemma.py); the diffusion defaults
are transformers 5.23 `DiffusionGemmaGenerationConfig._get_default_generation_params`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType, GGUFValueType

from dgchat.convert.checkpoint import DGCHAT_GENERATION_FILE, Checkpoint
from dgchat.convert.errors import ConvertError
from dgchat.convert.families.masked import check_sizes
from dgchat.convert.tokenizer_gguf import read_hf_tokenizer
from dgchat.convert.writer import GGUFPlan, TensorPlan, encode, pick_type
from dgchat.convert.writer import finish_plan as writer_finish_plan
from dgchat.model_backend.params import MAX_BIAS

NAME = "diffusion-gemma"
HF_ARCHITECTURES = ("DiffusionGemmaForBlockDiffusion",)
GGUF_ARCH = "gemma4"
FORMAT_VERSION = 1

# Which scalar set `blk.N.layer_output_scale` holds. The encoder set, so that a stock llama.cpp
# computes the prompt's KV cache exactly (it is reused by every later step); the decoder set is
# applied by the patched engine when causal attention is off. Measured in
# docs/diffusion-gemma-gguf.md ("Which scalars go into the tensor").
TENSOR_SCALARS = "encoder"

# dgchat.engine.non_causal_type: all layers bidirectional, and sliding-window layers see the
# window of prefix cells anchored at the first position of the ubatch (the canvas start) plus
# every cell of the ubatch. Implemented by engine/patches; value 3 extends llama_non_causal_type.
NON_CAUSAL_TYPE_DGCHAT_CANVAS = 3

# transformers DiffusionGemmaGenerationConfig._get_default_generation_params
DIFFUSION_DEFAULTS: dict[str, Any] = {
    "max_denoising_steps": 48,
    "entropy_bound": 0.1,
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
}

P = "dgchat.diffusion_gemma."
DG = "dgchat.diffusion."
ENGINE = "dgchat.engine."


@dataclass
class Hparams:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: list[str]
    n_head: int
    n_head_kv: list[int]
    head_dim_swa: int
    head_dim_full: int
    rope_theta_swa: float
    rope_theta_full: float
    full_rope_pairs: int  # rotated (cos/sin) pairs in full-attention layers
    rms_norm_eps: float
    softcap: float | None
    sliding_window: int
    n_expert: int
    n_expert_used: int
    expert_ff: int
    context_length: int
    canvas_length: int
    tied: bool

    def __post_init__(self) -> None:
        check_sizes({k: v for k, v in self.__dict__.items() if k not in ("layer_types", "n_head_kv")})
        if len(self.layer_types) > 512 or not all(isinstance(h, int) and 1 <= h <= 1024 for h in self.n_head_kv):
            raise ConvertError("config.json: layer_types / num_key_value_heads are out of range")

    @property
    def n_layer(self) -> int:
        return len(self.layer_types)

    def is_swa(self, il: int) -> bool:
        return self.layer_types[il] == "sliding_attention"

    def head_dim(self, il: int) -> int:
        return self.head_dim_swa if self.is_swa(il) else self.head_dim_full


def _require(cfg: dict[str, Any], key: str, where: str = "text_config") -> Any:
    if cfg.get(key) is None:
        raise ConvertError(f"config.json: {where}.{key} is missing")
    return cfg[key]


def hparams_from_config(config: dict[str, Any]) -> Hparams:
    tc = config.get("text_config")
    if not isinstance(tc, dict):
        raise ConvertError("config.json: text_config is missing")
    if tc.get("use_bidirectional_attention") == "all":
        raise ConvertError("DiffusionGemma with use_bidirectional_attention='all' (non-causal encoder) is not supported")
    act = tc.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ConvertError(f"DiffusionGemma with hidden_activation={act!r} is not supported (llama.cpp uses gelu-tanh)")
    if tc.get("attention_bias"):
        raise ConvertError("DiffusionGemma with attention_bias is not supported")
    for key in ("num_kv_shared_layers", "hidden_size_per_layer_input"):
        if tc.get(key):
            raise ConvertError(f"DiffusionGemma with {key}={tc[key]} is not supported")

    n_layer = int(_require(tc, "num_hidden_layers"))
    layer_types = list(tc.get("layer_types") or [])
    if not layer_types:
        # transformers default: 5 sliding layers then 1 full, last layer forced full
        layer_types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n_layer)]
        layer_types[-1] = "full_attention"
    if len(layer_types) != n_layer or set(layer_types) - {"sliding_attention", "full_attention"}:
        raise ConvertError("config.json: text_config.layer_types does not match num_hidden_layers")

    n_head = int(_require(tc, "num_attention_heads"))
    kv_swa = int(tc.get("num_key_value_heads") or n_head)
    head_dim_swa = int(tc.get("head_dim") or int(_require(tc, "hidden_size")) // n_head)
    per_layer = tc.get("per_layer_config") or {}
    full_cfg: dict[str, Any] = {}
    for idx, lt in enumerate(layer_types):
        if lt == "full_attention":
            full_cfg = per_layer.get(str(idx)) or per_layer.get(idx) or {}
            break
    if "per_layer_config" in tc:
        # written by save_pretrained: the full layers' overrides, and only those that differ from
        # the base values (global_head_dim == head_dim serialises as an empty override)
        head_dim_full = int(full_cfg.get("head_dim") or head_dim_swa)
        kv_full = int(full_cfg.get("num_key_value_heads") or kv_swa)
    else:
        # a hand-written config: transformers' DiffusionGemmaTextConfig defaults apply,
        # global_head_dim 512 and the sliding layers' kv heads
        head_dim_full = int(tc.get("global_head_dim") or 512)
        kv_full = int(tc.get("num_global_key_value_heads") or kv_swa)
    n_head_kv = [kv_swa if lt == "sliding_attention" else kv_full for lt in layer_types]

    rope = tc.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    }
    swa_rope = rope.get("sliding_attention") or {}
    full_rope = rope.get("full_attention") or {}
    for kind, rp in (("sliding_attention", swa_rope), ("full_attention", full_rope)):
        if float(rp.get("factor", 1.0)) != 1.0:
            raise ConvertError(f"config.json: RoPE scaling on {kind} layers is not supported")
    if swa_rope.get("rope_type", "default") != "default" or float(swa_rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConvertError("config.json: sliding layers must use full default RoPE")
    full_type = full_rope.get("rope_type", "default")
    prf = float(full_rope.get("partial_rotary_factor", 1.0))
    if full_type == "proportional":
        # transformers `_compute_proportional_rope_parameters`: rope_angles = int(factor * head_dim // 2)
        full_pairs = int(prf * head_dim_full // 2)
    elif full_type == "default" and prf == 1.0:
        full_pairs = head_dim_full // 2
    else:
        raise ConvertError(f"config.json: full-attention RoPE type {full_type!r} is not supported")

    n_expert = tc.get("num_experts")
    if not n_expert or not tc.get("top_k_experts") or not tc.get("moe_intermediate_size"):
        raise ConvertError("config.json: DiffusionGemma needs num_experts, top_k_experts and moe_intermediate_size")
    canvas = config.get("canvas_length") or 256
    softcap = tc.get("final_logit_softcapping", 30.0)
    return Hparams(
        vocab_size=int(_require(tc, "vocab_size")),
        hidden_size=int(_require(tc, "hidden_size")),
        intermediate_size=int(_require(tc, "intermediate_size")),
        layer_types=layer_types,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_swa=head_dim_swa,
        head_dim_full=head_dim_full,
        rope_theta_swa=float(swa_rope.get("rope_theta", 10_000.0)),
        rope_theta_full=float(full_rope.get("rope_theta", 1_000_000.0)),
        full_rope_pairs=full_pairs,
        rms_norm_eps=float(tc.get("rms_norm_eps", 1e-6)),
        softcap=float(softcap) if softcap else None,
        sliding_window=int(_require(tc, "sliding_window")),
        n_expert=int(n_expert),
        n_expert_used=int(tc["top_k_experts"]),
        expert_ff=int(tc["moe_intermediate_size"]),
        context_length=int(tc.get("max_position_embeddings", 131_072)),
        canvas_length=int(canvas),
        tied=bool(config.get("tie_word_embeddings", tc.get("tie_word_embeddings", True))),
    )


def diffusion_params(gen: dict[str, Any] | None, own: dict[str, Any] | None = None
                     ) -> tuple[dict[str, Any], list[str]]:
    """Sampler defaults from generation_config.json (`gen`; missing ones from transformers'
    defaults) and dgchat's own from dgchat_generation.json (`own`: `pad_bias`)."""
    gen = gen or {}
    sampler = gen.get("sampler_config") or {}
    found = {
        "max_denoising_steps": gen.get("max_denoising_steps"),
        "entropy_bound": sampler.get("entropy_bound") if isinstance(sampler, dict) else None,
        "t_min": gen.get("t_min"),
        "t_max": gen.get("t_max"),
        "stability_threshold": gen.get("stability_threshold"),
        "confidence_threshold": gen.get("confidence_threshold"),
    }
    defaulted = [k for k, v in found.items() if v is None]
    params = {k: (DIFFUSION_DEFAULTS[k] if v is None else v) for k, v in found.items()}
    # a bias on the pad token's logit while denoising (DiffusionParams.pad_bias); written only where
    # the checkpoint names one
    pad_bias = (own or {}).get("pad_bias")
    if pad_bias is not None:
        if isinstance(pad_bias, bool) or not isinstance(pad_bias, (int, float)) or not -MAX_BIAS <= pad_bias <= MAX_BIAS:
            raise ConvertError(f"{DGCHAT_GENERATION_FILE}: pad_bias = {pad_bias!r:.40} is not a number in "
                               f"[-{MAX_BIAS:g}, {MAX_BIAS:g}]")
        params["pad_bias"] = float(pad_bias)
    return params, defaulted


def write_model_kv(plan: GGUFPlan, hp: Hparams) -> None:
    """The gemma4 architecture keys llama.cpp's loader reads."""
    a = GGUF_ARCH
    plan.u32(f"{a}.context_length", hp.context_length)
    plan.u32(f"{a}.embedding_length", hp.hidden_size)
    plan.u32(f"{a}.block_count", hp.n_layer)
    plan.u32(f"{a}.feed_forward_length", hp.intermediate_size)
    plan.u32(f"{a}.attention.head_count", hp.n_head)
    plan.array(f"{a}.attention.head_count_kv", hp.n_head_kv, GGUFValueType.INT32)
    plan.u32(f"{a}.attention.key_length", hp.head_dim_full)
    plan.u32(f"{a}.attention.value_length", hp.head_dim_full)
    plan.u32(f"{a}.attention.key_length_swa", hp.head_dim_swa)
    plan.u32(f"{a}.attention.value_length_swa", hp.head_dim_swa)
    # full layers rotate every dimension; rope_freqs (1e30 factors) switches the unrotated pairs off
    plan.u32(f"{a}.rope.dimension_count", hp.head_dim_full)
    plan.u32(f"{a}.rope.dimension_count_swa", hp.head_dim_swa)
    plan.f32(f"{a}.rope.freq_base", hp.rope_theta_full)
    plan.f32(f"{a}.rope.freq_base_swa", hp.rope_theta_swa)
    plan.f32(f"{a}.attention.layer_norm_rms_epsilon", hp.rms_norm_eps)
    plan.u32(f"{a}.attention.sliding_window", hp.sliding_window)
    plan.array(f"{a}.attention.sliding_window_pattern", [hp.is_swa(i) for i in range(hp.n_layer)], GGUFValueType.BOOL)
    if hp.softcap:
        plan.f32(f"{a}.final_logit_softcapping", hp.softcap)
    plan.u32(f"{a}.expert_count", hp.n_expert)
    plan.u32(f"{a}.expert_used_count", hp.n_expert_used)
    plan.u32(f"{a}.expert_feed_forward_length", hp.expert_ff)
    plan.u32(f"{a}.attention.shared_kv_layers", 0)
    plan.u32(f"{a}.embedding_length_per_layer_input", 0)


@dataclass
class SelfCond:
    """Self-conditioning weights as stored (bf16/f16 as uint16 bits), PyTorch (out, in) layout."""

    dtype: str  # "f32", "f16" or "bf16"
    pre_norm: np.ndarray  # float32 [hidden]
    gate: np.ndarray  # [intermediate, hidden]
    up: np.ndarray  # [intermediate, hidden]
    down: np.ndarray  # [hidden, intermediate]


def write_dgchat_kv(
    plan: GGUFPlan,
    hp: Hparams,
    *,
    source: str,
    diffusion: dict[str, Any],
    defaulted: list[str],
    eos_ids: list[int],
    enc_scalars: np.ndarray,
    dec_scalars: np.ndarray,
    self_cond: SelfCond,
) -> None:
    plan.u32("dgchat.format", FORMAT_VERSION)
    plan.string("dgchat.family", NAME)
    plan.string("dgchat.source", source)

    plan.u32(DG + "canvas_length", hp.canvas_length)
    plan.u32(DG + "max_denoising_steps", int(diffusion["max_denoising_steps"]))
    plan.f32(DG + "entropy_bound", float(diffusion["entropy_bound"]))
    plan.f32(DG + "t_min", float(diffusion["t_min"]))
    plan.f32(DG + "t_max", float(diffusion["t_max"]))
    plan.u32(DG + "stability_threshold", int(diffusion["stability_threshold"]))
    plan.f32(DG + "confidence_threshold", float(diffusion["confidence_threshold"]))
    plan.array(DG + "eos_token_ids", [int(t) for t in eos_ids], GGUFValueType.INT32)
    if "pad_bias" in diffusion:
        plan.f32(DG + "pad_bias", float(diffusion["pad_bias"]))
    if defaulted:
        plan.array(DG + "defaulted", defaulted, GGUFValueType.STRING)

    plan.f32(P + "embed_scale", math.sqrt(hp.hidden_size))
    plan.array(P + "layer_scalars.encoder", np.asarray(enc_scalars, np.float32), GGUFValueType.FLOAT32)
    plan.array(P + "layer_scalars.decoder", np.asarray(dec_scalars, np.float32), GGUFValueType.FLOAT32)
    plan.string(P + "layer_output_scale_tensor", TENSOR_SCALARS)
    inter, hidden = self_cond.gate.shape
    plan.u32(P + "self_cond.intermediate_size", inter)
    plan.string(P + "self_cond.dtype", self_cond.dtype)
    plan.array(P + "self_cond.pre_norm", np.asarray(self_cond.pre_norm, np.float32), GGUFValueType.FLOAT32)
    sub = GGUFValueType.FLOAT32 if self_cond.dtype == "f32" else GGUFValueType.UINT16
    for part in ("gate", "up", "down"):
        plan.array(P + f"self_cond.{part}", getattr(self_cond, part), sub)

    # read by the patched engine (engine/patches); ignored by stock llama.cpp
    plan.u32(ENGINE + "non_causal_type", NON_CAUSAL_TYPE_DGCHAT_CANVAS)
    other = dec_scalars if TENSOR_SCALARS == "encoder" else enc_scalars
    mode = "non_causal" if TENSOR_SCALARS == "encoder" else "causal"
    plan.array(ENGINE + f"layer_output_scale.{mode}", np.asarray(other, np.float32), GGUFValueType.FLOAT32)


def rope_freqs(hp: Hparams) -> np.ndarray:
    n = hp.head_dim_full // 2
    return np.array([1.0] * hp.full_rope_pairs + [1e30] * (n - hp.full_rope_pairs), dtype=np.float32)


finish_plan = writer_finish_plan


# HF decoder-layer parameter -> GGUF tensor (blk.N.<name>)
_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_KEEP_F32 = ("ffn_gate_inp.weight",)  # the router decides expert choice; never round it
DEC = "model.decoder."
ENC = "model.encoder.language_model."


def _layer_shapes(hp: Hparams, il: int) -> dict[str, tuple[int, ...]]:
    h, hd, nh, nkv = hp.hidden_size, hp.head_dim(il), hp.n_head, hp.n_head_kv[il]
    return {
        "attn_norm.weight": (h,), "attn_q.weight": (nh * hd, h), "attn_k.weight": (nkv * hd, h),
        "attn_v.weight": (nkv * hd, h), "attn_output.weight": (h, nh * hd), "attn_q_norm.weight": (hd,),
        "attn_k_norm.weight": (hd,), "post_attention_norm.weight": (h,), "ffn_norm.weight": (h,),
        "ffn_gate.weight": (hp.intermediate_size, h), "ffn_up.weight": (hp.intermediate_size, h),
        "ffn_down.weight": (h, hp.intermediate_size), "post_ffw_norm_1.weight": (h,),
        "pre_ffw_norm_2.weight": (h,), "ffn_gate_inp.weight": (hp.n_expert, h), "ffn_gate_inp.scale": (h,),
        "ffn_gate_up_exps.weight": (hp.n_expert, 2 * hp.expert_ff, h),
        "ffn_down_exps.weight": (hp.n_expert, h, hp.expert_ff), "ffn_down_exps.scale": (hp.n_expert,),
        "post_ffw_norm_2.weight": (h,), "post_ffw_norm.weight": (h,),
    }


def _ckpt_tensor(ckpt: Checkpoint, src: str, shape: tuple[int, ...], dst: str, outtype: str) -> TensorPlan:
    dtype = ckpt.info(src).dtype
    ckpt.load(src, shape)  # shape check now, before anything is written
    qtype = pick_type(outtype, dtype, shape, keep_f32=dst.endswith(_KEEP_F32))
    return TensorPlan(dst, shape, qtype, lambda: encode(ckpt.load(src), dtype, qtype),
                      release=lambda: ckpt.release(src))


def _const_tensor(name: str, values: np.ndarray) -> TensorPlan:
    arr = np.ascontiguousarray(values, dtype=np.float32)
    return TensorPlan(name, arr.shape, GGMLQuantizationType.F32, lambda: arr)


def eos_ids_from(gen: dict[str, Any] | None, config: dict[str, Any]) -> list[int]:
    value = (gen or {}).get("eos_token_id")
    if value is None:
        value = (config.get("text_config") or {}).get("eos_token_id", config.get("eos_token_id"))
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def plan_from_hf(ckpt: Checkpoint, outtype: str, name: str, *, cache_capable: bool = False) -> GGUFPlan:
    hp = hparams_from_config(ckpt.config)
    plan = GGUFPlan(GGUF_ARCH)
    if cache_capable:
        plan.notes.append("--cache-capable: gemma4 already keeps a KV cache; nothing to change")
    gen = ckpt.generation_config
    tc = ckpt.config.get("text_config") or {}

    # -- expected tensors, strictly: anything unexpected in the decoder means a layout change ----
    consumed: set[str] = set()
    emb = DEC + "embed_tokens.weight"
    emb_info = ckpt.info(emb)
    if emb_info.shape[1:] != (hp.hidden_size,) or emb_info.shape[0] < hp.vocab_size:
        raise ConvertError(f"{emb}: shape {list(emb_info.shape)} does not match the config")
    n_vocab = emb_info.shape[0]
    plan.tensors.append(_ckpt_tensor(ckpt, emb, emb_info.shape, "token_embd.weight", outtype))
    plan.tensors.append(_ckpt_tensor(ckpt, DEC + "norm.weight", (hp.hidden_size,), "output_norm.weight", outtype))
    plan.tensors.append(_const_tensor("rope_freqs.weight", rope_freqs(hp)))
    consumed |= {emb, DEC + "norm.weight"}
    if not hp.tied:
        plan.tensors.append(_ckpt_tensor(ckpt, "lm_head.weight", emb_info.shape, "output.weight", outtype))
        consumed.add("lm_head.weight")

    enc_scalars = np.zeros(hp.n_layer, np.float32)
    dec_scalars = np.zeros(hp.n_layer, np.float32)
    for il in range(hp.n_layer):
        shapes = _layer_shapes(hp, il)
        for src_suffix, dst_suffix in _LAYER_MAP.items():
            src = f"{DEC}layers.{il}.{src_suffix}"
            if dst_suffix == "attn_v.weight" and not ckpt.has(src):
                if hp.is_swa(il):
                    raise ConvertError(f"checkpoint: {src} is missing")
                continue  # full-attention layers use K as V (attention_k_eq_v)
            plan.tensors.append(_ckpt_tensor(ckpt, src, shapes[dst_suffix], f"blk.{il}.{dst_suffix}", outtype))
            consumed.add(src)
        dec_src, enc_src = f"{DEC}layers.{il}.layer_scalar", f"{ENC}layers.{il}.layer_scalar"
        dec_scalars[il] = float(ckpt.load_f32(dec_src, (1,))[0])
        enc_scalars[il] = float(ckpt.load_f32(enc_src, (1,))[0])
        consumed |= {dec_src, enc_src}
        chosen = enc_scalars[il] if TENSOR_SCALARS == "encoder" else dec_scalars[il]
        plan.tensors.append(_const_tensor(f"blk.{il}.layer_output_scale.weight", np.array([chosen])))

    sc_names = {p: f"{DEC}self_conditioning.{p}.weight" for p in ("pre_norm", "gate_proj", "up_proj", "down_proj")}
    h, inter = hp.hidden_size, hp.intermediate_size
    sc_dtype = ckpt.info(sc_names["gate_proj"]).dtype
    for p in ("up_proj", "down_proj"):
        if ckpt.info(sc_names[p]).dtype != sc_dtype:
            raise ConvertError("checkpoint: the self-conditioning weights have mixed dtypes")
    self_cond = SelfCond(
        dtype=sc_dtype,
        pre_norm=ckpt.load_f32(sc_names["pre_norm"], (h,)),
        gate=ckpt.load(sc_names["gate_proj"], (inter, h)),
        up=ckpt.load(sc_names["up_proj"], (inter, h)),
        down=ckpt.load(sc_names["down_proj"], (h, inter)),
    )
    consumed |= set(sc_names.values())

    skipped_vision = 0
    for tname in ckpt.tensors:
        if tname in consumed:
            continue
        if tname.startswith(("model.encoder.vision_tower.", "model.encoder.embed_vision.")):
            skipped_vision += 1
            continue
        if tname.startswith(ENC) or tname == "lm_head.weight":
            continue  # tied copies of decoder weights, if a checkpoint stores them
        raise ConvertError(f"checkpoint: unexpected tensor {tname} (unsupported DiffusionGemma variant?)")
    if skipped_vision:
        plan.notes.append(f"skipped {skipped_vision} vision-tower tensors (text only)")

    # -- metadata --------------------------------------------------------------------------------
    write_model_kv(plan, hp)
    eos_ids = eos_ids_from(gen, ckpt.config)
    fallback = {
        "bos": tc.get("bos_token_id"),
        "eos": eos_ids[0] if eos_ids else None,
        "pad": tc.get("pad_token_id"),
        "eot": eos_ids[1] if len(eos_ids) > 1 else None,
    }
    vocab = read_hf_tokenizer(ckpt.folder, n_vocab=n_vocab, spm_model="gemma4", default_add_bos=True,
                              fallback_ids=fallback)
    if eos_ids:
        vocab.special["eos"] = eos_ids[0]
    vocab.write(plan)
    diffusion, defaulted = diffusion_params(gen, ckpt.dgchat_generation)
    write_dgchat_kv(plan, hp, source="hf-safetensors", diffusion=diffusion, defaulted=defaulted,
                    eos_ids=eos_ids, enc_scalars=enc_scalars, dec_scalars=dec_scalars, self_cond=self_cond)
    finish_plan(plan, name)
    return plan
