"""LLaDA (GSAI-ML `LLaDAModelLM`: LLaDA-8B-Base, LLaDA-8B-Instruct, LLaDA-1.5) -> `llada` GGUF.

Facts from GSAI-ML's `modeling_llada.py` / `configuration_llada.py` (shipped with the checkpoints):

- config.json: `d_model`, `n_heads`, `n_kv_heads` (None: `n_heads`, or 1 with
  `multi_query_attention`), `n_layers`, `mlp_hidden_size` (None: `mlp_ratio * d_model`),
  `rope_theta`, `rms_norm_eps`, `max_sequence_length`, `embedding_size` / `vocab_size`,
  `weight_tying`, `include_bias`, `include_qkv_bias`, `mask_token_id`;
- `LLaDALlamaBlock`: x += attn_out(attention(RoPE(q_proj(attn_norm(x))), RoPE(k_proj(..)), v_proj(..)));
  x += ff_out(silu(ff_proj(ff_norm(x))) * up_proj(ff_norm(x))); RMSNorm; head_dim = d_model / n_heads;
  RoPE by `rotate_half` (dimension i pairs with i + head_dim/2); no attention mask at all;
- `LLaDAModel`: `model.transformer.wte`, `model.transformer.blocks.N.*`, `model.transformer.ln_f`,
  and `model.transformer.ff_out` as the LM head unless `weight_tying`. Logits are not shifted.

llama.cpp's `llada` graph (src/models/llada.cpp) is that block with "normal" RoPE over adjacent pairs,
so Q/K rows are permuted as llama.cpp's converter does (conversion/llada.py); it applies Q/K/V
biases but no attention-output or MLP biases. The cache-capable twin is `llama`
(src/models/llama.cpp): same tensors, same RoPE type, plus a KV cache.
"""

from __future__ import annotations

from typing import Any

from dgchat.convert.checkpoint import Checkpoint
from dgchat.convert.errors import ConvertError
from dgchat.convert.families import masked as m
from dgchat.convert.writer import GGUFPlan

NAME = "llada"
HF_ARCHITECTURES = ("LLaDAModelLM",)

FAMILY = m.Family(
    name=NAME,
    gguf_arch="llada",
    cache_arch="llama",
    shift_logits=False,
    preset="llada",
    # GSAI-ML/LLaDA generate.py, main(): generate(model, input_ids, steps=128, gen_length=128,
    # block_length=32, temperature=0., cfg_scale=0., remasking='low_confidence'); LLaDA-1.5's README
    # uses the same call. dgchat's "confidence" algorithm is low_confidence remasking.
    defaults={"steps": 128, "gen_length": 128, "block_length": 32, "algorithm": "confidence", "temperature": 0.0},
    defaults_source="GSAI-ML/LLaDA generate.py: steps=128, gen_length=128, block_length=32, temperature=0, "
    "remasking=low_confidence",
    mask_texts=("<|mdm_mask|>",),
    add_bos=True,  # llama.cpp conversion/llada.py writes add_bos_token = true for LLaDA
)

P = "model.transformer."


def hparams(cfg: dict[str, Any], n_vocab: int) -> m.Hparams:
    for key, want in (("block_type", "llama"), ("activation_type", "silu"), ("layer_norm_type", "rms")):
        if cfg.get(key, want) != want:
            raise ConvertError(f"config.json: {key}={cfg[key]!r} is not supported (LLaDA uses {want!r})")
    m.refuse(not cfg.get("rope", True), "rope=false")
    m.refuse(bool(cfg.get("alibi")), "alibi")
    m.refuse(bool(cfg.get("attention_layer_norm")), "attention_layer_norm (Q/K layer norm)")
    m.refuse(bool(cfg.get("include_bias")), "include_bias (attn_out / MLP biases; llama.cpp's llada graph drops them)")
    m.refuse(bool(cfg.get("bias_for_layer_norm")), "bias_for_layer_norm")
    m.refuse(cfg.get("layer_norm_with_affine", True) is False, "layer_norm_with_affine=false")
    m.refuse(bool(cfg.get("input_emb_norm")), "input_emb_norm")
    m.refuse(bool(cfg.get("scale_logits")), "scale_logits")
    m.refuse(cfg.get("clip_qkv") is not None, "clip_qkv")
    m.no_rope_scaling(cfg)
    d = int(m.require(cfg, "d_model"))
    n_head = int(m.require(cfg, "n_heads"))
    n_kv = cfg.get("n_kv_heads")
    if n_kv is None:
        n_kv = 1 if cfg.get("multi_query_attention") else n_head
    if d % n_head or n_head % int(n_kv):
        raise ConvertError(f"config.json: d_model {d} / n_heads {n_head} / n_kv_heads {n_kv} do not divide")
    ff = cfg.get("mlp_hidden_size") or int(cfg.get("mlp_ratio", 4)) * d
    return m.Hparams(
        n_vocab=n_vocab, hidden=d, n_layer=int(m.require(cfg, "n_layers")), n_head=n_head, n_head_kv=int(n_kv),
        head_dim=d // n_head, ff=int(ff), rope_theta=float(cfg.get("rope_theta", 10_000.0)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-5)), context_length=int(cfg.get("max_sequence_length", 4096)),
        tied=bool(cfg.get("weight_tying", False)),
    )


def plan_from_hf(ckpt: Checkpoint, outtype: str, name: str, *, cache_capable: bool = False) -> GGUFPlan:
    emb = ckpt.info(P + "wte.weight")
    hp = hparams(ckpt.config, emb.shape[0]).checked()  # config sizes bounded before any loop
    h, hd, ff = hp.hidden, hp.head_dim, hp.ff
    plan = GGUFPlan(FAMILY.arch(cache_capable))
    b = m.Builder(ckpt, plan, outtype)
    b.add(P + "wte.weight", "token_embd.weight", (hp.n_vocab, h))
    b.add(P + "ln_f.weight", "output_norm.weight", (h,))
    if not hp.tied:
        b.add(P + "ff_out.weight", "output.weight", (hp.n_vocab, h))
    qkv_bias = bool(ckpt.config.get("include_qkv_bias"))
    q_perm, k_perm = m.rope_pairs(hp.n_head), m.rope_pairs(hp.n_head_kv)
    for i in range(hp.n_layer):
        s, d = f"{P}blocks.{i}.", f"blk.{i}."
        b.add(s + "attn_norm.weight", d + "attn_norm.weight", (h,))
        b.add(s + "q_proj.weight", d + "attn_q.weight", (hp.n_head * hd, h), transform=q_perm)
        b.add(s + "k_proj.weight", d + "attn_k.weight", (hp.n_head_kv * hd, h), transform=k_perm)
        b.add(s + "v_proj.weight", d + "attn_v.weight", (hp.n_head_kv * hd, h))
        if qkv_bias:
            b.add(s + "q_proj.bias", d + "attn_q.bias", (hp.n_head * hd,), transform=q_perm)
            b.add(s + "k_proj.bias", d + "attn_k.bias", (hp.n_head_kv * hd,), transform=k_perm)
            b.add(s + "v_proj.bias", d + "attn_v.bias", (hp.n_head_kv * hd,))
        b.add(s + "attn_out.weight", d + "attn_output.weight", (h, hp.n_head * hd))
        b.add(s + "ff_norm.weight", d + "ffn_norm.weight", (h,))
        b.add(s + "ff_proj.weight", d + "ffn_gate.weight", (ff, h))
        b.add(s + "up_proj.weight", d + "ffn_up.weight", (ff, h))
        b.add(s + "ff_out.weight", d + "ffn_down.weight", (h, ff))
    # a tied checkpoint may still store the head; it is the embedding and is not written twice
    b.check_all_used("LLaDA", ignore=lambda n: hp.tied and n == P + "ff_out.weight")
    return m.finish(plan, ckpt, FAMILY, hp, cache_capable, name)
