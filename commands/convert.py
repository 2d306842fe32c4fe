"""`dgchat convert`: a Hugging Face checkpoint folder (or a GGUF) -> a GGUF dgchat runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dgchat.commands.common import add_common, threads_arg
from dgchat.convert.api import convert
from dgchat.convert.quantize import QUANT_TYPES
from dgchat.convert.writer import OUTTYPES
from dgchat.model_backend.errors import ModelFileError
from dgchat.model_backend.gguf_file import read_gguf_header


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a checkpoint folder or GGUF to a dgchat GGUF (optionally quantized / cache-capable)",
        description="Convert a Hugging Face checkpoint folder (config.json + *.safetensors: LLaDA, LLaDA-MoE, "
        "Dream, RND1, DiffusionGemma, block diffusion: SDAR, BD3LM) or a GGUF (llama.cpp's "
        "llada/dream/llada-moe/rnd1, or the upstream diffusion-gemma layout) into a GGUF dgchat runs.",
    )
    add_common(p)
    p.add_argument("source", type=Path, help="checkpoint folder or .gguf file")
    p.add_argument("-o", "--output", type=Path, help="output file or folder (default: next to the source)")
    p.add_argument("--outtype", choices=OUTTYPES, default="auto",
                   help="tensor type: auto keeps the checkpoint's (default), or f32/f16/bf16/q8_0")
    p.add_argument("--quantize", metavar="TYPE", type=str.upper, choices=tuple(QUANT_TYPES),
                   help=f"then quantize with llama.cpp's quantizer: {', '.join(QUANT_TYPES)}")
    p.add_argument("--cache-capable", action="store_true",
                   help="write a masked-diffusion model under an architecture with a KV cache (llada -> llama, "
                   "dream -> qwen2, llada-moe -> hy_v3, rnd1 -> qwen3moe) so prefix/dual caching works")
    p.add_argument("--threads", type=threads_arg, default=None, metavar="N",
                   help="quantizer threads, 1 to 4 per core (default: all cores)")
    p.add_argument("--dry-run", action="store_true", help="check the source and show what would be written")


def run(args: argparse.Namespace) -> int:
    show = sys.stderr.isatty()
    last = {"line": ""}

    def say(text: str) -> None:
        if show and text != last["line"]:
            last["line"] = text
            sys.stderr.write("\r" + text)
            sys.stderr.flush()

    def progress(done: int, total: int, _name: str) -> None:
        say(f"converting: {int(100 * done / total) if total else 100:3d}%")

    def quant_progress(i: int, n: int, name: str) -> None:
        say(f"quantizing: {int(100 * (i - 1) / n) if n else 100:3d}% {name[:40]:<40}")

    res = convert(args.source, args.output, outtype=args.outtype, dry_run=args.dry_run, progress=progress,
                  quantize=args.quantize, cache_capable=args.cache_capable, quantize_progress=quant_progress,
                  n_threads=args.threads)
    if show and last["line"]:
        sys.stderr.write("\n")
    for note in res.notes:
        print(f"note: {note}")
    size = f"{res.n_bytes / 1e6:.1f} MB"
    family = _family_label(res.family, res.output)
    if res.dry_run:
        print(f"{family} -> {res.gguf_arch} GGUF: {res.n_tensors} tensors ({res.types_text()}), {size} "
              "(dry run, nothing written)")
    else:
        print(f"wrote {res.output} ({family} -> {res.gguf_arch}, {res.outtype}, {res.n_tensors} tensors "
              f"({res.types_text()}), {size})")
    return 0


def _family_label(family: str, output: Path | None) -> str:
    """The family, with its variant for block diffusion ("block-diffusion sdar"), read back from the
    written file (a dry run's notes name the variant)."""
    if family != "block-diffusion" or output is None:
        return family
    try:
        variant = read_gguf_header(output).get("dgchat.block_diffusion.variant")
    except (ModelFileError, OSError):
        return family
    return f"{family} {variant}" if isinstance(variant, str) else family
