"""What the Models screen writes about this machine and checks before an import, and how it tells
whether a row is the model in use (paths compared resolved)."""

from __future__ import annotations

from pathlib import Path

from dgchat.app.model_ops import short_path
from dgchat.app.model_source import ServerSource
from dgchat.hub import Hardware
from dgchat.hub.util import format_bytes
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.model_info import inspect_header


def hardware_line(hw: Hardware, *, short: bool = False) -> str:
    if short:
        parts = [f"{hw.cpu_cores} cores" if hw.cpu_cores is not None else "cores ?",
                 f"{format_bytes(hw.ram_total)} RAM" if hw.ram_total is not None else "RAM ?",
                 f"{format_bytes(hw.disk_free)} free disk" if hw.disk_free is not None else "free disk ?"]
        if hw.gpu_offload and hw.vram_total is not None:
            parts.append(f"{format_bytes(hw.vram_total)} {'unified' if hw.unified_memory else 'VRAM'}")
        elif not hw.gpu_offload:
            parts.append("CPU only")
        return " · ".join(parts) + (" (corrected)" if hw.overridden else "")
    gpu = "GPU offload" if hw.gpu_offload else "CPU only (no GPU offload in this build)"
    vram = ""
    if hw.vram_total is not None:
        vram = f" · {format_bytes(hw.vram_total)} {'unified memory' if hw.unified_memory else 'VRAM'}"
    cores = f"{hw.cpu_cores} CPU cores" if hw.cpu_cores is not None else "CPU cores unknown"
    ram = f"{format_bytes(hw.ram_total)} RAM" if hw.ram_total is not None else "RAM unknown"
    disk = (f"{format_bytes(hw.disk_free)} free in {short_path(hw.models_dir)}" if hw.disk_free is not None
            else f"free disk unknown in {short_path(hw.models_dir)}")
    corrected = " · corrected by you" if hw.overridden else ""
    return f"This machine: {cores} · {ram} · {disk} · {gpu}{vram}{corrected}"


def import_check(text: str) -> str | None:
    """Why `text` cannot be imported, from the file's header alone, or None."""
    if not text:
        return "enter the path of a GGUF file"
    path = Path(text).expanduser()
    try:
        header = read_gguf_header(path)
        if header.architecture != "diffusion-gemma":  # the upstream layout is converted on import
            inspect_header(header)
    except DgchatError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {text}: {exc.strerror or exc}"
    return None


def resolved_path(path: Path | str | ServerSource | None) -> Path | None:
    if path is None or isinstance(path, ServerSource):
        return None  # a server's model is no file of this list
    try:
        return Path(path).expanduser().resolve()
    except OSError:
        return Path(path).expanduser().absolute()
