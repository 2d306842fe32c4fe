"""A random-weight DiffusionGemma GGUF with the real 26B-A4B dimensions, written by streaming.

The file has exactly the layout `dgchat convert` produces for DiffusionGemma (architecture
`gemma4`, the converter's tensor names, shapes and storage types, its `gemma4.*` and `dgchat.*`
metadata: docs/diffusion-gemma-gguf.md), so llama.cpp and dgchat's engine run it like the real
model; only the numbers are random. It exists to measure speed at full size without the real
checkpoint: the 30-layer Q4_0 file is ~14 GB, the 2-layer variant (`--layers 2`) keeps every width
and the full vocabulary for CPU runs, and the small-dimension options make a file of a few MB for
tests, through the same code.

Weights are written as random quantized blocks, chunk by chunk, straight to disk: no tensor is ever
materialised and no quantizer runs, so memory stays at a few tens of MB whatever the size. A block
is a valid encoding (random nibbles / int8s / 6-bit values and a finite f16 scale), scaled so that
the dequantized weights have a standard deviation of about 0.02. Norm weights, scalars and other
small tensors are f32 near 1, so activations stay finite through 30 layers.

    python tests/bench/make_fullshape_dg.py /tmp/dg-fullshape-q4_0.gguf               # 30 layers
    python tests/bench/make_fullshape_dg.py /tmp/dg-L2.gguf --layers 2 --check
    python tests/bench/make_fullshape_dg.py /tmp/dg-tiny.gguf --tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType, TokenType

from dgchat.convert.checkpoint import f32_to_bf16
from dgchat.convert.random_blocks import WEIGHT_STD, random_blocks
from dgchat.convert.families import diffusion_gemma as dg
from dgchat.convert.tokenizer_gguf import Vocab
from dgchat.convert.writer import GGUFPlan, TensorPlan, _Writer, check_space, partial_path

Q = GGMLQuantizationType

# -- the real dimensions --------------------------------------------------------------------------
# google/diffusiongemma-26B-A4B-it is a Gemma 4 26B-A4B backbone. Sources:
# [A] mmastrac/diffgemma ARCHITECTURE.md, "1. Model constants (google/diffusiongemma-26B-A4B-it)"
#     (commit 23994a76be43): 30 layers, 25 sliding + 5 full at 5, 11, 17, 23, 29; hidden 2816;
#     vocab 262144, tied embeddings; canvas 256; 16 query heads, sliding layers head dim 256 with
#     8 KV heads, full layers head dim 512 with 2 KV heads and no v_proj (K is V); sliding window
#     1024; dense FFN 2112; MoE 128 experts, top-8, expert FFN 704; final softcap 30; RMS eps 1e-6;
#     RoPE theta 1e4 (sliding) / 1e6 proportional with partial_rotary_factor 0.25 (full);
#     pad 0, bos 2, end ids {1, 106, 50}; sampler defaults 48 steps, entropy bound 0.1,
#     t 0.4..0.8, stability 1, confidence 0.005.
# [B] Gemma 4 26B-A4B text_config as mirrored in public test fixtures (gemma4 TPU / Swift MoE
#     config tests): hidden 2816, intermediate 2112, moe_intermediate 704, 128 experts, top 8,
#     heads 16 / KV 8 / global KV 2, head_dim 256 / global 512, sliding window 1024,
#     vocab 262144, softcap 30: the same numbers as [A].
# [C] this repository's docs/diffusion-gemma-gguf.md: self-conditioning MLP intermediate 2112 at
#     d = 2816, stored as bf16 (~36 MB).
# [D] Google's DiffusionGemma serving command (`vllm serve google/diffusiongemma-26B-A4B-it
#     --max-model-len 262144`): context length 262144.
# [E] generation_config.json of the model as quoted publicly: eos_token_id [1, 106, 50]
#     (1 <eos>, 106 <turn|>, 50 <|tool_response>), pad 0, bos 2.
# Not found anywhere: the layer_scalar values and norm weights (random near 1 here), and the id of
# `<|turn>` (105 assumed: the start-of-turn id of Gemma 3's vocabulary, whose end-of-turn is 106).
REAL_GENERATION_CONFIG: dict[str, Any] = {  # [A], [E]
    "max_denoising_steps": 48,
    "sampler_config": {"entropy_bound": 0.1},
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
    "eos_token_id": [1, 106, 50],
    "pad_token_id": 0,
    "bos_token_id": 2,
}
ROPE_PARAMETERS = {  # [A]
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
FULL_ATTENTION_PERIOD = 6  # [A]: every 6th layer is global (5 sliding, then 1 full)

NORM_JITTER = 0.05  # norm weights and scalars: 1 + N(0, NORM_JITTER)
CHUNK_BYTES = 32 * 1024 * 1024  # bytes generated and written at a time
QTYPES = {"q4_0": Q.Q4_0, "q8_0": Q.Q8_0, "q6_k": Q.Q6_K}
_FILE_TYPES = {Q.Q4_0: LlamaFileType.MOSTLY_Q4_0, Q.Q8_0: LlamaFileType.MOSTLY_Q8_0}

# Special tokens at Gemma 4's ids ([E]; 105 assumed, see above), the rest of the vocabulary synthetic.
SPECIAL_IDS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4,
               "<|tool_response>": 50, "<|turn>": 105, "<turn|>": 106}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|turn>{{ m['role'] }}\n{{ m['content'] }}<turn|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


@dataclass(frozen=True)
class FullShapeSpec:
    """The shape to write. Defaults: DiffusionGemma 26B-A4B ([A]-[D] above)."""

    n_layer: int = 30
    n_embd: int = 2816
    n_vocab: int = 262_144
    n_ff: int = 2112  # dense MLP
    n_expert: int = 128
    n_expert_used: int = 8
    expert_ff: int = 704
    n_head: int = 16
    n_head_kv_swa: int = 8
    n_head_kv_full: int = 2
    head_dim_swa: int = 256
    head_dim_full: int = 512
    sliding_window: int = 1024
    canvas_length: int = 256
    context_length: int = 262_144
    self_cond_ff: int = 2112
    softcap: float = 30.0
    rms_eps: float = 1e-6

    def layer_types(self) -> list[str]:
        # transformers' default pattern (the converter's too): every 6th layer full, the last
        # forced full; 30 layers give the real [A] pattern, 2 give (sliding, full)
        types = ["full_attention" if (i + 1) % FULL_ATTENTION_PERIOD == 0 else "sliding_attention"
                 for i in range(self.n_layer)]
        types[-1] = "full_attention"
        return types


# Small dimensions for tests and smoke runs: the same code path, a file of a few MB.
TINY = dict(n_layer=2, n_embd=256, n_vocab=1024, n_ff=96, n_expert=4, n_expert_used=2, expert_ff=64,
            n_head=2, n_head_kv_swa=1, n_head_kv_full=1, head_dim_swa=64, head_dim_full=128,
            sliding_window=16, canvas_length=32, context_length=4096, self_cond_ff=96)


def hf_config(spec: FullShapeSpec) -> dict[str, Any]:
    """The config.json (text part) of a DiffusionGemma with `spec`'s shape, in transformers' keys,
    so the converter's own parser derives every gemma4 hyper-parameter exactly as for a checkpoint."""
    return {
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "canvas_length": spec.canvas_length,
        "tie_word_embeddings": True,
        "text_config": {
            "vocab_size": spec.n_vocab,
            "hidden_size": spec.n_embd,
            "intermediate_size": spec.n_ff,
            "num_hidden_layers": spec.n_layer,
            "layer_types": spec.layer_types(),
            "num_attention_heads": spec.n_head,
            "num_key_value_heads": spec.n_head_kv_swa,
            "num_global_key_value_heads": spec.n_head_kv_full,
            "head_dim": spec.head_dim_swa,
            "global_head_dim": spec.head_dim_full,
            "attention_k_eq_v": True,
            "sliding_window": spec.sliding_window,
            "num_experts": spec.n_expert,
            "top_k_experts": spec.n_expert_used,
            "moe_intermediate_size": spec.expert_ff,
            "final_logit_softcapping": spec.softcap,
            "rms_norm_eps": spec.rms_eps,
            "max_position_embeddings": spec.context_length,
            "rope_parameters": ROPE_PARAMETERS,
            "hidden_activation": "gelu_pytorch_tanh",
        },
    }


# -- random quantized blocks (dgchat.convert.random_blocks) ------------------------------------
def _quantized_chunks(seed: int, qtype: GGMLQuantizationType, n_elements: int) -> Iterator[np.ndarray]:
    block, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    left = n_elements // block
    per_chunk = max(1, CHUNK_BYTES // type_size)
    while left:
        n = min(left, per_chunk)
        yield random_blocks(rng, qtype, n)
        left -= n


# -- the tensor list ------------------------------------------------------------------------------
@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order, as the converter's plans
    qtype: GGMLQuantizationType
    chunks: Callable[[], Iterator[np.ndarray]]  # the data, in pieces


def _tensor_seed(seed: int, name: str) -> int:
    # one stream per tensor: a tensor's bytes do not depend on which tensors come before it
    return (seed << 32) ^ zlib.crc32(name.encode())


def _near_one(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (1.0 + NORM_JITTER * rng.standard_normal(shape)).astype(np.float32)


def _f32(name: str, values: np.ndarray) -> _Tensor:
    values = np.ascontiguousarray(values, dtype=np.float32)
    return _Tensor(name, values.shape, Q.F32, lambda: iter([values]))


def _f32_random(name: str, shape: tuple[int, ...], seed: int, *, std: float | None = None) -> _Tensor:
    """Small f32 tensors, drawn when written: norms near 1, or N(0, std) (the router)."""

    def chunks() -> Iterator[np.ndarray]:
        rng = np.random.default_rng(_tensor_seed(seed, name))
        if std is None:
            yield _near_one(rng, shape)
        else:
            yield (std * rng.standard_normal(shape)).astype(np.float32)

    return _Tensor(name, shape, Q.F32, chunks)


def _quantized(name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType, seed: int) -> _Tensor:
    n = int(np.prod(shape, dtype=np.int64))
    return _Tensor(name, shape, qtype, lambda: _quantized_chunks(_tensor_seed(seed, name), qtype, n))


def embedding_qtype(qtype: GGMLQuantizationType, n_embd: int) -> GGMLQuantizationType:
    """What `llama-quantize` gives a tied token_embd (it doubles as the output matrix): Q6_K for
    Q4_0 files, Q8_0 for Q8_0 files, and Q8_0 when rows do not divide into 256-value k-blocks
    (src/llama-quant.cpp, the OUTPUT / tied TOKEN_EMBD rule)."""
    if qtype == Q.Q8_0 or n_embd % GGML_QUANT_SIZES[Q.Q6_K][0]:
        return Q.Q8_0
    return Q.Q6_K


def tensor_list(hp: dg.Hparams, qtype: GGMLQuantizationType, embd_qtype: GGMLQuantizationType,
                enc_scalars: np.ndarray, seed: int) -> list[_Tensor]:
    """Every tensor, in the converter's order (`plan_from_hf`), with its storage type."""
    tensors = [
        _quantized("token_embd.weight", (hp.vocab_size, hp.hidden_size), embd_qtype, seed),
        _f32_random("output_norm.weight", (hp.hidden_size,), seed),
        _f32("rope_freqs.weight", dg.rope_freqs(hp)),
    ]
    for il in range(hp.n_layer):
        # the converter's shape table, so names, order and shapes cannot drift from its output
        for suffix, shape in dg._layer_shapes(hp, il).items():
            if suffix == "attn_v.weight" and not hp.is_swa(il):
                continue  # full-attention layers use K as V (attention_k_eq_v): no tensor
            name = f"blk.{il}.{suffix}"
            if len(shape) == 1:
                tensors.append(_f32_random(name, shape, seed))
            elif suffix.endswith(dg._KEEP_F32):  # the router stays f32 (converter and llama-quantize)
                tensors.append(_f32_random(name, shape, seed, std=WEIGHT_STD))
            else:
                tensors.append(_quantized(name, shape, qtype, seed))
        tensors.append(_f32(f"blk.{il}.layer_output_scale.weight", enc_scalars[il : il + 1]))
    return tensors


# -- metadata -------------------------------------------------------------------------------------
def synthetic_vocab(n_vocab: int) -> Vocab:
    """A vocabulary llama.cpp's `gemma4` tokenizer loads and can tokenize ASCII text with: Gemma 4's
    special tokens at their ids, the 256 byte-fallback tokens, printable ASCII and `▁` (SentencePiece
    space), `▁`+letter merges, then unique filler tokens up to `n_vocab`."""
    tokens: dict[int, str] = {i: t for t, i in SPECIAL_IDS.items()}
    types: dict[int, int] = {i: TokenType.CONTROL for i in SPECIAL_IDS.values()}
    next_id = max(SPECIAL_IDS.values()) + 1
    for i in range(next_id):
        tokens.setdefault(i, f"<unused{i}>")
        types.setdefault(i, TokenType.UNUSED)
    body = [(f"<0x{b:02X}>", TokenType.BYTE) for b in range(256)]
    chars = ["▁"] + [chr(c) for c in range(0x21, 0x7F)]
    body += [(c, TokenType.NORMAL) for c in chars]
    merges = [f"▁ {c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    body += [(m.replace(" ", ""), TokenType.NORMAL) for m in merges]
    if next_id + len(body) > n_vocab:
        raise ValueError(f"the synthetic vocabulary needs at least {next_id + len(body)} tokens (got {n_vocab})")
    for text, ttype in body:
        tokens[next_id], types[next_id] = text, ttype
        next_id += 1
    for i in range(next_id, n_vocab):
        tokens[i], types[i] = f"<filler{i}>", TokenType.NORMAL
    special = {"bos": SPECIAL_IDS["<bos>"], "eos": SPECIAL_IDS["<eos>"], "unk": SPECIAL_IDS["<unk>"],
               "pad": SPECIAL_IDS["<pad>"], "mask": SPECIAL_IDS["<mask>"], "eot": SPECIAL_IDS["<turn|>"]}
    return Vocab(model="gemma4", pre="gemma4", tokens=[tokens[i] for i in range(n_vocab)],
                 types=[int(types[i]) for i in range(n_vocab)], merges=merges, special=special,
                 add_bos=True, chat_template=CHAT_TEMPLATE)


def _self_conditioning(hp: dg.Hparams, inter: int, seed: int) -> dg.SelfCond:
    """bf16 like the real checkpoint ([C]); N(0, WEIGHT_STD) matrices, pre-norm near 1."""
    rng = np.random.default_rng(_tensor_seed(seed, "self_cond"))
    d = hp.hidden_size

    def matrix(rows: int, cols: int) -> np.ndarray:
        return f32_to_bf16(WEIGHT_STD * rng.standard_normal((rows, cols), dtype=np.float32))

    return dg.SelfCond(dtype="bf16", pre_norm=_near_one(rng, (d,)), gate=matrix(inter, d),
                       up=matrix(inter, d), down=matrix(d, inter))


def build_plan(spec: FullShapeSpec, qtype: GGMLQuantizationType, embd_qtype: GGMLQuantizationType,
               seed: int) -> tuple[GGUFPlan, list[_Tensor]]:
    """All metadata (through the converter's own writers) and the tensor list."""
    hp = dg.hparams_from_config(hf_config(spec))
    rng = np.random.default_rng(_tensor_seed(seed, "layer_scalars"))
    enc_scalars, dec_scalars = _near_one(rng, (hp.n_layer,)), _near_one(rng, (hp.n_layer,))
    plan = GGUFPlan(dg.GGUF_ARCH)
    dg.write_model_kv(plan, hp)
    synthetic_vocab(hp.vocab_size).write(plan)
    diffusion, defaulted = dg.diffusion_params(REAL_GENERATION_CONFIG)
    dg.write_dgchat_kv(plan, hp, source="synthetic:random-fullshape", diffusion=diffusion, defaulted=defaulted,
                       eos_ids=REAL_GENERATION_CONFIG["eos_token_id"], enc_scalars=enc_scalars,
                       dec_scalars=dec_scalars, self_cond=_self_conditioning(hp, spec.self_cond_ff, seed))
    tensors = tensor_list(hp, qtype, embd_qtype, enc_scalars, seed)
    # the converter's bookkeeping (file type, byte count) works on TensorPlans; data comes from `tensors`
    plan.tensors = [TensorPlan(t.name, t.shape, t.qtype, produce=_streamed_only) for t in tensors]
    dg.finish_plan(plan, f"diffusiongemma-26B-A4B-shape-random-L{spec.n_layer}-{qtype.name.lower()}")
    plan.u32("general.file_type", int(_FILE_TYPES[qtype]))  # as llama-quantize names a Q4_0 / Q8_0 file
    return plan, tensors


def _streamed_only() -> np.ndarray:
    raise RuntimeError("full-shape tensors are streamed, never produced whole")


# -- writing --------------------------------------------------------------------------------------
ProgressFn = Callable[[int, int, str], None]


def _check_spec(spec: FullShapeSpec, qtype: GGMLQuantizationType, embd_qtype: GGMLQuantizationType) -> None:
    """Every quantized row must divide into whole blocks."""
    if spec.n_embd % GGML_QUANT_SIZES[embd_qtype][0]:
        raise ValueError(f"n_embd = {spec.n_embd} does not divide into {embd_qtype.name} blocks (token_embd)")
    block = GGML_QUANT_SIZES[qtype][0]
    rows = {"n_embd": spec.n_embd, "n_ff": spec.n_ff, "expert_ff": spec.expert_ff,
            "n_head * head_dim_swa": spec.n_head * spec.head_dim_swa,
            "n_head * head_dim_full": spec.n_head * spec.head_dim_full}
    for what, n in rows.items():
        if n % block:
            raise ValueError(f"{what} = {n} is not a multiple of {qtype.name}'s block size {block}")
    if spec.n_expert_used > spec.n_expert:
        raise ValueError("n_expert_used must not exceed n_expert")


def write_fullshape_dg(
    path: str | os.PathLike[str],
    *,
    qtype: str = "q4_0",
    embd_qtype: str | None = None,
    seed: int = 0,
    progress: ProgressFn | None = None,
    **shape: Any,
) -> Path:
    """Write the file to `path` (atomically: a partial name, then renamed). `shape` overrides
    FullShapeSpec fields (n_layer=2, or TINY's keys); `embd_qtype` None picks what llama-quantize
    would (`embedding_qtype`). Returns the path."""
    spec = FullShapeSpec(**shape)
    if qtype not in ("q4_0", "q8_0"):
        raise ValueError(f"qtype must be q4_0 or q8_0 (got {qtype!r})")
    qt = QTYPES[qtype]
    et = embedding_qtype(qt, spec.n_embd) if embd_qtype is None else QTYPES[embd_qtype]
    _check_spec(spec, qt, et)
    plan, tensors = build_plan(spec, qt, et, seed)
    out = Path(path)
    check_space(out.parent, plan.total_bytes)
    tmp = partial_path(out)
    try:
        _write(plan, tensors, tmp, progress)
        _validate(tmp, plan)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def write_header(plan: GGUFPlan, path: Path) -> _Writer:
    """gguf's writer with `plan`'s header, metadata and tensor infos written to `path` (offsets: each
    tensor padded to the alignment), open at their end: the caller writes the data section in that
    layout (or leaves it a hole) and closes the writer."""
    writer = _Writer(None, plan.arch)  # packs numpy metadata arrays in one go (self-conditioning)
    try:
        for key, value, vtype, sub_type in plan.kv:
            if key != "general.architecture":
                writer.add_key_value(key, value, vtype, sub_type)
        for t in plan.tensors:
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes,
                                   raw_dtype=None if t.qtype == Q.F32 else t.qtype)
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
    except BaseException:
        writer.close()
        raise
    return writer


def _write(plan: GGUFPlan, tensors: list[_Tensor], path: Path, progress: ProgressFn | None) -> None:
    # the data section is written here in write_header's layout, piece by piece
    writer = write_header(plan, path)
    try:
        assert writer.fout is not None
        fout = writer.fout[0]
        align = writer.data_alignment
        fout.write(b"\0" * (-fout.tell() % align))
        total, done = plan.total_bytes, 0
        for t, planned in zip(tensors, plan.tensors):
            written = 0
            for chunk in t.chunks():
                fout.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
                written += chunk.nbytes
            if written != planned.nbytes:
                raise RuntimeError(f"{t.name}: wrote {written} bytes, expected {planned.nbytes}")
            fout.write(b"\0" * (-written % align))
            done += written
            if progress is not None:
                progress(done, total, t.name)
        fout.flush()
        os.fsync(fout.fileno())
    finally:
        writer.close()


def _validate(path: Path, plan: GGUFPlan) -> None:
    """dgchat's own header reader (what runs before llama.cpp opens a file) must accept it."""
    from dgchat.model_backend.gguf_file import read_gguf_header

    header = read_gguf_header(path)
    if len(header.tensors) != len(plan.tensors):
        raise RuntimeError(f"{path}: {len(header.tensors)} tensors read back, {len(plan.tensors)} written")


# -- command line ---------------------------------------------------------------------------------
WRITER_OPTIONS = ("layers", "qtype", "embd_qtype", "tiny", "seed", *(f.name for f in dataclasses.fields(FullShapeSpec)))


def add_shape_args(ap: argparse.ArgumentParser) -> None:
    """--layers, --qtype, --tiny and one --<field> option per FullShapeSpec field (WRITER_OPTIONS)."""
    ap.add_argument("--layers", type=int, default=None, help="number of layers (default 30)")
    ap.add_argument("--qtype", choices=("q4_0", "q8_0"), default="q4_0")
    ap.add_argument("--embd-qtype", choices=tuple(QTYPES), default=None,
                    help="token_embd type (default: what llama-quantize picks, q6_k for q4_0 files)")
    ap.add_argument("--tiny", action="store_true", help="small dimensions (a file of a few MB)")
    ap.add_argument("--seed", type=int, default=0)
    for f in dataclasses.fields(FullShapeSpec):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None, help=argparse.SUPPRESS)


def shape_from_args(args: argparse.Namespace) -> dict[str, Any]:
    shape: dict[str, Any] = dict(TINY) if args.tiny else {}
    for f in dataclasses.fields(FullShapeSpec):
        value = getattr(args, f.name)
        if value is not None:
            shape[f.name] = value
    if args.layers is not None:
        shape["n_layer"] = args.layers
    return shape


class ProgressLine:
    """One status line on stderr, refreshed at most twice a second (a file has ~700 tensors)."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, done: int, total: int, name: str) -> None:
        now = time.perf_counter()
        if now - self.last < 0.5 and done < total:
            return
        self.last = now
        print(f"\r{done / 1e9:7.2f} / {total / 1e9:.2f} GB  {name:40.40}", end="", file=sys.stderr, flush=True)
        if done == total:
            print(file=sys.stderr)


def check_file(path: Path) -> None:
    """Load the file into dgchat's engine and print the range of the encoder's logits (as
    log-probabilities) and a short diffusion run, to see that activations stay finite."""
    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.events import FinalEvent
    from dgchat.model_backend.params import DiffusionParams

    with load_engine(path) as engine:
        rng = np.random.default_rng(0)
        tokens = rng.integers(1000 if engine.model.n_vocab > 2000 else 0, engine.model.n_vocab, 12).astype(np.int32)
        logp = engine.pseudo_log_likelihood(tokens[:4], tokens[4:])
        print(f"{engine.info.family}, {engine.label}: encoder log p finite={np.isfinite(logp).all()}, "
              f"min {logp.min():.3f} max {logp.max():.3f}")
        params = DiffusionParams(steps=1, gen_length=16, max_tokens=16, early_stop=False)
        final = [e for e in engine.generate(tokens[:4], params) if isinstance(e, FinalEvent)][0]
        print(f"1 diffusion step on a 16-token canvas: {final.tokens.size} tokens, "
              f"{np.unique(final.tokens).size} distinct, {1000 * final.stats.elapsed_s:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    add_shape_args(ap)
    ap.add_argument("--check", action="store_true", help="load the written file and run it briefly")
    args = ap.parse_args()
    t0 = time.perf_counter()
    path = write_fullshape_dg(args.out, qtype=args.qtype, embd_qtype=args.embd_qtype, seed=args.seed,
                              progress=ProgressLine(), **shape_from_args(args))
    print(f"wrote {path} ({path.stat().st_size / 1e9:.3f} GB) in {time.perf_counter() - t0:.1f} s")
    if args.check:
        check_file(path)


if __name__ == "__main__":
    main()
