"""How fast will a model answer on this machine? A prediction from the model's shape and the machine
profile (dgchat.hub.machine_profile), before anything is downloaded.

A model is reduced to what its steps cost (`ModelShape`): the weights of its matrix products by
storage type, the experts of a mixture of experts, the LM head over the vocabulary, the diffusion
head's vocabulary-wide work, attention and the fixed costs of each decode and layer. For a GGUF on
disk the shape comes from its tensors (exact); for a catalog entry from the `[models.arch]` shape
and the file's quantization (`quant`, llama-quantize's type mix).

One decode of n tokens on a device D costs

    D.decode_s + L * (D.layer_s + n * D.layer_token_s)                         fixed costs
  + sum over dense matrices          W * D.tau(type, n)                        products
  + sum over the experts of a layer  E_t * W_e * D.tau(type, n * k / E_t)      E_t = E * (1 - (1 - k/E)^n)
    (the last layer's MLP and experts at the rows asked for instead of n: llama.cpp drops the other
    rows before it)
  + L * 2 * ctx * n_head * head_dim * D.tau(f16, n)                            attention
  + V * d * D.tau(output type, rows, output=True)                              LM head, the rows asked for
  + V * rows * D.stats_s_per_logit                                             the head's statistics
  + (DiffusionGemma) the soft embedding: V * d * rows * D.exact_s_per_mac, or on a CPU above 65,536
    tokens V * rows * D.topk_s_per_logit + 256 * d * rows * D.exact_s_per_mac; its MLP 3 * d * inter

E_t is how many of E experts (k used per token) n tokens touch: at a 256-token canvas nearly all of
them (128 experts, top 8: E_t = 127.9), each reading its weights for ~16 tokens, so a denoising
step pays for every expert while a left-to-right token reads only k of them.

An answer of ANSWER_TOKENS tokens after a PROMPT_TOKENS prompt:
- DiffusionGemma: prompt through the encoder; then per canvas of C tokens `steps` decoder steps over
  the canvas and one encoder pass committing it; ceil(256 / C) canvases. `steps` is the entry's
  measured typical count (`typical_steps`) where known, else the model's limit (an upper bound: its
  entropy rule may stop earlier).
- masked models (LLaDA, Dream, ...): per canvas of G tokens `steps` steps; without KV memory each step
  runs the whole sequence (prompt, earlier canvases, this canvas), with it (cache prefix) only the
  block after a full pass at each block's start.
- `--ar` (DiffusionGemma, block diffusion): the prompt, then one token at a time.
- block diffusion (SDAR, BD3LM; docs/BLOCK_DIFFUSION.md): the prompt's whole blocks in one decode;
  then per block of B tokens B / r steps (r: tokens a step commits, `block_tokens_per_step`), each a
  decode of the block's B tokens against the KV cache of the prompt and the blocks before it
  (context P + (k + 1) B for block k), the LM head only for the rows still masked (B, B - r,
  B - 2r, ...); the first step of every block after the first also stores the finished block
  before it (one decode of 2B tokens, engine-merged). ceil(256 / B) blocks.
- answers that end early in a canvas (the bundled model): `canvas_tokens`, the tokens an answer
  really gets per canvas (measured), makes a 256-token answer 256 / canvas_tokens canvases.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dgchat.hub.machine_profile import MATMUL_TYPES, WIDTHS, DeviceProfile, bytes_per_weight
from dgchat.model_backend.model_info import inspect_header
from dgchat.model_backend.param_resolution import family_fallback

if TYPE_CHECKING:
    from dgchat.hub.catalog import CatalogEntry
    from dgchat.hub.hardware import GpuInfo
    from dgchat.model_backend.gguf_file import GgufHeader

PROMPT_TOKENS = 64  # a chat turn's prompt (system prompt, template, the person's message)
ANSWER_TOKENS = 256  # the answer a prediction is for
EXACT_SOFT_EMBEDDING_VOCAB = 65536  # model_backend.diffusion_gemma: above it a CPU uses the top-256 form
SOFT_TOP_K = 256
DEFAULT_LIMIT_S = 90.0  # config `answer_seconds_limit`: slower models are not recommended

# -- what a denoising step really yields, until measured on real weights ---------------------------
# Block diffusion: tokens a step commits at the published default settings. A catalog entry's
# measured `typical_tokens_per_step` replaces the figure (`typical_figures`).
#
# SDAR's dynamic low-confidence rule (threshold 0.85, `block_diffusion_generate` in JetAstra/SDAR
# generate.py): its README ("Experiments of Efficiency") says "SDAR delivers >2x speedup over static
# inference with negligible accuracy loss", static being a fixed count a step: block_length /
# denoising_steps = 4 / 4 = 1 token at the defaults. The figure it cites (README Figure 1,
# assets/Performace_and_speed.svg, threshold sweep) plots for SDAR-1.7B-Chat at threshold 0.85 a
# speed-up of 2.49x on MATH500 and 1.78x on HumanEval (4B: 2.59x, 2.30x; 8B: 2.56x, 3.17x). Taken:
# 2 tokens a step, the README's ">2x" (between the 1.7B's two plotted values), times the static count.
SDAR_DYNAMIC_SPEEDUP = 2.0
# A static schedule (BD3LM: dllm examples/a2d/bd3lm/sample.py, steps 128 over max_new_tokens 128 in
# blocks of 32 = 32 steps a 32-token block, `low_confidence` with a fixed count) commits exactly
# block / steps tokens a step: 1 at BD3LM's defaults.
#
# Answers that end before their canvas is full: the tokens an answer really gets per canvas, by
# catalog family (a catalog entry's `typical_answer_tokens` replaces it). The bundled model ("tiny",
# 32-position canvases), measured with
#   dgchat generate -m assets/dgchat-tiny-plays.gguf --threads 2 --seed S -p PROMPT --json
#   dgchat generate -m assets/dgchat-tiny-plays.gguf --threads 2 --seed 0 --system SYSTEM -p LINE --json
# on the wizard's test prompt ("Say hello and tell me, in one sentence, what you can do.") at seeds
# 0-7 and the held-out prompts 0-7 of convert/default_model/word_validity (run twice: 455 and 475
# tokens, 22 canvases and 517 steps both times; the engine's threads make a few answers differ),
# then held-out prompts 8-23 (391 tokens, 19 canvases, 456 steps): 48 answers, 1321 tokens in 63
# canvases and 1490 steps, i.e. 21.0 tokens and 23.65 steps a canvas; 40 of the 48 answers end in
# their first canvas.
TYPICAL_CANVAS_TOKENS: dict[str, float] = {"tiny": 21.0}


# -- the shape ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What a model's steps cost, independent of the machine. Weights are counted in matrix entries."""

    family: str  # "diffusion_gemma" | "masked" | "block_diffusion"
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: int
    head_dim: int
    dense: dict[str, int]  # storage type -> weights of every layer's attention matrices (and other non-MLP ones)
    output: tuple[str, int]  # (storage type, weights) of the LM head (the token embedding when tied)
    expert: dict[str, int] = field(default_factory=dict)  # type -> weights of ONE expert, summed over layers
    ffn: dict[str, int] = field(default_factory=dict)  # type -> weights of every layer's dense MLP and router
    n_expert: int = 0
    n_expert_used: int = 0
    self_cond_inter: int = 0  # DiffusionGemma's self-conditioning MLP width
    kv_memory: bool = True  # False: every step recomputes the whole sequence (llada, dream, rnd1 archs)
    sampler: dict[str, Any] = field(default_factory=dict)  # the model's defaults (steps, gen_length, ...)
    typical_steps: float | None = None  # measured steps per canvas, where known
    # block diffusion: tokens a step commits (measured; None: the published figure, see
    # block_tokens_per_step); the block size and steps per block are sampler["block_length"], ["steps"]
    typical_tokens_per_step: float | None = None
    canvas_tokens: float | None = None  # tokens an answer really gets per canvas (measured), where known

    @property
    def total_weights(self) -> int:
        return (sum(self.dense.values()) + sum(self.ffn.values()) + self.n_expert * sum(self.expert.values())
                + self.output[1])

    @property
    def active_weights(self) -> int:
        """Weights one token reads: dense matrices, its k experts, the LM head."""
        return (sum(self.dense.values()) + sum(self.ffn.values()) + self.n_expert_used * sum(self.expert.values())
                + self.output[1])

    def experts_touched(self, n_tokens: float) -> float:
        """Expected distinct experts `n_tokens` tokens route to in one layer (k each, uniformly)."""
        if not self.n_expert:
            return 0.0
        k, e = self.n_expert_used, self.n_expert
        return e * (1.0 - (1.0 - k / e) ** max(1.0, n_tokens))


def _num(value: Any, default: int = 0) -> int:
    if isinstance(value, list):
        value = max((v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)), default=default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return int(value)


def shape_from_header(header: GgufHeader, *, family: str, kv_memory: bool, sampler: dict[str, Any],
                      typical_steps: float | None = None, typical_tokens_per_step: float | None = None,
                      canvas_tokens: float | None = None) -> ModelShape:
    """The exact shape of a GGUF from its tensor list: every matrix at its real storage type."""
    tensors = {name: (t.shape, t.type_name) for name, t in header.tensors.items()}
    keys = {k: header.arch_key(k) for k in ("embedding_length", "attention.head_count", "attention.key_length",
                                            "block_count", "expert_used_count")}
    keys["self_cond_inter"] = header.get("dgchat.diffusion_gemma.self_cond.intermediate_size")
    return shape_from_tensors(tensors, keys, family=family, kv_memory=kv_memory, sampler=sampler,
                              typical_steps=typical_steps, typical_tokens_per_step=typical_tokens_per_step,
                              canvas_tokens=canvas_tokens)


def block_diffusion_shape(header: GgufHeader, *, typical_tokens_per_step: float | None = None) -> ModelShape:
    """A block-diffusion GGUF's shape with its sampler defaults as the engine resolves them
    (model_info.inspect_header: the variant's published settings, the file's keys over them; the
    block size as `block_length`), as ModelManager reads a file on disk: what a bench passes to
    predict_block_step_s, predict_prompt_s and predict_block_diffusion."""
    return shape_from_header(header, family="block_diffusion", kv_memory=True, sampler=inspect_header(header).defaults,
                             typical_tokens_per_step=typical_tokens_per_step)


def shape_from_tensors(tensors: dict[str, tuple[tuple[int, ...], str]], keys: dict[str, Any], *, family: str,
                       kv_memory: bool, sampler: dict[str, Any], typical_steps: float | None = None,
                       typical_tokens_per_step: float | None = None,
                       canvas_tokens: float | None = None) -> ModelShape:
    """The shape from tensors (name -> (ggml shape, ggml type name)) and the architecture's keys
    (`embedding_length`, `attention.head_count`, `attention.key_length`, `block_count`,
    `expert_used_count`, `self_cond_inter`), as a GGUF header holds them."""
    dense: dict[str, int] = {}
    ffn: dict[str, int] = {}
    expert: dict[str, int] = {}
    n_expert = 0
    for name, (shape, type_name) in tensors.items():
        if not name.startswith("blk.") or len(shape) < 2:
            continue
        qtype = type_name.lower()
        if len(shape) >= 3:  # [n_in, n_out, n_expert]: the experts of one layer
            n_expert = max(n_expert, int(shape[2]))
            expert[qtype] = expert.get(qtype, 0) + int(shape[0]) * int(shape[1])
        else:
            table = ffn if ".ffn_" in name else dense
            table[qtype] = table.get(qtype, 0) + int(shape[0]) * int(shape[1])
    n_embd = _num(keys.get("embedding_length"), 0)
    out = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if out is not None and len(out[0]) >= 2:
        n_vocab = int(out[0][1])
        output = (out[1].lower(), n_vocab * int(out[0][0]))
    else:
        n_vocab, output = 0, ("f16", 0)
    n_head = max(_num(keys.get("attention.head_count"), 1), 1)
    head_dim = _num(keys.get("attention.key_length"), 0) or (n_embd // n_head if n_embd else 128)
    return ModelShape(
        family=family, n_layer=max(_num(keys.get("block_count"), 1), 1), n_embd=n_embd, n_vocab=n_vocab,
        n_head=n_head, head_dim=head_dim, dense=dense, output=output, expert=expert, ffn=ffn, n_expert=n_expert,
        n_expert_used=min(_num(keys.get("expert_used_count"), 0), n_expert) if n_expert else 0,
        self_cond_inter=_num(keys.get("self_cond_inter"), 0), kv_memory=kv_memory, sampler=dict(sampler),
        typical_steps=typical_steps, typical_tokens_per_step=typical_tokens_per_step, canvas_tokens=canvas_tokens,
    )


# llama-quantize's storage types per file type (src/llama-quant.cpp): the bulk type, the LM head's,
# and the type of the tensors it gives more bits (attn_v and ffn_down; in the _M mixes about half of
# the layers: the first and last eighth and every third one between).
_QUANT_MIX: dict[str, tuple[str, str, str | None]] = {
    "Q4_0": ("q4_0", "q6_k", None), "Q4_1": ("q4_1", "q6_k", None), "Q5_0": ("q5_0", "q6_k", None),
    "Q8_0": ("q8_0", "q8_0", None), "Q6_K": ("q6_k", "q6_k", None), "F16": ("f16", "f16", None),
    "BF16": ("bf16", "bf16", None), "Q4_K_S": ("q4_k", "q6_k", None), "Q4_K_M": ("q4_k", "q6_k", "q6_k"),
    "Q5_K_S": ("q5_k", "q6_k", None), "Q5_K_M": ("q5_k", "q6_k", "q6_k"), "Q3_K_M": ("q3_k", "q6_k", "q4_k"),
    "Q2_K": ("q2_k", "q6_k", "q3_k"), "IQ4_XS": ("iq4_xs", "q6_k", None),
}
# A row whose width the type's block does not divide is stored as another type (llama-quant.cpp,
# tensor_type_fallback): DiffusionGemma's ffn_down rows (2112, 704 wide) are q5_0 / q8_0 in a Q4_K_M
# file, which is what brings the catalog shape to the file's ~16.9 GB (15.4 GB without it).
_ROW_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0", "q2_k": "q4_0", "q3_k": "q4_0",
                 "iq4_xs": "iq4_nl"}


def row_type(qtype: str, cols: int) -> str:
    """The storage type llama-quantize gives a matrix of `cols`-wide rows asked to be `qtype` (the
    k-quants' blocks are 256 weights wide; the 32-wide types divide every width in the catalog)."""
    return _ROW_FALLBACK[qtype] if qtype in _ROW_FALLBACK and cols % 256 else qtype


def quant_of(filename: str) -> str | None:
    """The quantization named in a GGUF's file name (`...-Q4_K_M.gguf`, `....Q8_0.gguf`)."""
    upper = filename.upper()
    for q in sorted(_QUANT_MIX, key=len, reverse=True):
        if re.search(rf"(?:^|[^A-Z0-9]){re.escape(q)}(?:[^A-Z0-9]|$)", upper):
            return q
    return None


def shape_from_entry(entry: CatalogEntry) -> ModelShape:
    """A catalog entry's shape from its `[models.arch]` numbers and its quantization."""
    a = entry.arch
    if not (a.n_embd and a.n_vocab and a.n_head):
        raise ValueError(f"catalog model {entry.name} has no shape (n_embd, n_vocab, n_head in [models.arch])")
    quant = entry.quant or quant_of(entry.filename or "") or "Q8_0"
    bulk, head_type, more_bits = _QUANT_MIX.get(quant, ("q8_0", "q8_0", None))
    n_swa = a.n_layer_swa if a.sliding_window else 0
    dense: dict[str, int] = {}
    ffn: dict[str, int] = {}
    expert: dict[str, int] = {}

    def add(table: dict[str, int], qtype: str, n: int) -> None:
        table[qtype] = table.get(qtype, 0) + n

    def split(table: dict[str, int], n: int, per: int = 1, cols: int = 0) -> None:  # attn_v / ffn_down
        if more_bits:
            add(table, row_type(more_bits, cols), n // 2 * per)
            add(table, row_type(bulk, cols), (n - n // 2) * per)
        else:
            add(table, row_type(bulk, cols), n * per)

    d = a.n_embd
    for full in (False, True):
        layers = (a.n_layer - n_swa) if full else n_swa
        if not layers:
            continue
        head_dim = (a.head_dim_full or a.head_dim) if full else a.head_dim
        kv = (a.n_head_kv_full or a.n_head_kv) if full else a.n_head_kv
        q = a.n_head * head_dim
        add(dense, bulk, layers * (2 * d * q + d * kv * head_dim))  # q and o; k
        if not (full and n_swa and entry.family in ("diffusion_gemma", "tiny")):
            split(dense, layers * d * kv * head_dim)  # v (Gemma 4's full-attention layers use K as V)
        if a.n_ff:
            add(ffn, bulk, layers * 2 * d * a.n_ff)  # gate, up
            split(ffn, layers * d * a.n_ff, cols=a.n_ff)  # down: rows n_ff wide
        if a.n_expert:
            add(ffn, "f32", layers * d * a.n_expert)  # the router stays f32
    if a.n_expert:
        add(expert, bulk, a.n_layer * 2 * d * a.n_ff_expert)
        split(expert, a.n_layer * d * a.n_ff_expert, cols=a.n_ff_expert)
    family = shape_family(entry.family)
    return ModelShape(
        family=family, n_layer=a.n_layer, n_embd=d, n_vocab=a.n_vocab, n_head=a.n_head, head_dim=a.head_dim,
        dense=dense, output=(head_type, a.n_vocab * d), expert=expert, ffn=ffn, n_expert=a.n_expert,
        n_expert_used=a.n_expert_used, self_cond_inter=a.self_cond_inter,
        kv_memory=family in ("diffusion_gemma", "block_diffusion"), sampler=dict(entry.sampler),
        **typical_figures(entry),
    )


def shape_family(catalog_family: str) -> str:
    """The prediction's family for a catalog family: DiffusionGemma (and the bundled "tiny", one of
    its kind), block diffusion, else a masked-diffusion model (LLaDA, Dream, ...)."""
    if catalog_family in ("diffusion_gemma", "tiny"):
        return "diffusion_gemma"
    return "block_diffusion" if catalog_family == "block_diffusion" else "masked"


def typical_figures(entry: CatalogEntry | None) -> dict[str, float | None]:
    """What a catalog entry says its model does in practice (measured), else the defaults above:
    `typical_steps` (steps a canvas), `typical_tokens_per_step` (block diffusion; None: the
    published figure, `block_tokens_per_step`) and `canvas_tokens` (tokens an answer gets a canvas:
    the entry's `typical_answer_tokens`, else TYPICAL_CANVAS_TOKENS by family). Fields a catalog
    schema does not have yet read as absent."""
    if entry is None:
        return {"typical_steps": None, "typical_tokens_per_step": None, "canvas_tokens": None}

    def number(name: str) -> float | None:
        value = getattr(entry, name, None)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        return float(value) if ok else None

    canvas = number("typical_answer_tokens")
    return {"typical_steps": number("typical_steps"), "typical_tokens_per_step": number("typical_tokens_per_step"),
            "canvas_tokens": canvas if canvas is not None else TYPICAL_CANVAS_TOKENS.get(entry.family)}


# -- the arithmetic ----------------------------------------------------------------------------------


def decode_seconds(shape: ModelShape, dev: DeviceProfile, n_tokens: int, *, ctx: int, rows: int,
                   head: str = "none") -> float:
    """One llama_decode of `n_tokens` tokens attending to `ctx` positions, with `rows` rows of
    logits and `head` "none" (no statistics), "stats" (masked models, `--ar`) or "dg" (a
    DiffusionGemma decoder step: statistics and the self-conditioning soft embedding)."""
    n = max(1, n_tokens)
    rows = max(1, rows)
    t = dev.decode_s + shape.n_layer * (dev.layer_s + n * dev.layer_token_s)
    t += sum(w * dev.tau(q, n) for q, w in shape.dense.items())
    # llama.cpp runs the last layer's MLP only on the rows whose logits are asked for
    last = 1.0 / shape.n_layer
    for width, share in ((n, 1.0 - last), (min(rows, n), last)):
        t += share * sum(w * dev.tau(q, width) for q, w in shape.ffn.items())
        if shape.n_expert:
            touched = shape.experts_touched(width)
            per_expert = width * shape.n_expert_used / touched
            t += share * sum(touched * w * dev.tau(q, per_expert) for q, w in shape.expert.items())
    t += shape.n_layer * 2 * ctx * shape.n_head * shape.head_dim * dev.tau("f16", n)
    out_type, out_weights = shape.output
    t += out_weights * dev.tau(out_type, rows, output=True)
    if head == "none":
        return t
    logits = shape.n_vocab * rows
    t += logits * dev.stats_s_per_logit
    if head == "dg":
        d = shape.n_embd
        t += 3 * d * shape.self_cond_inter * dev.tau("f32", rows)
        if dev.kind == "cpu" and shape.n_vocab > EXACT_SOFT_EMBEDDING_VOCAB and not dev.host_sampler:
            t += logits * dev.topk_s_per_logit + SOFT_TOP_K * d * rows * dev.exact_s_per_mac
        else:
            t += logits * d * dev.exact_s_per_mac
    return t


@dataclass(frozen=True)
class SpeedPrediction:
    device: str  # "cpu" | "gpu" | "gpu+cpu" (layers split by memory)
    device_name: str
    basis: str  # "measured" (this machine's profile) | "estimated from published figures"
    seconds_per_step: float  # one denoising step of the first canvas
    steps_per_canvas: float
    steps_are_limit: bool  # the model's step limit, not a typical count: answers may come faster
    canvas: int
    canvases: int
    seconds_per_answer: float  # ANSWER_TOKENS tokens after a PROMPT_TOKENS prompt
    ar_seconds_per_answer: float | None = None  # `--ar` (DiffusionGemma, block diffusion)
    prompt_tokens: int = PROMPT_TOKENS
    answer_tokens: int = ANSWER_TOKENS
    prompt_seconds: float | None = None  # the prompt's decode (block diffusion)
    tokens_per_step: float | None = None  # tokens a step commits (block diffusion: assumed or measured)
    canvas_tokens: float | None = None  # tokens an answer gets a canvas, where fewer than the canvas

    @property
    def tokens_per_s(self) -> float:
        return self.answer_tokens / self.seconds_per_answer if self.seconds_per_answer > 0 else 0.0

    @property
    def ar_tokens_per_s(self) -> float | None:
        if not self.ar_seconds_per_answer:
            return None
        return self.answer_tokens / self.ar_seconds_per_answer

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens_per_s": round(self.tokens_per_s, 3), "seconds_per_answer": round(self.seconds_per_answer, 3),
            "seconds_per_step": round(self.seconds_per_step, 5),
            "ar_tokens_per_s": round(self.ar_tokens_per_s, 3) if self.ar_tokens_per_s else None,
            "steps_per_canvas": round(self.steps_per_canvas, 2), "steps_are_limit": self.steps_are_limit,
            "canvas": self.canvas, "canvases": self.canvases, "answer_tokens": self.answer_tokens,
            "prompt_tokens": self.prompt_tokens, "device": self.device, "device_name": self.device_name,
            "basis": self.basis,
            "prompt_seconds": round(self.prompt_seconds, 5) if self.prompt_seconds is not None else None,
            "tokens_per_step": round(self.tokens_per_step, 3) if self.tokens_per_step is not None else None,
            "canvas_tokens": round(self.canvas_tokens, 2) if self.canvas_tokens is not None else None,
        }

    def per_answer(self) -> str:
        """"~6 min" / "~4 s": the time of a 256-token answer, rounded the way people say it."""
        words = duration_words(self.seconds_per_answer)
        return words if words.startswith("<") else "~" + words

    def where(self) -> str:
        return {"cpu": "on this CPU", "gpu": "on the GPU", "gpu+cpu": "split between GPU and CPU"}[self.device]

    def sentence(self) -> str:
        """'about 6 min per answer on this CPU (256 tokens, 0.7 tokens/s)'"""
        took = duration_words(self.seconds_per_answer)
        words = f"{'under 1 s' if took.startswith('<') else 'about ' + took} per answer {self.where()}"
        return f"{words} ({self.answer_tokens} tokens, {rate_words(self.tokens_per_s)})"


def duration_words(seconds: float) -> str:
    if seconds < 1:
        return "<1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h" if seconds < 10 * 3600 else f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def rate_words(tokens_per_s: float) -> str:
    if tokens_per_s >= 10:
        return f"{tokens_per_s:.0f} tokens/s"
    if tokens_per_s >= 1:
        return f"{tokens_per_s:.1f} tokens/s"
    return f"{tokens_per_s:.2f} tokens/s"


def _sampler_int(shape: ModelShape, key: str, default: int) -> int:
    value = shape.sampler.get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def predict(shape: ModelShape, dev: DeviceProfile, *, prompt_tokens: int = PROMPT_TOKENS,
            answer_tokens: int = ANSWER_TOKENS, steps: float | None = None, device: str | None = None,
            device_name: str | None = None, decode: Callable[..., float] = decode_seconds) -> SpeedPrediction:
    """The time of an `answer_tokens` answer after a `prompt_tokens` prompt on `dev`.
    `steps` overrides the steps per canvas (default: the shape's typical count, else its limit; block
    diffusion: steps per block, default block / block_tokens_per_step). `decode`: one decode's
    seconds, decode_seconds's signature (hub.split_speed passes one for weights split across devices;
    block diffusion always uses decode_seconds)."""
    p, a = prompt_tokens, answer_tokens
    if shape.family == "block_diffusion":  # `steps`: per block, B / tokens a step
        r = block_size(shape) / steps if steps else None
        return predict_block_diffusion(shape, dev, prompt_tokens=p, answer_tokens=a, tokens_per_step=r,
                                       device=device, device_name=device_name)
    fallback = family_fallback(shape.family)  # what the engine runs where the catalog names no value
    limit = _sampler_int(shape, "steps", fallback["steps"])
    canvas = _sampler_int(shape, "gen_length", fallback["gen_length"])
    per_canvas = float(steps if steps is not None else shape.typical_steps or limit)
    n_canvas = max(1, math.ceil(a / canvas))
    total = 0.0
    first_step = 0.0
    ar = None
    filled = None
    if shape.family == "diffusion_gemma":
        total += decode(shape, dev, p, ctx=p, rows=1)  # the encoder over the prompt
        # answers that end early in a canvas spend its steps on fewer tokens: 256 / canvas_tokens
        # canvases (the last one in part)
        filled = min(shape.canvas_tokens, float(canvas)) if shape.canvas_tokens else None
        canvases = a / filled if filled else float(n_canvas)
        n_canvas = max(1, math.ceil(canvases - 1e-9))
        for k in range(n_canvas):
            ctx = p + (k + 1) * canvas
            step = decode(shape, dev, canvas, ctx=ctx, rows=canvas, head="dg")
            first_step = first_step or step
            share = min(1.0, canvases - k) if filled else 1.0
            total += share * (per_canvas * step + decode(shape, dev, canvas, ctx=ctx, rows=1))
        ar = decode(shape, dev, p, ctx=p, rows=1) + a * decode(
            shape, dev, 1, ctx=p + a // 2, rows=1, head="stats")
    else:
        block = _sampler_int(shape, "block_length", canvas)
        block = block if block < canvas and canvas % block == 0 else canvas
        n_blocks = canvas // block
        cached = shape.kv_memory and shape.sampler.get("cache", "auto") in ("auto", "prefix", "dual")
        for k in range(n_canvas):
            seq = p + (k + 1) * canvas
            full = decode(shape, dev, seq, ctx=seq, rows=block, head="stats")
            first_step = first_step or full
            if cached:
                in_block = decode(shape, dev, block, ctx=seq, rows=block, head="stats")
                total += n_blocks * full + max(per_canvas - n_blocks, 0) * in_block
            else:
                total += per_canvas * full
    return SpeedPrediction(
        device=device or dev.kind, device_name=device_name or dev.name, basis=dev.basis,
        seconds_per_step=first_step, steps_per_canvas=per_canvas,
        steps_are_limit=steps is None and shape.typical_steps is None and shape.family == "diffusion_gemma",
        canvas=canvas, canvases=n_canvas, seconds_per_answer=total, ar_seconds_per_answer=ar,
        prompt_tokens=p, answer_tokens=a, canvas_tokens=filled)


# -- block diffusion (SDAR, BD3LM) -------------------------------------------------------------------


def block_size(shape: ModelShape) -> int:
    """The block size B of a block-diffusion model (`block_length`: the file's
    dgchat.engine.attention_block, the catalog's [models.sampler]); 4, SDAR's, when unknown."""
    return _sampler_int(shape, "block_length", 4)


def block_tokens_per_step(shape: ModelShape) -> float:
    """Tokens a denoising step commits on average: the measured figure where there is one
    (`typical_tokens_per_step`), else the published one for the sampler: with a confidence
    threshold (SDAR's dynamic rule) SDAR_DYNAMIC_SPEEDUP x the static count, without (BD3LM) the
    static count block / steps. Never fewer than the static count (the schedule's minimum a step)
    nor more than the block."""
    b = block_size(shape)
    steps = _sampler_int(shape, "steps", b)
    static = b / min(steps, b)
    if shape.typical_tokens_per_step:
        r = shape.typical_tokens_per_step
    elif isinstance(shape.sampler.get("threshold"), (int, float)) and shape.sampler["threshold"] > 0:
        r = SDAR_DYNAMIC_SPEEDUP * static
    else:
        r = static
    return min(max(r, static), float(b))


def block_step_plan(block: int, tokens_per_step: float) -> list[tuple[float, float]]:
    """The steps of one block as (weight, rows asked for): block / r steps, the k-th with the
    block's still-masked positions, block - k r (at least 1); a fractional last step is weighted
    by its fraction. B = 4, r = 2: [(1, 4), (1, 2)]; B = 32, r = 1: 32 steps of 32, 31, ..., 1 rows."""
    r = min(max(tokens_per_step, 1e-9), float(block))
    n = block / r
    plan = []
    for k in range(max(1, math.ceil(n - 1e-9))):
        plan.append((min(1.0, n - k), max(1.0, block - k * r)))
    return plan


def predict_block_step_s(shape: ModelShape, dev: DeviceProfile, n_tokens: int, n_ctx: int,
                         n_out_rows: float) -> float:
    """One block step: a decode of `n_tokens` tokens (B, or 2B for the first step of a block merged
    with storing the block before it) attending to `n_ctx` positions (the prompt, the blocks
    before, this block), the LM head and its statistics for `n_out_rows` rows (the masked ones)."""
    return decode_seconds(shape, dev, n_tokens, ctx=n_ctx, rows=n_out_rows, head="stats")


def predict_prompt_s(shape: ModelShape, dev: DeviceProfile, n_prompt: int) -> float:
    """The prompt's whole blocks in one decode (no logits needed: the first block's step follows;
    one row counted, as llama.cpp returns at least the last)."""
    return decode_seconds(shape, dev, n_prompt, ctx=n_prompt, rows=1)


def predict_ar_token_s(shape: ModelShape, dev: DeviceProfile, n_ctx: int) -> float:
    """One left-to-right token (`--ar`): a decode of one token against `n_ctx` cached positions."""
    return decode_seconds(shape, dev, 1, ctx=n_ctx, rows=1, head="stats")


def predict_block_diffusion(shape: ModelShape, dev: DeviceProfile, *, prompt_tokens: int = PROMPT_TOKENS,
                            answer_tokens: int = ANSWER_TOKENS, tokens_per_step: float | None = None,
                            device: str | None = None, device_name: str | None = None) -> SpeedPrediction:
    """A block-diffusion answer as the engine decodes it (docs/BLOCK_DIFFUSION.md): the prompt's
    whole blocks in one decode, then ceil(answer / B) blocks of block_step_plan's steps, every
    block after the first opening with one decode of 2B tokens (the finished block stored, the new
    block's first step). `tokens_per_step` overrides block_tokens_per_step."""
    p, a = prompt_tokens, answer_tokens
    b = block_size(shape)
    r = float(tokens_per_step) if tokens_per_step else block_tokens_per_step(shape)
    plan = block_step_plan(b, r)
    n_blocks = max(1, math.ceil(a / b))
    prompt_s = predict_prompt_s(shape, dev, p)
    total = prompt_s
    for k in range(n_blocks):
        ctx = p + (k + 1) * b
        for j, (weight, rows) in enumerate(plan):
            n = 2 * b if j == 0 and k > 0 else b
            total += weight * predict_block_step_s(shape, dev, n, ctx, rows)
    ar = prompt_s + a * predict_ar_token_s(shape, dev, p + a // 2)
    return SpeedPrediction(
        device=device or dev.kind, device_name=device_name or dev.name, basis=dev.basis,
        seconds_per_step=predict_block_step_s(shape, dev, b, p + b, b), steps_per_canvas=sum(w for w, _ in plan),
        steps_are_limit=False, canvas=b, canvases=n_blocks, seconds_per_answer=total, ar_seconds_per_answer=ar,
        prompt_tokens=p, answer_tokens=a, prompt_seconds=prompt_s, tokens_per_step=min(r, float(b)))


def predict_split(shape: ModelShape, gpu: DeviceProfile, cpu: DeviceProfile, on_gpu: float,
                  **kw: Any) -> SpeedPrediction:
    """Part of the layers on the GPU (`on_gpu`, 0..1, as far as its memory goes), the rest and the
    LM head on the CPU: each part's time in proportion."""
    on_gpu = min(max(on_gpu, 0.0), 1.0)
    g = predict(shape, gpu, **kw)
    c = predict(shape, cpu, **kw)
    mix = lambda x, y: on_gpu * x + (1 - on_gpu) * y  # noqa: E731
    ar = mix(g.ar_seconds_per_answer, c.ar_seconds_per_answer) if g.ar_seconds_per_answer else None
    return SpeedPrediction(device="gpu+cpu", device_name=f"{gpu.name} + CPU", basis=g.basis,
                           seconds_per_step=mix(g.seconds_per_step, c.seconds_per_step),
                           steps_per_canvas=c.steps_per_canvas, steps_are_limit=c.steps_are_limit, canvas=c.canvas,
                           canvases=c.canvases, seconds_per_answer=mix(g.seconds_per_answer, c.seconds_per_answer),
                           ar_seconds_per_answer=ar, prompt_tokens=c.prompt_tokens, answer_tokens=c.answer_tokens,
                           prompt_seconds=(mix(g.prompt_seconds, c.prompt_seconds)
                                           if g.prompt_seconds is not None else None),
                           tokens_per_step=c.tokens_per_step, canvas_tokens=c.canvas_tokens)


# -- GPUs this engine build cannot measure ---------------------------------------------------------
# Published figures: memory bandwidth (GB/s) and dense FP16 tensor throughput (TFLOP/s, no
# sparsity) from the vendors' data sheets (NVIDIA, AMD, Apple). llama.cpp reaches a share of them:
# about 60 % of the bandwidth for one token and 25 % of the tensor throughput for quantized products
# at canvas width (its own reports of MMQ kernels); the estimate says "estimated", never "measured".
GPU_SPECS: dict[str, tuple[float, float]] = {
    "H200": (4800, 989), "H100 PCIe": (2000, 756), "H100": (3350, 989), "A100 80GB": (2039, 312),
    "A100": (1555, 312), "L40S": (864, 362), "L40": (864, 181), "L4": (300, 121), "A10G": (600, 125),
    "A10": (600, 125), "A6000": (768, 155), "RTX 6000 Ada": (960, 365), "T4": (320, 65), "V100": (900, 125),
    "RTX 5090": (1792, 209), "RTX 5080": (960, 113), "RTX 5070 Ti": (896, 88), "RTX 5070": (672, 62),
    "RTX 4090": (1008, 165), "RTX 4080": (717, 97), "RTX 4070 Ti": (504, 80), "RTX 4070": (504, 58),
    "RTX 4060 Ti": (288, 44), "RTX 4060": (272, 30), "RTX 3090 Ti": (1008, 80), "RTX 3090": (936, 71),
    "RTX 3080": (760, 60), "RTX 3070": (448, 41), "RTX 3060": (360, 26), "RTX 2080 Ti": (616, 57),
    "MI300X": (5300, 1307), "MI250": (3277, 362), "RX 7900 XTX": (960, 123), "RX 7900 XT": (800, 103),
    "RX 7800 XT": (624, 75), "RX 6900 XT": (512, 46), "RX 6800": (512, 32),
    "M4 Max": (546, 17), "M4 Pro": (273, 9), "M4": (120, 4.3), "M3 Ultra": (819, 28), "M3 Max": (400, 14),
    "M3 Pro": (150, 7), "M3": (100, 4.1), "M2 Ultra": (800, 27), "M2 Max": (400, 13.6), "M2 Pro": (200, 6.8),
    "M2": (100, 3.6), "M1 Ultra": (800, 21), "M1 Max": (400, 10.4), "M1 Pro": (200, 5.2), "M1": (68, 2.6),
}
UNKNOWN_GPU = (500.0, 40.0)  # a GPU whose name is not known (or only its memory was entered)
BANDWIDTH_SHARE, COMPUTE_SHARE = 0.6, 0.25


def gpu_figures(name: str | None) -> tuple[float, float, str]:
    """(GB/s, TFLOP/s, the name matched) for a GPU name as nvidia-smi or the OS reports it."""
    if name:
        upper = name.upper()
        for key in sorted(GPU_SPECS, key=len, reverse=True):
            if re.search(rf"(?:^|[^A-Z0-9]){re.escape(key.upper())}(?:[^A-Z0-9]|$)", upper):
                bw, tf = GPU_SPECS[key]
                return bw, tf, key
    bw, tf = UNKNOWN_GPU
    return bw, tf, ""


def estimated_gpu_profile(gpu: GpuInfo | None, *, name: str | None = None) -> DeviceProfile:
    """A DeviceProfile from a GPU's published figures (for a build that cannot offload yet, or a GPU
    the user entered by its memory only)."""
    label = name or (gpu.name if gpu is not None else "")
    bw, tflops, matched = gpu_figures(label)
    bandwidth = bw * 1e9 * BANDWIDTH_SHARE
    flops = tflops * 1e12 * COMPUTE_SHARE
    matmul = {q: {w: max(bytes_per_weight(q) / bandwidth, 2.0 * w / flops) for w in WIDTHS} for q in MATMUL_TYPES}
    return DeviceProfile(
        kind="gpu", name=label or "a GPU", threads=0, matmul=matmul,
        stats_s_per_logit=16.0 / bandwidth,  # logits written once and read a few times, float32
        topk_s_per_logit=0.0, exact_s_per_mac=2.0 / flops, decode_s=2e-4, layer_s=4e-5, layer_token_s=0.0,
        basis="estimated from published figures" + ("" if matched else " of a typical GPU"))
