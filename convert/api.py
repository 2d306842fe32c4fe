"""`convert()`: a Hugging Face checkpoint folder or a foreign GGUF -> a GGUF dgchat runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dgchat.convert.errors import ConvertError
from dgchat.convert.writer import OUTTYPES, GGUFPlan, ProgressFn, write_gguf


@dataclass(frozen=True)
class ConvertResult:
    source: Path
    output: Path | None  # None for a dry run
    source_kind: str  # "hf" (safetensors folder) or "gguf"
    family: str  # dgchat family, e.g. "diffusion-gemma"
    gguf_arch: str  # general.architecture of the output, e.g. "gemma4"
    outtype: str  # the dominant tensor type written, e.g. "bf16"
    n_tensors: int
    n_bytes: int  # file size (dry run: tensor bytes that would be written)
    dry_run: bool
    notes: tuple[str, ...] = ()


_TYPE_NAMES = {0: "f32", 1: "f16", 7: "q8_0", 32: "bf16"}


def _type_label(plan: GGUFPlan) -> str:
    ft = int(plan.get("general.file_type", 0))
    return _TYPE_NAMES.get(ft, f"ftype{ft}")


def _default_output(source: Path, kind: str, label: str) -> Path:
    if kind == "hf":
        return source.parent / f"{source.name}-{label}.gguf"
    return source.with_name(f"{source.stem}.dgchat.gguf")


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def convert(
    source: Path,
    out: Path | None = None,
    outtype: str = "auto",
    dry_run: bool = False,
    progress: ProgressFn | None = None,
) -> ConvertResult:
    """Convert `source` and write the GGUF atomically (nothing is left behind on failure).

    source: a Hugging Face checkpoint folder (config.json + *.safetensors) or a GGUF file in a
    foreign layout (see `dgchat.convert.gguf_remap.REMAPS`).
    out: output file, or a folder to put the default-named file in; default: next to the source.
    outtype: "auto" keeps the checkpoint's float type; "f32", "f16", "bf16" or "q8_0" convert.
    dry_run: validate everything and report what would be written, write nothing.
    progress: called as progress(bytes_done, bytes_total, tensor_name) after each tensor.
    Raises ConvertError (a DgchatError) with a one-line message on bad input.
    """
    source = Path(source).expanduser()
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown output type {outtype!r}; choose one of: {', '.join(OUTTYPES)}")
    if not source.exists():
        raise ConvertError(f"{source}: no such file or folder")

    if source.is_dir():
        from dgchat.convert.checkpoint import Checkpoint
        from dgchat.convert.families import family_for_hf

        kind = "hf"
        ckpt = Checkpoint(source)
        try:
            family = family_for_hf(ckpt.config)
            plan = family.plan_from_hf(ckpt, outtype, source.name)
            return _finish(plan, source, out, kind, family.NAME, outtype, dry_run, progress)
        finally:
            ckpt.close()
    if not _is_gguf(source):
        raise ConvertError(f"{source}: not a checkpoint folder or a GGUF file")
    from dgchat.convert.gguf_remap import plan_from_gguf

    arch, plan = plan_from_gguf(source, outtype, source.stem)
    return _finish(plan, source, out, "gguf", arch, outtype, dry_run, progress)


def _finish(
    plan: GGUFPlan, source: Path, out: Path | None, kind: str, family: str, outtype: str,
    dry_run: bool, progress: ProgressFn | None,
) -> ConvertResult:
    label = _type_label(plan)
    if out is None:
        target = _default_output(source, kind, label)
    else:
        target = Path(out).expanduser()
        if target.is_dir():
            target = target / _default_output(source, kind, label).name
    if target.exists() and source.exists() and target.resolve() == source.resolve():
        raise ConvertError(f"{target}: the output would overwrite the source")
    if dry_run:
        size = plan.total_bytes
        output = None
    else:
        size = write_gguf(plan, target, progress)
        output = target
    return ConvertResult(source, output, kind, family, plan.arch, label, len(plan.tensors), size, dry_run,
                         tuple(plan.notes))
