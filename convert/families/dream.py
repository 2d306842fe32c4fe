"""Dream (Dream-org `DreamModel`: Dream-v0-Base-7B, Dream-v0-Instruct-7B) -> `dream` GGUF.

Facts from Dream-org's `modeling_dream.py` / `configuration_dream.py` (shipped with the checkpoints):
the network is Qwen2's (Dream is initialised from Qwen2.5-7B): `model.embed_tokens`,
`model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
mlp.{gate,up,down}_proj}`, `model.norm`, `lm_head`; Q/K/V projections have biases, the output
projection has none; RMSNorm; SiLU-gated MLP; RoPE by `rotate_half` ("neox" in llama.cpp) over
head_dim = hidden_size / num_attention_heads; attention is bidirectional. Dream keeps the
autoregressive alignment: the logits at position i predict token i + 1 (its generation_utils
shift them right by one), hence `diffusion.shift_logits = true`.

llama.cpp's `dream` graph (src/models/dream.cpp) is qwen2's (src/models/qwen2.cpp) without the KV
cache: same tensors, same neox RoPE. `--cache-capable` writes `qwen2` with `attention.causal = false`.
"""

from __future__ import annotations

from typing import Any

from dgchat.convert.checkpoint import Checkpoint
from dgchat.convert.errors import ConvertError
from dgchat.convert.families import masked as m
from dgchat.convert.writer import GGUFPlan

NAME = "dream"
HF_ARCHITECTURES = ("DreamModel",)

FAMILY = m.Family(
    name=NAME,
    gguf_arch="dream",
    cache_arch="qwen2",
    shift_logits=True,
    preset="dream",
    # Dream-org/Dream-v0-Instruct-7B model card: diffusion_generate(..., max_new_tokens=512,
    # steps=512, temperature=0.2, top_p=0.95, alg="entropy", alg_temp=0.); eps 1e-3 is the
    # DreamGenerationConfig default (generation_utils.py)
    defaults={"steps": 512, "gen_length": 512, "algorithm": "entropy", "eps": 1e-3, "temperature": 0.2,
              "top_p": 0.95},
    defaults_source="Dream-v0-Instruct-7B model card: max_new_tokens=512, steps=512, temperature=0.2, "
    "top_p=0.95, alg=entropy; eps=1e-3 from DreamGenerationConfig",
    mask_texts=("<|mask|>",),
)

P = "model."


def hparams(cfg: dict[str, Any], n_vocab: int) -> m.Hparams:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConvertError(f"config.json: hidden_act={act!r} is not supported (Dream uses 'silu')")
    m.refuse(bool(cfg.get("use_sliding_window")), "use_sliding_window")
    m.no_rope_scaling(cfg)
    h = int(m.require(cfg, "hidden_size"))
    n_head = int(m.require(cfg, "num_attention_heads"))
    n_kv = int(cfg.get("num_key_value_heads") or n_head)
    if h % n_head or n_head % n_kv:
        raise ConvertError(f"config.json: hidden_size {h} / num_attention_heads {n_head} / num_key_value_heads {n_kv} do not divide")
    return m.Hparams(
        n_vocab=n_vocab, hidden=h, n_layer=int(m.require(cfg, "num_hidden_layers")), n_head=n_head, n_head_kv=n_kv,
        head_dim=h // n_head, ff=int(m.require(cfg, "intermediate_size")),
        rope_theta=float(cfg.get("rope_theta", 10_000.0)), rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        context_length=int(cfg.get("max_position_embeddings", 32_768)),
        tied=bool(cfg.get("tie_word_embeddings", False)),
    )


def plan_from_hf(ckpt: Checkpoint, outtype: str, name: str, *, cache_capable: bool = False) -> GGUFPlan:
    emb = ckpt.info(P + "embed_tokens.weight")
    hp = hparams(ckpt.config, emb.shape[0]).checked()  # config sizes bounded before any loop
    h, hd, ff = hp.hidden, hp.head_dim, hp.ff
    plan = GGUFPlan(FAMILY.arch(cache_capable))
    b = m.Builder(ckpt, plan, outtype)
    b.add(P + "embed_tokens.weight", "token_embd.weight", (hp.n_vocab, h))
    b.add(P + "norm.weight", "output_norm.weight", (h,))
    if not hp.tied:
        b.add("lm_head.weight", "output.weight", (hp.n_vocab, h))
    for i in range(hp.n_layer):
        s, d = f"{P}layers.{i}.", f"blk.{i}."
        b.add(s + "input_layernorm.weight", d + "attn_norm.weight", (h,))
        for proj, dst, rows in (("q", "attn_q", hp.n_head * hd), ("k", "attn_k", hp.n_head_kv * hd),
                                ("v", "attn_v", hp.n_head_kv * hd)):
            b.add(f"{s}self_attn.{proj}_proj.weight", f"{d}{dst}.weight", (rows, h))
            b.add(f"{s}self_attn.{proj}_proj.bias", f"{d}{dst}.bias", (rows,))
        b.add(s + "self_attn.o_proj.weight", d + "attn_output.weight", (h, hp.n_head * hd))
        b.add(s + "post_attention_layernorm.weight", d + "ffn_norm.weight", (h,))
        b.add(s + "mlp.gate_proj.weight", d + "ffn_gate.weight", (ff, h))
        b.add(s + "mlp.up_proj.weight", d + "ffn_up.weight", (ff, h))
        b.add(s + "mlp.down_proj.weight", d + "ffn_down.weight", (h, ff))
    b.check_all_used("Dream", ignore=lambda n: hp.tied and n == "lm_head.weight")
    return m.finish(plan, ckpt, FAMILY, hp, cache_capable, name)
