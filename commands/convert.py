"""`dgchat convert`: a Hugging Face checkpoint folder (or a foreign GGUF) -> a GGUF dgchat runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dgchat.commands.common import add_common

OUTTYPES = ("auto", "f32", "f16", "bf16", "q8_0")  # dgchat.convert.writer.OUTTYPES, without importing numpy


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a checkpoint folder or foreign GGUF to a dgchat GGUF",
        description="Convert a Hugging Face checkpoint folder (config.json + *.safetensors) or a GGUF in a "
        "foreign layout (e.g. llama.cpp PR #24423's diffusion-gemma) into a GGUF dgchat runs.",
    )
    add_common(p)
    p.add_argument("source", type=Path, help="checkpoint folder or .gguf file")
    p.add_argument("-o", "--output", type=Path, help="output file or folder (default: next to the source)")
    p.add_argument("--outtype", choices=OUTTYPES, default="auto",
                   help="tensor type: auto keeps the checkpoint's (default), or f32/f16/bf16/q8_0")
    p.add_argument("--dry-run", action="store_true", help="check the source and show what would be written")


def run(args: argparse.Namespace) -> int:
    from dgchat.convert import convert

    show = sys.stderr.isatty()
    last = {"pct": -1}

    def progress(done: int, total: int, _name: str) -> None:
        pct = int(100 * done / total) if total else 100
        if show and pct != last["pct"]:
            last["pct"] = pct
            sys.stderr.write(f"\rconverting: {pct:3d}%")
            sys.stderr.flush()

    res = convert(args.source, args.output, outtype=args.outtype, dry_run=args.dry_run, progress=progress)
    if show and last["pct"] >= 0:
        sys.stderr.write("\n")
    for note in res.notes:
        print(f"note: {note}")
    size = f"{res.n_bytes / 1e6:.1f} MB"
    if res.dry_run:
        print(f"{res.family} -> {res.gguf_arch} GGUF ({res.outtype}): {res.n_tensors} tensors, {size} (dry run, nothing written)")
    else:
        print(f"wrote {res.output} ({res.family} -> {res.gguf_arch}, {res.outtype}, {res.n_tensors} tensors, {size})")
    return 0
