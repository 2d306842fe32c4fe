"""llama.cpp's quantizer (`llama_model_quantize`): GGUF in, GGUF out, with per-tensor progress."""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections.abc import Callable

from dgchat.model_backend.errors import EngineError
from dgchat.model_backend.llamacpp.library import last_error_line, set_log_hook
from dgchat.model_backend.llamacpp.library import llama_cpp as _llama
from dgchat.model_backend.params import check_threads


# llama.cpp's quantizer logs "[   3/ 291] blk.0.attn_q.weight - [...]" as it starts each tensor
# (src/llama-quant.cpp, llama_model_quantize_impl); there is no progress callback in its params
_QUANT_PROGRESS = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")


def quantize_model(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    ftype: str,
    *,
    n_threads: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> None:
    """Run llama.cpp's quantizer: `src` GGUF -> `dst` GGUF of file type `ftype` ("Q4_K_M", ...).

    Every metadata key of `src` is copied (llama.cpp copies the whole KV section and updates
    general.file_type). `progress(i, n, tensor_name)` is called as tensor i of n starts. The call
    runs in a worker thread so that Ctrl-C reaches the caller; llama.cpp itself cannot be
    interrupted, so the worker may still be writing `dst` when KeyboardInterrupt propagates.
    Raises EngineError with llama.cpp's own error line on failure."""
    value = getattr(_llama, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if value is None:
        raise EngineError(f"this llama.cpp has no quantization type {ftype}")
    check_threads(n_threads or None, "threads")  # llama.cpp starts every thread asked for
    params = _llama.llama_model_quantize_default_params()
    params.nthread = int(n_threads or 0)  # 0: all cores
    params.ftype = int(value)
    result: dict[str, int] = {}

    def on_log(chunk: str) -> None:
        m = _QUANT_PROGRESS.search(chunk)
        if m and progress is not None:
            progress(int(m.group(1)), int(m.group(2)), m.group(3))

    def work() -> None:
        result["rc"] = int(_llama.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params)))

    set_log_hook(on_log)
    try:
        worker = threading.Thread(target=work, name="llama-quantize", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
    finally:
        set_log_hook(None)
    if result.get("rc", 1) != 0:
        raise EngineError(last_error_line() or "llama_model_quantize failed")
