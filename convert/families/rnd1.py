"""RND1 (Radical Numerics `RND1LM`: RND1-Base-0910) -> `rnd1` GGUF.

Facts from Radical Numerics' `modeling_rnd.py` / `configuration_rnd.py`: RND1 is Qwen3-30B-A3B
(Qwen3-MoE) converted to a bidirectional masked-diffusion model. Layers are Qwen3-MoE's:
`model.layers.N.self_attn.{q,k,v,o}_proj` (bias = `attention_bias`), per-head
`self_attn.{q,k}_norm` (RMSNorm over `head_dim`, before RoPE), RoPE by `rotate_half` ("neox"),
router `mlp.gate` -> softmax -> top-k, renormalised when `norm_topk_prob` (true for RND1), experts
`mlp.experts.E.{gate,up,down}_proj`; `model.embed_tokens`, `model.norm`, `lm_head`; mask token
`mask_token_id` (151669). Logits keep the autoregressive alignment (llama.cpp's diffusion example
shifts them when the file does not say otherwise; dllm's RND1 trainer shifts them the same way).

llama.cpp's `rnd1` graph (src/models/rnd1.cpp) is `qwen3moe`'s (src/models/qwen3moe.cpp) without a
KV cache; both renormalise the top-k weights unconditionally, so RND1 with `norm_topk_prob = false`
is refused. `--cache-capable` writes `qwen3moe` with `attention.causal = false`.
"""

from __future__ import annotations

from typing import Any

from dgchat.convert.checkpoint import Checkpoint
from dgchat.convert.errors import ConvertError
from dgchat.convert.families import masked as m
from dgchat.convert.families.llada_moe import add_moe_layers
from dgchat.convert.writer import GGUFPlan

NAME = "rnd1"
HF_ARCHITECTURES = ("RND1LM", "RND1")

FAMILY = m.Family(
    name=NAME,
    gguf_arch="rnd1",
    cache_arch="qwen3moe",
    shift_logits=True,
    preset="rnd1",
    # llama.cpp examples/diffusion/README.md, RND1 example: --diffusion-algorithm 1 (entropy)
    # --diffusion-steps 256 --temp 0.5 --diffusion-eps 0.001
    defaults={"steps": 256, "gen_length": 256, "algorithm": "entropy", "eps": 1e-3, "temperature": 0.5},
    defaults_source="llama.cpp examples/diffusion/README.md (RND1): steps=256, algorithm=entropy, temp=0.5, "
    "eps=0.001",
)


def hparams(cfg: dict[str, Any], n_vocab: int) -> m.Hparams:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConvertError(f"config.json: hidden_act={act!r} is not supported")
    m.no_rope_scaling(cfg)
    m.refuse(bool(cfg.get("use_sliding_window")), "use_sliding_window")
    m.refuse(cfg.get("norm_topk_prob") is not True, "norm_topk_prob other than true (llama.cpp renormalises)")
    m.refuse(int(cfg.get("decoder_sparse_step", 1) or 1) != 1 or bool(cfg.get("mlp_only_layers")),
             "dense layers (decoder_sparse_step / mlp_only_layers)")
    h = int(m.require(cfg, "hidden_size"))
    n_head = int(m.require(cfg, "num_attention_heads"))
    n_kv = int(cfg.get("num_key_value_heads") or n_head)
    head_dim = int(cfg.get("head_dim") or h // n_head)
    if n_head % n_kv:
        raise ConvertError(f"config.json: num_attention_heads {n_head} / num_key_value_heads {n_kv} do not divide")
    expert_ff = int(m.require(cfg, "moe_intermediate_size"))
    return m.Hparams(
        n_vocab=n_vocab, hidden=h, n_layer=int(m.require(cfg, "num_hidden_layers")), n_head=n_head, n_head_kv=n_kv,
        head_dim=head_dim, ff=int(cfg.get("intermediate_size") or expert_ff),
        rope_theta=float(cfg.get("rope_theta", 1_000_000.0)), rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        context_length=int(cfg.get("max_position_embeddings", 40_960)),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        n_expert=int(m.require(cfg, "num_experts")), n_expert_used=int(m.require(cfg, "num_experts_per_tok")),
        expert_ff=expert_ff,
    )


def plan_from_hf(ckpt: Checkpoint, outtype: str, name: str, *, cache_capable: bool = False) -> GGUFPlan:
    emb = ckpt.info("model.embed_tokens.weight")
    hp = hparams(ckpt.config, emb.shape[0]).checked()  # config sizes bounded before any loop
    plan = GGUFPlan(FAMILY.arch(cache_capable))
    b = m.Builder(ckpt, plan, outtype)
    b.add("model.embed_tokens.weight", "token_embd.weight", (hp.n_vocab, hp.hidden))
    b.add("model.norm.weight", "output_norm.weight", (hp.hidden,))
    if not hp.tied:
        b.add("lm_head.weight", "output.weight", (hp.n_vocab, hp.hidden))
    add_moe_layers(b, hp, attn_bias=bool(ckpt.config.get("attention_bias")))
    b.check_all_used("RND1", ignore=lambda n: hp.tied and n == "lm_head.weight")
    return m.finish(plan, ckpt, FAMILY, hp, cache_capable, name)
