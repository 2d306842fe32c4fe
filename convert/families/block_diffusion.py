"""Block diffusion (SDAR, dllm's BD3LM) -> `qwen3` / `qwen2` GGUF with dgchat's block keys.

The layout written is docs/BLOCK_DIFFUSION.md's: llama.cpp's ordinary `qwen3` (or `qwen2`) keys and
tensor names, so the file is a valid causal LM for stock llama.cpp, no `attention.causal` key (the
engine switches causal attention off at run time), plus `dgchat.family = "block-diffusion"`,
`dgchat.block_diffusion.variant`, `dgchat.engine.attention_block` (the block size the patched
engine masks with), `diffusion.shift_logits = false`, the mask token and the published sampler
defaults.

Facts relied on, and where they were read:

SDAR (repository JetAstra/SDAR, commit c2041a8):
- `training/model/SDAR-4B-Chat/config.json` (and SDAR-8B-Chat's): `architectures
  ["SDARForCausalLM"]`, `model_type "sdar"`, an `auto_map` to custom code (never run here),
  `block_size 4`, `mask_token_id 151669`, an explicit `head_dim` (128, not hidden/heads),
  `rope_theta 1000000`, `rope_scaling null`, `rms_norm_eps 1e-6`, `hidden_act silu`,
  `attention_bias false`, `use_sliding_window false`, `tie_word_embeddings false`,
  `vocab_size 151936`, `max_position_embeddings 32768`. The 8B folder's `config copy.json` has
  neither `block_size` nor `mask_token_id`: published configs can lack both.
- `modeling_sdar.py`: the layers are Qwen3's (`model.embed_tokens`, `model.layers.N.{input_layernorm,
  self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm (RMSNorm over head_dim, before RoPE),
  post_attention_layernorm, mlp.{gate,up,down}_proj}`, `model.norm`, `lm_head`), RoPE by
  `rotate_half` (llama.cpp's NEOX rotation for `qwen3`: no row permutation), q/k/v/o biases only
  with `attention_bias`.
- `tokenizer_config.json`: `mask_token "<|MASK|>"` (id 151669 in `added_tokens_decoder`),
  `eos_token "<|endoftext|>"`, `add_bos_token false`; `added_tokens.json` spells the same id
  `<MASK>`; `generation_config.json`: `eos_token_id [151645, 151643]`; `chat_template.jinja`:
  ChatML.
- `generate.py`: `block_diffusion_generate`, command-line defaults `--block_length 4`,
  `--denoising_steps 4`, `--remasking_strategy low_confidence_dynamic`,
  `--confidence_threshold 0.85`; logits are not shifted. `README.md` ("Evaluation"): "SDAR family:
  greedy decoding with `block_length = 4`, `denoising_steps = 4`" -> temperature 0.
- /work/shared/sdar-facts.md (the project's notes from the same repository): fall back to block 4
  and to `<|MASK|>`'s id 151669 when a config lacks them, and say so.

BD3LM (repository ZHZisZZ/dllm, commit ca17675; checkpoint `dllm-hub/Qwen3-0.6B-diffusion-bd3lm-v0.1`):
- `dllm/pipelines/a2d/models/qwen3/modeling_qwen3.py`: `A2DQwen3Config(transformers.Qwen3Config)`
  with `model_type = "a2d-qwen3"`, `A2DQwen3LMHeadModel(transformers.Qwen3ForCausalLM)`: Qwen3's
  tensors unchanged, only the attention mask differs; `qwen2/modeling_qwen2.py` likewise
  (`a2d-qwen2`, `A2DQwen2LMHeadModel`, Qwen2's tensors: q/k/v biases, no q/k norm).
  `save_pretrained` of such a model (the trainer's checkpoints) writes `architectures
  ["A2DQwen3LMHeadModel"]` and `model_type "a2d-qwen3"`; `dllm/pipelines/a2d/convert.py` removes
  the source's `architectures` and `auto_map` and saves the A2D config itself, so a config may
  carry the `model_type` alone: either is enough here.
- The config holds nothing BD3LM-specific: no `block_size`, no mask id. The MDLM sibling
  (`Qwen3-0.6B-diffusion-mdlm-v0.1`, fully bidirectional: not block diffusion) has the same
  `model_type`. `dllm/core/trainers/bd3lm.py` keeps `block_size` (32) in its training arguments
  only. So an A2D checkpoint is taken as BD3LM when (1) config.json has `block_size` (then that
  block), else (2) its folder name says `bd3lm` (the Hugging Face repository's name), else (3) its
  model card README.md mentions BD3LM and not MDLM; a name or card that says MDLM is refused
  (masked diffusion over the whole answer, not block diffusion), and an A2D checkpoint that says
  neither is refused with how to say it.
- `dllm/utils/models.py` `get_tokenizer`: for A2D Qwen2/Qwen3 models,
  `add_special_tokens({"mask_token": "<|mask|>"})` (the next free id, 151669 on Qwen3's
  tokenizer) and `eot_token "<|im_end|>"`.
- `examples/a2d/bd3lm/sample.py` / `dllm/core/samplers/bd3lm.py` `BD3LMSamplerConfig`:
  `steps 128`, `max_new_tokens 128`, `block_size 32` (4 blocks: 32 steps a block),
  `temperature 0.0`, `remasking "low_confidence"`, `right_shift_logits False` (no logit shift).

llama.cpp (vendored llama-cpp-python 0.3.36): `conversion/qwen.py` (`Qwen2Model` registers
`Qwen2ForCausalLM`, `Qwen3Model` registers `Qwen3ForCausalLM`), `conversion/base.py`
`TextModel.set_gguf_parameters` (block_count, context_length, embedding_length,
feed_forward_length, head_count, head_count_kv, rope.freq_base, layer_norm_rms_epsilon, and
key_length / value_length whenever config.json has `head_dim`), gguf-py `constants.py` (tensor
names `token_embd`, `output_norm`, `output`, `blk.N.{attn_norm, attn_q, attn_k, attn_v,
attn_q_norm, attn_k_norm, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}`), and
`src/models/qwen3.cpp` / `qwen2.cpp`: `output` is optional (tied to `token_embd` when absent),
q/k/v biases are optional in both, `qwen3` requires `attn_q_norm` / `attn_k_norm` and loads no
`attn_output` bias, `qwen2` sizes `attn_q` / `attn_output` as n_embd x n_embd (head_dim * heads
must equal hidden). Both are NEOX RoPE. The vocabulary is padded to the embedding rows with
`[PADn]` unused tokens as llama.cpp's `_set_vocab_gpt2` does (dgchat.convert.tokenizer_gguf).

Plain `Qwen3ForCausalLM` / `Qwen2ForCausalLM` checkpoints are autoregressive and refused, unless
config.json carries SDAR's own keys (`block_size` and `mask_token_id`): then they are converted as
the `sdar` variant, with a note. `--cache-capable` is refused: this family always has a KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType, TokenType

from dgchat.convert.checkpoint import Checkpoint
from dgchat.convert.errors import ConvertError
from dgchat.convert.families import masked as m
from dgchat.convert.tokenizer_gguf import Vocab, read_hf_tokenizer
from dgchat.convert.writer import GGUFPlan, finish_plan
from dgchat.model_backend.architectures import MAX_ATTENTION_BLOCK

NAME = "block-diffusion"
# config.json `architectures` this family converts (the registry's first match)
HF_ARCHITECTURES = ("SDARForCausalLM", "A2DQwen3LMHeadModel", "A2DQwen2LMHeadModel")
# the llama.cpp architecture of each declared layout
_A2D = {"A2DQwen3LMHeadModel": "qwen3", "A2DQwen2LMHeadModel": "qwen2", "a2d-qwen3": "qwen3", "a2d-qwen2": "qwen2"}
_AR = {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2", "qwen3": "qwen3", "qwen2": "qwen2"}

FORMAT_VERSION = m.FORMAT_VERSION
BLOCK_RANGE = (1, MAX_ATTENTION_BLOCK)  # docs/BLOCK_DIFFUSION.md: dgchat.engine.attention_block
SDAR_DEFAULT_BLOCK = 4  # SDAR's published block size (generate.py --block_length, sdar-facts.md)
BD3LM_BLOCK = 32  # dllm's BD3LM block_size (sample.py, trainers/bd3lm.py)
SDAR_MASK_ID = 151669  # <|MASK|> in SDAR's tokenizer (tokenizer_config.json added_tokens_decoder)
MAX_TOKENS = 512  # dgchat's answer-length default for the family (docs/BLOCK_DIFFUSION.md)
_README_LIMIT = 256 * 1024  # bytes of a model card read when looking for "bd3lm" / "mdlm"


@dataclass(frozen=True)
class Variant:
    """The published sampler of one variant; written as dgchat's default keys."""

    name: str
    steps: int  # denoising passes per block at most
    threshold: float | None  # SDAR's dynamic low-confidence threshold; None: a static schedule
    temperature: float
    mask_texts: tuple[str, ...]  # the mask token's text, preferred spelling first
    defaults_source: str


VARIANTS = {
    "sdar": Variant(
        "sdar", steps=4, threshold=0.85, temperature=0.0, mask_texts=("<|MASK|>", "<MASK>", "<|mask|>"),
        defaults_source="JetAstra/SDAR generate.py (block_diffusion_generate; --denoising_steps 4, "
        "--remasking_strategy low_confidence_dynamic, --confidence_threshold 0.85); README.md evaluation: "
        "greedy decoding (temperature 0) with block_length 4, denoising_steps 4; max_tokens 512: dgchat's "
        "answer-length default",
    ),
    "bd3lm": Variant(
        "bd3lm", steps=32, threshold=None, temperature=0.0, mask_texts=("<|mask|>", "<|MASK|>", "<MASK>"),
        defaults_source="ZHZisZZ/dllm examples/a2d/bd3lm/sample.py (BD3LMSamplerConfig): steps 128 over "
        "max_new_tokens 128 in blocks of 32 = 32 steps a block, temperature 0.0, remasking low_confidence, "
        "right_shift_logits False; max_tokens 512: dgchat's answer-length default",
    ),
}


def _archs(cfg: dict[str, Any]) -> list[str]:
    archs = cfg.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def claims_config(cfg: dict[str, Any]) -> bool:
    """Whether this family answers for a config.json the registry matched by no `architectures`
    entry: dllm's A2D configs (whose `architectures` may be missing) and plain Qwen3 / Qwen2 ones
    (refused with an explanation, or converted when they carry SDAR's keys)."""
    mt = cfg.get("model_type")
    return mt == "sdar" or mt in _A2D or mt in _AR or any(a in _AR for a in _archs(cfg))


# -- what the checkpoint is ------------------------------------------------------------------------


@dataclass
class Detected:
    variant: str  # "sdar" | "bd3lm"
    arch: str | None  # "qwen3" | "qwen2"; None: SDAR, decided by its tensors
    block: int
    declared: str  # how the checkpoint declared itself, for notes and errors
    notes: list[str] = field(default_factory=list)


def _int_key(cfg: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ConvertError(f"config.json: {key} = {value!r:.40} is not an integer in [{lo}, {hi}]")
    return value


def _model_card_says(folder: Path) -> set[str]:
    """Which of "bd3lm" / "mdlm" the checkpoint's model card (README.md) mentions."""
    try:
        with open(folder / "README.md", "rb") as fh:
            text = fh.read(_README_LIMIT).decode("utf-8", "replace").lower()
    except OSError:
        return set()
    return {w for w in ("bd3lm", "mdlm") if w in text}


def _a2d_objective(folder: Path) -> str | None:
    """"bd3lm", "mdlm" or None, from the folder's name, then its model card."""
    name = folder.resolve().name.lower()
    if "bd3lm" in name:
        return "bd3lm"
    if "mdlm" in name:
        return "mdlm"
    said = _model_card_says(folder)
    if said == {"bd3lm"}:
        return "bd3lm"
    if said == {"mdlm"}:
        return "mdlm"
    return None


def detect(ckpt: Checkpoint) -> Detected:
    cfg = ckpt.config
    archs = _archs(cfg)
    mt = cfg.get("model_type")
    lo, hi = BLOCK_RANGE
    block = _int_key(cfg, "block_size", lo, hi)
    if "SDARForCausalLM" in archs or mt == "sdar":
        det = Detected("sdar", None, block or SDAR_DEFAULT_BLOCK, "SDARForCausalLM")
        if block is None:
            det.notes.append(f"config.json has no block_size: SDAR's published block size {SDAR_DEFAULT_BLOCK} "
                             "is assumed (JetAstra/SDAR generate.py --block_length)")
        return det
    a2d = next((a for a in archs if a in _A2D), None) or (mt if mt in _A2D else None)
    if a2d is not None:
        declared = a2d if a2d.startswith("A2D") else f"model_type {a2d}"
        if block is not None:
            det = Detected("bd3lm", _A2D[a2d], block, declared)
            det.notes.append(f"dllm A2D checkpoint with config.json block_size {block}: converted as BD3LM")
            return det
        objective = _a2d_objective(ckpt.folder)
        if objective == "mdlm":
            raise ConvertError(f"{ckpt.folder.name} is a dllm MDLM checkpoint (masked diffusion over the whole "
                               "answer), not block diffusion; dgchat converts SDAR and BD3LM checkpoints")
        if objective is None:
            raise ConvertError(f"{ckpt.folder.name}: cannot tell whether this dllm A2D checkpoint ({declared}) was "
                               "trained as BD3LM (block diffusion) or MDLM; its config.json says neither. If it is "
                               "BD3LM, keep 'bd3lm' in the folder's name (as in "
                               "dllm-hub/Qwen3-0.6B-diffusion-bd3lm-v0.1) or add "
                               f"\"block_size\": {BD3LM_BLOCK} to config.json")
        det = Detected("bd3lm", _A2D[a2d], BD3LM_BLOCK, declared)
        det.notes.append(f"dllm A2D checkpoint taken as BD3LM (its name or model card says so): block {BD3LM_BLOCK}, "
                         "dllm's BD3LM block_size")
        return det
    ar = next((a for a in archs if a in _AR), None) or (mt if mt in _AR else None)
    if ar is not None:
        declared = ar if ar[0].isupper() else f"model_type {ar}"
        if block is None or cfg.get("mask_token_id") is None:
            raise ConvertError(f"{ckpt.folder.name} ({declared}) is an autoregressive model, not a block-diffusion "
                               "checkpoint; dgchat converts SDAR (SDARForCausalLM) and BD3LM (dllm's A2D Qwen3/Qwen2) "
                               "block-diffusion checkpoints")
        det = Detected("sdar", _AR[ar], block, declared)
        det.notes.append(f"{declared} with SDAR's block_size and mask_token_id in config.json: converted as an SDAR "
                         "block-diffusion model")
        return det
    found = ", ".join(archs) or f"model_type {mt!r}"
    raise ConvertError(f"unsupported architecture {found}; supported: {', '.join(HF_ARCHITECTURES)}")


# -- hyper-parameters and tensors -----------------------------------------------------------------


P = "model."


def _rope_theta(cfg: dict[str, Any]) -> float:
    """rope_theta from the top level (transformers 4) or `rope_parameters` (transformers 5)."""
    m.no_rope_scaling(cfg)
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params:
        kind = params.get("rope_type", "default")
        if kind != "default":
            raise ConvertError(f"config.json: rope_parameters rope_type {kind!r:.40} is not supported")
        theta = params.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))
    else:
        theta = cfg.get("rope_theta", 1_000_000.0)
    return theta


def hparams(cfg: dict[str, Any], n_vocab: int, arch: str) -> tuple[m.Hparams, bool]:
    """(hyper-parameters, whether config.json states head_dim). Checked (m.check_sizes)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConvertError(f"config.json: hidden_act={act!r:.40} is not supported (Qwen layers use 'silu')")
    m.refuse(bool(cfg.get("use_sliding_window")), "use_sliding_window")
    m.refuse(arch == "qwen3" and bool(cfg.get("attention_bias")),
             "attention_bias (an attn_output bias, which llama.cpp's qwen3 graph does not load)")
    h = m.require(cfg, "hidden_size")
    n_head = m.require(cfg, "num_attention_heads")
    n_kv = cfg.get("num_key_value_heads") or n_head
    explicit = cfg.get("head_dim") is not None
    m.check_sizes({"hidden": h, "n_head": n_head, "n_head_kv": n_kv})
    head_dim = cfg["head_dim"] if explicit else h // n_head
    if n_head % n_kv:
        raise ConvertError(f"config.json: num_attention_heads {n_head} / num_key_value_heads {n_kv} do not divide")
    if arch == "qwen2" and head_dim * n_head != h:
        raise ConvertError(f"config.json: head_dim {head_dim} x {n_head} heads != hidden_size {h} "
                           "(llama.cpp's qwen2 graph needs head_dim = hidden_size / num_attention_heads)")
    theta = _rope_theta(cfg)
    hp = m.Hparams(
        n_vocab=n_vocab, hidden=h, n_layer=m.require(cfg, "num_hidden_layers"), n_head=n_head, n_head_kv=n_kv,
        head_dim=head_dim, ff=m.require(cfg, "intermediate_size"), rope_theta=theta,
        rms_eps=cfg.get("rms_norm_eps", 1e-6), context_length=cfg.get("max_position_embeddings", 32_768),
        tied=bool(cfg.get("tie_word_embeddings", False)),
    )
    m.check_sizes({**hp.__dict__, "rope_theta": hp.rope_theta, "rms_eps": hp.rms_eps})
    if hp.head_dim % 2:
        raise ConvertError(f"config.json: head_dim {hp.head_dim} is odd (RoPE rotates pairs)")
    return hp, explicit


def tensor_layout(hp: m.Hparams, arch: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(checkpoint name, GGUF name, shape in numpy order) of every tensor, in the written order.
    Shared with tests/bench/make_fullshape_block.py, so its files cannot drift from this layout."""
    h, hd, ff = hp.hidden, hp.head_dim, hp.ff
    nq, nkv = hp.n_head * hd, hp.n_head_kv * hd
    out = [(P + "embed_tokens.weight", "token_embd.weight", (hp.n_vocab, h)),
           (P + "norm.weight", "output_norm.weight", (h,))]
    if not hp.tied:
        out.append(("lm_head.weight", "output.weight", (hp.n_vocab, h)))
    for i in range(hp.n_layer):
        s, d = f"{P}layers.{i}.", f"blk.{i}."
        out.append((s + "input_layernorm.weight", d + "attn_norm.weight", (h,)))
        for proj, dst, rows in (("q", "attn_q", nq), ("k", "attn_k", nkv), ("v", "attn_v", nkv)):
            out.append((f"{s}self_attn.{proj}_proj.weight", f"{d}{dst}.weight", (rows, h)))
            if arch == "qwen2":
                out.append((f"{s}self_attn.{proj}_proj.bias", f"{d}{dst}.bias", (rows,)))
        if arch == "qwen3":
            out.append((s + "self_attn.q_norm.weight", d + "attn_q_norm.weight", (hd,)))
            out.append((s + "self_attn.k_norm.weight", d + "attn_k_norm.weight", (hd,)))
        out.append((s + "self_attn.o_proj.weight", d + "attn_output.weight", (h, nq)))
        out.append((s + "post_attention_layernorm.weight", d + "ffn_norm.weight", (h,)))
        out.append((s + "mlp.gate_proj.weight", d + "ffn_gate.weight", (ff, h)))
        out.append((s + "mlp.up_proj.weight", d + "ffn_up.weight", (ff, h)))
        out.append((s + "mlp.down_proj.weight", d + "ffn_down.weight", (h, ff)))
    return out


def _sdar_arch(ckpt: Checkpoint) -> str:
    """SDAR's layers are Qwen3's; a checkpoint on Qwen2's layers (q/k/v biases, no q/k norm)
    is written as `qwen2`."""
    first = P + "layers.0.self_attn."
    if not ckpt.has(first + "q_norm.weight") and ckpt.has(first + "q_proj.bias"):
        return "qwen2"
    return "qwen3"


# -- metadata -------------------------------------------------------------------------------------


def write_block_kv(plan: GGUFPlan, variant: str, block: int, source: str, eos_ids: list[int]) -> None:
    """dgchat's keys of the family (docs/BLOCK_DIFFUSION.md, "GGUF layout")."""
    v = VARIANTS[variant]
    lo, hi = BLOCK_RANGE
    if not lo <= block <= hi:
        raise ConvertError(f"block size {block} is outside [{lo}, {hi}]")
    plan.boolean("diffusion.shift_logits", False)
    plan.u32("dgchat.format", FORMAT_VERSION)
    plan.string("dgchat.family", NAME)
    plan.string("dgchat.source", source)
    plan.string("dgchat.block_diffusion.variant", v.name)
    plan.u32("dgchat.engine.attention_block", block)
    plan.u32("dgchat.steps", min(v.steps, block))  # passes per block; more than B would commit nothing
    if v.threshold is not None:
        plan.f32("dgchat.threshold", v.threshold)
    plan.f32("dgchat.temperature", v.temperature)
    plan.u32("dgchat.block_diffusion.max_tokens", MAX_TOKENS)
    plan.string("dgchat.defaults_source", v.defaults_source)
    if eos_ids:
        plan.array("dgchat.diffusion.eos_token_ids", [int(t) for t in eos_ids], GGUFValueType.UINT32)


def _eos_ids(cfg: dict[str, Any], gen: dict[str, Any]) -> list[int]:
    value = gen.get("eos_token_id", cfg.get("eos_token_id"))
    ids = m.token_ids(value)
    return list(dict.fromkeys(ids))


def read_vocab(folder: Path, cfg: dict[str, Any], gen: dict[str, Any], n_vocab: int,
               variant: str) -> tuple[Vocab, list[int], list[str]]:
    """(vocabulary, stop ids, notes): byte-level BPE with Qwen's pre-tokenizer, the mask token,
    eos = the first of generation_config.json's eos_token_id list, eot = the second."""
    notes: list[str] = []
    eos_ids = _eos_ids(cfg, gen)
    fallback = {
        "bos": gen.get("bos_token_id", cfg.get("bos_token_id")),
        "eos": eos_ids[0] if eos_ids else None,
        "pad": gen.get("pad_token_id", cfg.get("pad_token_id")),
        "eot": eos_ids[1] if len(eos_ids) > 1 else None,
    }
    vocab = read_hf_tokenizer(folder, n_vocab=n_vocab, spm_model="llama", fallback_ids=fallback)
    if vocab.model != "gpt2":
        raise ConvertError(f"{folder}: block-diffusion checkpoints use Qwen's byte-level BPE tokenizer; "
                           "this one is not")
    if vocab.pre != "qwen2":
        raise ConvertError(f"{folder}/tokenizer.json: its pre-tokenizer is {vocab.pre!r}, not Qwen's (qwen2); "
                           "llama.cpp would split the text differently")
    if eos_ids:
        vocab.special["eos"] = eos_ids[0]
    else:
        notes.append("no eos_token_id in generation_config.json or config.json: the tokenizer's eos token stops")
    for role, tok in list(vocab.special.items()):
        if not 0 <= tok < n_vocab:
            raise ConvertError(f"{folder}: {role} token id {tok} is outside the vocabulary ({n_vocab})")
    for tok in eos_ids:
        if not 0 <= tok < n_vocab:
            raise ConvertError(f"generation_config.json: eos_token_id {tok} is outside the vocabulary ({n_vocab})")

    v = VARIANTS[variant]
    mask = _int_key(cfg, "mask_token_id", 0, n_vocab - 1)
    how = "config.json mask_token_id"
    if mask is None and "mask" in vocab.special:
        mask, how = vocab.special["mask"], "tokenizer_config.json mask_token"
    if mask is None:
        index = {t: i for i, t in enumerate(vocab.tokens)}
        mask = next((index[t] for t in v.mask_texts if t in index), None)
        how = "the mask token's text"
    if mask is None:
        if SDAR_MASK_ID >= n_vocab:
            raise ConvertError(f"{folder}: no mask token (config.json mask_token_id, tokenizer_config.json mask_token, "
                               f"or a token {' / '.join(v.mask_texts)})")
        mask = SDAR_MASK_ID
        notes.append(f"no mask token in config.json or the tokenizer: id {SDAR_MASK_ID} assumed (SDAR's <|MASK|>, "
                     "the id dllm's get_tokenizer gives <|mask|> on Qwen's tokenizer)")
    elif how != "config.json mask_token_id":
        notes.append(f"mask token id {mask} from {how}")
    if vocab.types[mask] == TokenType.UNUSED:  # a padding row: give it the mask's text
        notes.append(f"mask id {mask} is a padding row of the embedding: written as {v.mask_texts[0]} (control)")
        vocab.tokens[mask] = v.mask_texts[0]
        vocab.types[mask] = int(TokenType.CONTROL)
    vocab.special["mask"] = int(mask)
    if not vocab.chat_template:
        notes.append("the checkpoint has no chat template (tokenizer_config.json or chat_template.jinja)")
    return vocab, eos_ids, notes


# -- the plan -------------------------------------------------------------------------------------


def plan_from_hf(ckpt: Checkpoint, outtype: str, name: str, *, cache_capable: bool = False) -> GGUFPlan:
    det = detect(ckpt)
    if cache_capable:
        raise ConvertError("--cache-capable does not apply to block-diffusion checkpoints: they are written as "
                           "qwen3 / qwen2, which always keep a KV cache")
    arch = det.arch or _sdar_arch(ckpt)
    cfg = ckpt.config
    emb = ckpt.info(P + "embed_tokens.weight")
    if len(emb.shape) != 2:
        raise ConvertError(f"checkpoint: {P}embed_tokens.weight has shape {list(emb.shape)}, expected 2 dimensions")
    hp, explicit = hparams(cfg, emb.shape[0], arch)
    declared_vocab = cfg.get("vocab_size")
    if declared_vocab is not None and declared_vocab != hp.n_vocab:
        raise ConvertError(f"config.json: vocab_size {declared_vocab!r:.20} != the embedding's {hp.n_vocab} rows")
    if arch == "qwen2":
        m.refuse(any(ckpt.has(f"{P}layers.{i}.self_attn.o_proj.bias") for i in range(hp.n_layer)),
                 "an attention output bias on qwen2 layers")
    plan = GGUFPlan(arch)
    b = m.Builder(ckpt, plan, outtype)
    for src, dst, shape in tensor_layout(hp, arch):
        b.add(src, dst, shape)
    b.check_all_used(f"{det.variant} ({arch})", ignore=lambda n: hp.tied and n == "lm_head.weight")
    # llama.cpp's keys for qwen3 / qwen2, without attention.causal: a causal LM until the engine switches it
    m.write_arch_kv(plan, arch, hp, non_causal=False, explicit_head_dim=explicit)
    vocab, eos_ids, vocab_notes = read_vocab(ckpt.folder, cfg, ckpt.generation_config or {}, hp.n_vocab, det.variant)
    vocab.write(plan)
    write_block_kv(plan, det.variant, det.block, "hf-safetensors", eos_ids)
    plan.notes.append(f"block-diffusion variant {det.variant} ({det.declared}): {arch} layers, attention block "
                      f"{det.block}, mask token {vocab.special['mask']} {vocab.tokens[vocab.special['mask']]}, "
                      f"{'tied' if hp.tied else 'untied'} output")
    plan.notes.extend(det.notes)
    plan.notes.extend(vocab_notes)
    finish_plan(plan, name)
    return plan

