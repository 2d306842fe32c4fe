"""LLaDA-MoE (inclusionAI `LLaDAMoEModelLM`: LLaDA-MoE-7B-A1B-Base/Instruct) -> `llada-moe` GGUF.

Facts from inclusionAI's `modeling_lladamoe.py` / `configuration_lladamoe.py` (shipped with the
checkpoints; the layers are OLMoE's):

- config.json: `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`,
  `num_experts`, `num_experts_per_tok`, `expert_intermediate_size`, `moe_layer_freq`,
  `shared_expert_intermediate_size`, `dense_intermediate_size`, `rope_theta`, `rms_norm_eps`,
  `max_position_embeddings`, `qk_layernorm`, `attention_bias`, `clip_qkv`,
  `moe_router_score_function`, `moe_router_enable_expert_bias`, `partial_rotary_factor`;
- attention: q_proj/k_proj/v_proj/o_proj; with `qk_layernorm`, RMSNorm over each head's
  head_dim (q_norm/k_norm, weights of size head_dim) before RoPE; RoPE by `rotate_half` ("neox");
  bidirectional;
- MoE: router `mlp.gate` -> softmax over all experts -> top-k, `norm_topk_prob = False` (the
  chosen probabilities are used as they are) -> sum of SiLU-gated experts
  `mlp.experts.E.{gate,up,down}_proj`; logits are not shifted.

llama.cpp's `llada-moe` graph (src/models/llada-moe.cpp) computes exactly that, with per-head Q/K
norm and `build_moe_ffn(..., norm_w = false, softmax gating)`. It has no shared expert, no dense
layers and no attention biases, so those variants are refused.

Cache-capable twin: no llama.cpp architecture with a KV cache has llada-moe's graph as such —
qwen3moe / rnd1 renormalise the top-k weights (hard-coded `norm_w = true`), olmoe normalises Q/K
over the whole projection. `hy_v3` (src/models/hy-v3.cpp) has per-head Q/K RMSNorm, neox RoPE,
separate Q/K/V, and takes gating function, weight normalisation and scale from the file
(`expert_gating_func = 1` softmax, `expert_weights_norm = false`); it always adds a shared expert,
so the file carries an all-zero shared expert of width `SHARED_WIDTH`, whose output is exactly 0.
"""

from __future__ import annotations

from typing import Any

from dgchat.convert.checkpoint import Checkpoint
from dgchat.convert.errors import ConvertError
from dgchat.convert.families import masked as m
from dgchat.convert.writer import GGUFPlan

NAME = "llada-moe"
HF_ARCHITECTURES = ("LLaDAMoEModelLM", "LLaDAMoEModel")

# width of hy_v3's (required) shared expert, all zeros; 32 keeps it tiny yet block-aligned for
# every ggml quantization the quantizer might pick for its rows
SHARED_WIDTH = 32
GATING_SOFTMAX = 1  # llama_expert_gating_func_type LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX


def hy_v3_extras(plan: GGUFPlan, hp: m.Hparams) -> None:
    a = "hy_v3"
    if plan.get(f"{a}.expert_feed_forward_length") is None:  # required by hy_v3's loader, optional in llada-moe's
        raise ConvertError("the source has no expert_feed_forward_length; hy_v3 needs it")
    plan.u32(f"{a}.expert_gating_func", GATING_SOFTMAX)  # hy_v3 defaults to sigmoid without it
    plan.boolean(f"{a}.expert_weights_norm", False)
    plan.u32(f"{a}.expert_shared_feed_forward_length", SHARED_WIDTH)
    for i in range(hp.n_layer):
        plan.tensors.append(m.zeros(f"blk.{i}.ffn_gate_shexp.weight", (SHARED_WIDTH, hp.hidden)))
        plan.tensors.append(m.zeros(f"blk.{i}.ffn_up_shexp.weight", (SHARED_WIDTH, hp.hidden)))
        plan.tensors.append(m.zeros(f"blk.{i}.ffn_down_shexp.weight", (hp.hidden, SHARED_WIDTH)))


FAMILY = m.Family(
    name=NAME,
    gguf_arch="llada-moe",
    cache_arch="hy_v3",
    shift_logits=False,
    preset="llada",
    # inclusionAI/LLaDA-MoE-7B-A1B-Instruct model card: generate(model, input_ids, steps=128,
    # gen_length=128, block_length=32, temperature=0., cfg_scale=0., remasking='low_confidence')
    defaults={"steps": 128, "gen_length": 128, "block_length": 32, "algorithm": "confidence", "temperature": 0.0},
    defaults_source="LLaDA-MoE-7B-A1B-Instruct model card: steps=128, gen_length=128, block_length=32, "
    "temperature=0, remasking=low_confidence",
    mask_texts=("<|mask|>", "<|mdm_mask|>"),
    mask_id=156895,  # llama.cpp conversion/llada.py, LLaDAMoEModel: add_mask_token_id(156895)
    # llama.cpp's converter writes "llada-moe" for this tokenizer (same regex as Ling's "bailingmoe")
    pre_aliases={"bailingmoe": "llada-moe"},
    cache_extras=hy_v3_extras,
)


def hparams(cfg: dict[str, Any], n_vocab: int) -> m.Hparams:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConvertError(f"config.json: hidden_act={act!r} is not supported")
    m.no_rope_scaling(cfg)
    n_layer = int(m.require(cfg, "num_hidden_layers"))
    freq = cfg.get("moe_layer_freq")
    m.refuse(isinstance(freq, list) and any(int(f) != 1 for f in freq), "dense layers (moe_layer_freq with 0)")
    m.refuse(cfg.get("shared_expert_intermediate_size") not in (None, 0), "a shared expert")
    m.refuse(bool(cfg.get("moe_router_enable_expert_bias")), "moe_router_enable_expert_bias")
    score = cfg.get("moe_router_score_function") or "softmax"
    if score != "softmax":
        raise ConvertError(f"config.json: moe_router_score_function={score!r} is not supported (softmax only)")
    m.refuse(float(cfg.get("routed_scaling_factor") or 1.0) != 1.0, "routed_scaling_factor != 1")
    m.refuse(not cfg.get("qk_layernorm", True), "qk_layernorm=false")
    m.refuse(bool(cfg.get("attention_bias")), "attention_bias")
    m.refuse(cfg.get("clip_qkv") is not None, "clip_qkv")
    h = int(m.require(cfg, "hidden_size"))
    n_head = int(m.require(cfg, "num_attention_heads"))
    n_kv = int(cfg.get("num_key_value_heads") or n_head)
    if h % n_head or n_head % n_kv:
        raise ConvertError(f"config.json: hidden_size {h} / num_attention_heads {n_head} / num_key_value_heads {n_kv} do not divide")
    expert_ff = int(m.require(cfg, "expert_intermediate_size"))
    return m.Hparams(
        n_vocab=n_vocab, hidden=h, n_layer=n_layer, n_head=n_head, n_head_kv=n_kv, head_dim=h // n_head,
        ff=expert_ff, rope_theta=float(cfg.get("rope_theta", 10_000.0)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-5)), context_length=int(cfg.get("max_position_embeddings", 4096)),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        n_expert=int(m.require(cfg, "num_experts")), n_expert_used=int(m.require(cfg, "num_experts_per_tok")),
        expert_ff=expert_ff,
    )


def add_moe_layers(b: m.Builder, hp: m.Hparams, *, attn_bias: bool = False) -> None:
    """Qwen3-MoE / OLMoE-style decoder layers: per-head Q/K RMSNorm, router + per-expert MLPs."""
    h, hd = hp.hidden, hp.head_dim
    for i in range(hp.n_layer):
        s, d = f"model.layers.{i}.", f"blk.{i}."
        b.add(s + "input_layernorm.weight", d + "attn_norm.weight", (h,))
        for proj, dst, rows in (("q", "attn_q", hp.n_head * hd), ("k", "attn_k", hp.n_head_kv * hd),
                                ("v", "attn_v", hp.n_head_kv * hd)):
            b.add(f"{s}self_attn.{proj}_proj.weight", f"{d}{dst}.weight", (rows, h))
            if attn_bias:
                b.add(f"{s}self_attn.{proj}_proj.bias", f"{d}{dst}.bias", (rows,))
        b.add(s + "self_attn.o_proj.weight", d + "attn_output.weight", (h, hp.n_head * hd))
        if attn_bias:
            b.add(s + "self_attn.o_proj.bias", d + "attn_output.bias", (h,))
        b.add(s + "self_attn.q_norm.weight", d + "attn_q_norm.weight", (hd,))
        b.add(s + "self_attn.k_norm.weight", d + "attn_k_norm.weight", (hd,))
        b.add(s + "post_attention_layernorm.weight", d + "ffn_norm.weight", (h,))
        # the router decides which experts run: never rounded (llama.cpp's converter keeps it f32 too)
        b.add(s + "mlp.gate.weight", d + "ffn_gate_inp.weight", (hp.n_expert, h), keep_f32=True)
        experts = range(hp.n_expert)
        for proj, dst, shape in (("gate_proj", "ffn_gate_exps", (hp.expert_ff, h)),
                                 ("up_proj", "ffn_up_exps", (hp.expert_ff, h)),
                                 ("down_proj", "ffn_down_exps", (h, hp.expert_ff))):
            b.add_experts([f"{s}mlp.experts.{e}.{proj}.weight" for e in experts], f"{d}{dst}.weight", shape)


def plan_from_hf(ckpt: Checkpoint, outtype: str, name: str, *, cache_capable: bool = False) -> GGUFPlan:
    emb = ckpt.info("model.embed_tokens.weight")
    hp = hparams(ckpt.config, emb.shape[0]).checked()  # config sizes bounded before any loop
    plan = GGUFPlan(FAMILY.arch(cache_capable))
    b = m.Builder(ckpt, plan, outtype)
    b.add("model.embed_tokens.weight", "token_embd.weight", (hp.n_vocab, hp.hidden))
    b.add("model.norm.weight", "output_norm.weight", (hp.hidden,))
    # llada-moe requires output.weight (no tied fallback in its loader): a tied head is written out
    head = "model.embed_tokens.weight" if hp.tied else "lm_head.weight"
    b.add(head, "output.weight", (hp.n_vocab, hp.hidden))
    add_moe_layers(b, hp)
    b.check_all_used("LLaDA-MoE", ignore=lambda n: hp.tied and n == "lm_head.weight")
    return m.finish(plan, ckpt, FAMILY, hp, cache_capable, name)
