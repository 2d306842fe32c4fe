"""`convert()`: a Hugging Face checkpoint folder or a GGUF -> a GGUF dgchat runs, optionally
rewritten for a KV cache (`cache_capable`) and quantized by llama.cpp (`quantize`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dgchat.convert.checkpoint import Checkpoint
from dgchat.convert.errors import ConvertError
from dgchat.convert.families import family_for_hf
from dgchat.convert.gguf_remap import plan_from_gguf
from dgchat.convert.quantize import check_type, estimate_bytes, quantize_gguf
from dgchat.convert.writer import OUTTYPES, PARTIAL_PREFIX, GGUFPlan, ProgressFn, check_space, write_gguf
from dgchat.model_backend.gguf_file import read_gguf_header


@dataclass(frozen=True)
class ConvertResult:
    source: Path
    output: Path | None  # None for a dry run
    source_kind: str  # "hf" (safetensors folder) or "gguf"
    family: str  # dgchat family, e.g. "diffusion-gemma", "llada" (GGUF sources: their architecture)
    gguf_arch: str  # general.architecture of the output, e.g. "gemma4", "llada", "llama"
    outtype: str  # the dominant tensor type written, e.g. "bf16", or the quantization, e.g. "q4_k_m"
    n_tensors: int
    n_bytes: int  # file size (dry run: tensor bytes that would be written before quantization)
    dry_run: bool
    notes: tuple[str, ...] = ()
    quantized: str | None = None  # llama.cpp file type the output was quantized to, e.g. "Q4_K_M"
    tensor_types: tuple[tuple[str, int], ...] = ()  # (ggml type name, tensor count), most common first

    def types_text(self) -> str:
        return ", ".join(f"{n} {name}" for name, n in self.tensor_types)


_TYPE_NAMES = {0: "f32", 1: "f16", 7: "q8_0", 32: "bf16"}


def _type_label(plan: GGUFPlan) -> str:
    ft = int(plan.get("general.file_type", 0))
    return _TYPE_NAMES.get(ft, f"ftype{ft}")


def _default_output(source: Path, kind: str, label: str, cache_capable: bool, quantized: bool) -> Path:
    if kind == "hf":
        return source.parent / f"{source.name}{'-kvcache' if cache_capable else ''}-{label}.gguf"
    parts = [source.stem]
    if cache_capable:
        parts.append("kvcache")
    if quantized:
        parts.append(label)
    if len(parts) == 1:
        parts.append("dgchat")
    return source.with_name(".".join(parts) + ".gguf")


def _type_counts(names: list[str]) -> tuple[tuple[str, int], ...]:
    from collections import Counter

    return tuple(Counter(names).most_common())


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
    *,
    quantize: str | None = None,
    cache_capable: bool = False,
    quantize_progress: ProgressFn | None = None,
    n_threads: int | None = None,
) -> ConvertResult:
    """Convert `source` and write the GGUF atomically (nothing is left behind on failure).

    source: a Hugging Face checkpoint folder (config.json + *.safetensors) or a GGUF file: a foreign
    layout (see `dgchat.convert.gguf_remap`), a llada/dream/llada-moe/rnd1 file, or (with
    `quantize`) any GGUF dgchat wrote.
    out: output file, or a folder to put the default-named file in; default: next to the source.
    outtype: "auto" keeps the checkpoint's float type; "f32", "f16", "bf16" or "q8_0" convert.
    quantize: a llama.cpp file type ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", ... see
    `dgchat.convert.quantize.QUANT_TYPES`) to quantize the result to with llama.cpp's quantizer.
    cache_capable: write the masked-diffusion model under an architecture with a KV cache
    (llada -> llama, dream -> qwen2, llada-moe -> hy_v3, rnd1 -> qwen3moe).
    dry_run: validate everything and report what would be written, write nothing.
    progress: called as progress(bytes_done, bytes_total, tensor_name) after each tensor written;
    quantize_progress: as progress(i, n, tensor_name) when llama.cpp starts quantizing tensor i.
    Raises ConvertError (a DgchatError) with a one-line message on bad input.
    """
    source = Path(source).expanduser()
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown output type {outtype!r}; choose one of: {', '.join(OUTTYPES)}")
    qtype = None
    if quantize is not None:
        qtype = check_type(quantize)
    if not source.exists():
        raise ConvertError(f"{source}: no such file or folder")

    job = _Job(source, out, outtype, dry_run, progress, qtype, quantize_progress, cache_capable, n_threads)
    if source.is_dir():
        ckpt = Checkpoint(source)
        try:
            try:
                family = family_for_hf(ckpt.config)
                plan = family.plan_from_hf(ckpt, outtype, source.name, cache_capable=cache_capable)
            except (TypeError, ValueError, ArithmeticError, KeyError, IndexError, AttributeError) as exc:
                # config.json is untrusted JSON: a string or a list where a size belongs reaches an
                # int() or an index somewhere in a family's planner; say which file, in one line
                detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                raise ConvertError(f"{source.name}: config.json holds a value of the wrong type or range "
                                   f"({detail})") from None
            return job.finish(plan, "hf", family.NAME)
        finally:
            ckpt.close()
    if not _is_gguf(source):
        raise ConvertError(f"{source}: not a checkpoint folder or a GGUF file")

    try:
        arch, plan = plan_from_gguf(source, outtype, source.stem, cache_capable=cache_capable,
                                    passthrough=qtype is not None)
    except (TypeError, ValueError, ArithmeticError, KeyError, IndexError, AttributeError) as exc:
        # a foreign GGUF's metadata is untrusted too: a string where a size belongs, a missing tensor
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise ConvertError(f"{source.name}: its metadata holds a value of the wrong type or range ({detail})") from None
    return job.finish(plan, "gguf", arch)


@dataclass
class _Job:
    source: Path
    out: Path | None
    outtype: str
    dry_run: bool
    progress: ProgressFn | None
    qtype: str | None
    quantize_progress: ProgressFn | None
    cache_capable: bool
    n_threads: int | None

    def target(self, kind: str, label: str) -> Path:
        default = _default_output(self.source, kind, label, self.cache_capable, self.qtype is not None)
        if self.out is None:
            target = default
        else:
            target = Path(self.out).expanduser()
            if target.is_dir():
                target = target / default.name
        if target.exists() and target.resolve() == self.source.resolve():
            raise ConvertError(f"{target}: the output would overwrite the source")
        return target

    def finish(self, plan: GGUFPlan | None, kind: str, family: str) -> ConvertResult:
        """Write `plan` (None: the GGUF source needs no rewriting, only quantizing)."""
        label = self.qtype.lower() if self.qtype else _type_label(plan)  # type: ignore[arg-type]
        target = self.target(kind, label)
        notes = list(plan.notes) if plan is not None else []
        if self.qtype is None:
            assert plan is not None
            types = _type_counts([t.qtype.name.lower() for t in plan.tensors])
            if self.dry_run:
                return self._result(target, kind, family, plan.arch, label, len(plan.tensors), plan.total_bytes, notes,
                                    types)
            size = write_gguf(plan, target, self.progress)
            return self._result(target, kind, family, plan.arch, label, len(plan.tensors), size, notes, types)
        return self._quantized(plan, target, kind, family, label, notes)

    def _quantized(self, plan: GGUFPlan | None, target: Path, kind: str, family: str, label: str,
                   notes: list[str]) -> ConvertResult:
        import secrets

        assert self.qtype is not None
        if plan is None:
            header = read_gguf_header(self.source)
            arch, n_tensors, n_bytes = header.architecture or "?", len(header.tensors), header.file_size
            types = _type_counts([t.type_name.lower() for t in header.tensors.values()])
        else:
            arch, n_tensors, n_bytes = plan.arch, len(plan.tensors), plan.total_bytes
            types = _type_counts([t.qtype.name.lower() for t in plan.tensors])
        if self.dry_run:
            notes.append(f"then quantized to {self.qtype} by llama.cpp (size known once quantized)")
            return self._result(target, kind, family, arch, label, n_tensors, n_bytes, notes, types)
        intermediate = None
        try:
            if plan is None:
                src = self.source
            else:
                # both files exist at once: check for the pair before writing anything
                import numpy as np

                big = sum(int(np.prod(t.shape)) for t in plan.tensors if len(t.shape) > 1)
                small = sum(int(np.prod(t.shape)) for t in plan.tensors) - big
                check_space(target.parent, plan.total_bytes + estimate_bytes(big, small, self.qtype))
                # the unquantized file is only a step: a partial-prefixed name in the output folder
                intermediate = target.parent / f"{PARTIAL_PREFIX}{target.name}-{secrets.token_hex(4)}-unquantized"
                write_gguf(plan, intermediate, self.progress)
                src = intermediate
            size = quantize_gguf(src, target, self.qtype, progress=self.quantize_progress, n_threads=self.n_threads)
        finally:
            if intermediate is not None:
                try:
                    intermediate.unlink()
                except FileNotFoundError:
                    pass
        header = read_gguf_header(target)
        types = _type_counts([t.type_name.lower() for t in header.tensors.values()])
        return self._result(target, kind, family, header.architecture or arch, label, len(header.tensors), size,
                            notes, types)

    def _result(self, target: Path, kind: str, family: str, arch: str, label: str, n_tensors: int, n_bytes: int,
                notes: list[str], types: tuple[tuple[str, int], ...]) -> ConvertResult:
        return ConvertResult(self.source, None if self.dry_run else target, kind, family, arch, label, n_tensors,
                             n_bytes, self.dry_run, tuple(notes), self.qtype, types)
