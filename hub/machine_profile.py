"""How fast this machine runs what a model's step is made of, measured with the engine itself.

A few seconds of timing, once per engine build (`llamacpp.engine_build_key`) and thread count, cached
in the user cache folder (`machine-profile.json`); `dgchat models hardware --measure` measures again.
dgchat.hub.speed turns a profile and a model's shape into seconds per step and per answer.

What is timed, each with llama.cpp decoding small probe models written on the spot (random weights,
llama architecture; nothing is downloaded):

- matrix products per storage type (q4_0, q4_K, q5_K, q6_K, q8_0, f16, bf16) at 1, 4, 16, 64 and
  256 tokens a decode: the seconds per weight of a whole n-token product. One token reads every
  weight once (memory bandwidth: a probe of >= 96 MB, larger than a CPU's last-level cache); 16 and
  more tokens are compute-bound (a 1-layer probe, d 1024, FFN 4096). A denoising step of a
  256-position canvas runs the 256 column, a left-to-right token the 1 column, a mixture of experts
  at canvas width its experts at ~width x used / experts each. (Every row's logits are asked for:
  llama.cpp runs the last layer's MLP only on the rows asked for.)
- the LM head's product (q6_K, q8_0, f16) on a 16,384 x 1024 output matrix at 1-256 rows, on its
  own: llama.cpp places that tall matrix apart from the layers' weights (never in the CPU's repacked
  buffers; with offload, on the last device), so its speed per weight need not be a layer's. On
  this project's 2-core AVX2 machine the two came out within ~20 % of each other.
- the diffusion head (engine patch 0006) on a 32,768-token vocabulary at 64 rows: the per-logit cost
  of its statistics (softmax, entropy, draws), of the top-256 soft embedding and, per multiply-add,
  of the exact one; where the engine has no head, numpy's statistics (the host path).
- the fixed cost of a decode and of a layer (graph nodes, threads meeting after each), from tiny
  1- and 16-layer probes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from dgchat import paths as app_paths
from dgchat.convert.random_blocks import random_tensor_bytes
from dgchat.hub.util import llamacpp_module
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.sampling import row_stats

SCHEMA = 1
PROFILE_FILE = "machine-profile.json"
MATMUL_TYPES = ("q4_0", "q4_k", "q5_k", "q6_k", "q8_0", "f16", "bf16")
WIDTHS = (1, 4, 16, 64, 256)
# probe shapes
PROBE_EMBD, PROBE_FF, PROBE_HEADS = 1024, 4096, 8
NARROW_BYTES = 96 << 20  # the 1-token probe's weights: more than a CPU's last-level cache
OUTPUT_VOCAB = 16_384  # the LM-head probe's vocabulary
OUTPUT_TYPES = ("q6_k", "q8_0", "f16")  # what LM heads are stored as (others run as q8_0's)
PROBE_VOCAB = 256  # the product probes' own small LM head
HEAD_VOCAB, HEAD_EMBD, HEAD_ROWS, HEAD_TOP_K = 32_768, 256, 64, 256
TINY_EMBD, TINY_LAYERS = 64, (1, 16)

Progress = Callable[[float, str], None]  # fraction done, what is being timed


class ProfileCancelled(DgchatError):
    """The measurement was stopped before it finished (nothing was saved)."""


@dataclass(frozen=True)
class DeviceProfile:
    """Timings of one device. Seconds throughout; `matmul[type][width]` is the time of a product of
    `width` tokens per weight of the matrix (a 1-billion-weight q4_0 matrix at 256 tokens takes
    1e9 * matmul["q4_0"][256] seconds)."""

    kind: str  # "cpu" | "gpu"
    name: str  # the CPU model or the GPU's name
    threads: int
    matmul: dict[str, dict[int, float]]
    stats_s_per_logit: float  # the head's statistics (or numpy's, on the host path) per logit
    topk_s_per_logit: float  # the top-256 soft embedding: selecting each row's most likely tokens
    exact_s_per_mac: float  # the exact soft embedding, per multiply-add
    decode_s: float  # fixed cost of one decode call
    layer_s: float  # per layer and decode
    layer_token_s: float  # per layer and token of a tiny layer (row-wise work beyond the products)
    host_sampler: bool = False  # the engine has no diffusion head: statistics ran in numpy
    basis: str = "measured"  # "measured" | "estimated from published figures"
    # the LM head's product, per type and rows: a tall matrix (the vocabulary) that llama.cpp places
    # apart from the layers' weights (never in the CPU's repacked buffers)
    output: dict[str, dict[int, float]] = field(default_factory=dict)

    def tau(self, qtype: str, width: float, *, output: bool = False) -> float:
        """Seconds per weight of a `width`-token product with weights stored as `qtype` (`output`:
        the LM head's): linear between the measured widths, beyond 256 tokens linear in the width
        (compute-bound)."""
        tables = self.output if output and self.output else self.matmul
        table = tables.get(_proxy_type(qtype)) or tables.get("q8_0") or self.matmul["q8_0"]
        scale = 2.0 if qtype == "f32" and width < 4 else 1.0  # twice the bytes where memory decides
        return scale * _interpolate(table, max(1.0, float(width)))

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("matmul", "output"):
            d[key] = {t: {str(w): v for w, v in row.items()} for t, row in getattr(self, key).items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceProfile:
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in d.items() if k in known}
        for key in ("matmul", "output"):
            values[key] = {str(t): {int(w): float(v) for w, v in row.items()} for t, row in d.get(key, {}).items()}
        for key in ("stats_s_per_logit", "topk_s_per_logit", "exact_s_per_mac", "decode_s", "layer_s",
                    "layer_token_s"):
            values[key] = float(values[key])
        if "q8_0" not in values["matmul"]:
            raise ValueError("no q8_0 timings")
        return cls(**values)


# Storage types without a probe of their own run at the speed of the nearest one measured.
_PROXIES = {"q4_1": "q4_0", "q5_0": "q4_0", "q5_1": "q4_0", "iq4_nl": "q4_0", "iq4_xs": "q4_k", "q2_k": "q4_k",
            "q3_k": "q4_k", "iq2_xxs": "q4_k", "iq2_xs": "q4_k", "iq2_s": "q4_k", "iq3_xxs": "q4_k",
            "iq3_s": "q4_k", "iq1_s": "q4_k", "iq1_m": "q4_k", "mxfp4": "q4_0", "f32": "f16", "q8_1": "q8_0",
            "tq1_0": "q4_k", "tq2_0": "q4_k"}


def _proxy_type(qtype: str) -> str:
    q = qtype.lower()
    return q if q in MATMUL_TYPES else _PROXIES.get(q, "q8_0")


@dataclass(frozen=True)
class MachineProfile:
    build_key: str
    threads: int
    cpu: DeviceProfile
    gpu: DeviceProfile | None = None  # measured where this engine build offloads to a local GPU
    measured_at: str = ""
    seconds: float = 0.0  # how long measuring took
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "build_key": self.build_key, "threads": self.threads, "measured_at": self.measured_at,
                "seconds": round(self.seconds, 2), "cpu": self.cpu.as_dict(),
                "gpu": self.gpu.as_dict() if self.gpu else None, "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MachineProfile:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"schema {d.get('schema')!r}")
        return cls(build_key=str(d["build_key"]), threads=int(d["threads"]), cpu=DeviceProfile.from_dict(d["cpu"]),
                   gpu=DeviceProfile.from_dict(d["gpu"]) if d.get("gpu") else None,
                   measured_at=str(d.get("measured_at", "")), seconds=float(d.get("seconds", 0.0)),
                   notes=tuple(str(n) for n in d.get("notes", ())))


# -- the cache --------------------------------------------------------------------------------------


def profile_path() -> Path:
    return app_paths.cache_dir() / PROFILE_FILE


def default_threads() -> int:
    """The thread count the engine uses when none is configured (llamacpp.LlamaContext's default)."""
    return max(1, os.cpu_count() or 1)


def cached_profile(threads: int | None = None, *, build_key: str | None = None,
                   path: Path | None = None) -> MachineProfile | None:
    """The saved profile if it was measured with this engine build and thread count, else None.
    `build_key` defaults to this engine's (loading llama.cpp)."""
    path = path or profile_path()
    try:
        profile = MachineProfile.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # missing, unreadable or from another version: measured again
    if build_key is None:
        build_key = llamacpp_module().engine_build_key()
    if profile.build_key != build_key or profile.threads != (threads or default_threads()):
        return None
    return profile


def save_profile(profile: MachineProfile, path: Path | None = None) -> Path:
    path = path or profile_path()
    app_paths.atomic_write_text(path, json.dumps(profile.as_dict(), indent=1) + "\n", mode=0o644)
    return path


def ensure_profile(threads: int | None = None, *, remeasure: bool = False, progress: Progress | None = None,
                   cancel: threading.Event | None = None) -> MachineProfile:
    """The cached profile, or a new measurement (a few seconds; saved for next time)."""
    key = llamacpp_module().engine_build_key()
    if not remeasure:
        cached = cached_profile(threads, build_key=key)
        if cached is not None:
            return cached
    profile = measure(threads, progress=progress, cancel=cancel)
    save_profile(profile)
    return profile


# -- measuring --------------------------------------------------------------------------------------


def measure(threads: int | None = None, *, progress: Progress | None = None,
            cancel: threading.Event | None = None, gpu: bool | None = None) -> MachineProfile:
    """Time the engine on this machine: the CPU always, the GPU too where this build offloads.
    Probe files go to a temporary folder under the cache folder and are deleted after."""
    llamacpp = llamacpp_module()
    threads = threads or default_threads()
    key = llamacpp.engine_build_key()
    gpus = llamacpp.local_gpu_devices()
    do_gpu = bool(gpus) if gpu is None else gpu and bool(gpus)
    started = time.perf_counter()
    parts = 2 if do_gpu else 1
    cache = app_paths.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    remove_stale_probes()  # a measurement that was killed leaves its probe files behind
    with tempfile.TemporaryDirectory(prefix="probe-", dir=cache) as tmp:
        def part(i: int) -> Progress | None:
            if progress is None:
                return None
            return lambda f, what: progress((i + f) / parts, what)

        cpu = _measure_device(Path(tmp), "cpu", _cpu_name(), threads, part(0), cancel)
        gpu_profile = (_measure_device(Path(tmp), "gpu", gpus[0].description or gpus[0].name, threads, part(1), cancel)
                       if do_gpu else None)
    if progress is not None:
        progress(1.0, "done")
    return MachineProfile(build_key=key, threads=threads, cpu=cpu, gpu=gpu_profile,
                          measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          seconds=time.perf_counter() - started)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "CPU"


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise ProfileCancelled("measuring this machine was stopped")


def _timed(fn: Callable[[], object], *, reps: int = 3, warm: bool = True) -> float:
    """The shortest of `reps` runs of `fn` (after a warm-up run): the machine's speed when nothing
    else interferes, as steady as a few runs allow."""
    if warm:
        fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _measure_device(folder: Path, kind: str, name: str, threads: int, progress: Progress | None,
                    cancel: threading.Event | None) -> DeviceProfile:
    llamacpp = llamacpp_module()
    gpu_layers = 999 if kind == "gpu" else 0
    n_steps = len(MATMUL_TYPES) + 2
    if progress is not None:
        progress(0.0, "fixed costs per decode and per layer")
    decode_s, layer_s, layer_token_s = _overheads(folder, threads, gpu_layers)
    matmul: dict[str, dict[int, float]] = {}
    output: dict[str, dict[int, float]] = {}
    for i, qtype in enumerate(sorted(MATMUL_TYPES, key=lambda q: q not in OUTPUT_TYPES)):
        _check(cancel)
        if progress is not None:
            progress((i + 1) / n_steps, f"matrix products, {qtype}")
        # the probe's cost besides products: a decode, and each layer's nodes (what scales with the
        # tokens, norms and attention, stays in: a real layer has them too)
        fixed = lambda n, n_layer: decode_s + n_layer * layer_s
        one_token = _one_token_timing(folder, qtype, threads, gpu_layers, fixed)
        if qtype in OUTPUT_TYPES:
            output[qtype] = _output_timings(folder, qtype, threads, gpu_layers, one_token, cancel)
        head = output.get(qtype) or output.get("q8_0")
        matmul[qtype] = {1: one_token, **_wide_timings(folder, qtype, threads, gpu_layers, fixed, head, cancel)}
    _check(cancel)
    if progress is not None:
        progress((len(MATMUL_TYPES) + 1) / n_steps, "the diffusion head over a large vocabulary")
    partial = DeviceProfile(kind=kind, name=name, threads=threads, matmul=matmul, stats_s_per_logit=0.0,
                            topk_s_per_logit=0.0, exact_s_per_mac=0.0, decode_s=decode_s, layer_s=layer_s,
                            layer_token_s=layer_token_s, output=output)
    if llamacpp.engine_info().backend_sampler:
        stats, topk, exact = _head_costs(folder, threads, gpu_layers, partial)
        host = False
    else:
        stats, topk, exact = _host_head_costs()
        host = True
    return DeviceProfile(kind=kind, name=name, threads=threads, matmul=matmul, stats_s_per_logit=stats,
                         topk_s_per_logit=topk, exact_s_per_mac=exact, decode_s=decode_s, layer_s=layer_s,
                         layer_token_s=layer_token_s, host_sampler=host, output=output)


# -- probe models ---------------------------------------------------------------------------------


def write_probe(path: Path, *, qtype: str, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_vocab: int,
                output_type: str = "f16", seed: int = 0, arch: str = "llama", n_ctx: int = 4096) -> Path:
    """A GGUF with random weights: `n_layer` layers of `qtype` matrices, token embedding and output of
    `output_type`. Only shapes and storage types are meant to be real. `arch` "llama" (the probes),
    or "llada" (a masked-diffusion model dgchat runs, for the speed bench; mask token = the last id)."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"dgchat probe {qtype} L{n_layer}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_vocab_size(n_vocab)
    # the smallest vocabulary llama.cpp's BPE loader takes: the probes decode token ids, never text
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(["a", "b", "ab", *(f"<p{i}>" for i in range(3, n_vocab))])
    w.add_token_types([1] * n_vocab)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    if arch == "llada":
        w.add_mask_token_id(n_vocab - 1)
        w.add_diffusion_shift_logits(False)

    def matrix(name: str, rows: int, cols: int, type_name: str) -> None:
        qt = GGMLQuantizationType[type_name.upper()]
        block, size = GGML_QUANT_SIZES[qt]
        data = random_tensor_bytes(rng, qt, rows * cols).reshape(rows, cols // block * size)
        w.add_tensor(name, data, raw_dtype=qt)

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    matrix("token_embd.weight", n_vocab, n_embd, output_type)
    ones("output_norm.weight", n_embd)
    matrix("output.weight", n_vocab, n_embd, output_type)
    for il in range(n_layer):
        ones(f"blk.{il}.attn_norm.weight", n_embd)
        ones(f"blk.{il}.ffn_norm.weight", n_embd)
        for part in ("q", "k", "v", "output"):
            matrix(f"blk.{il}.attn_{part}.weight", n_embd, n_embd, qtype)
        matrix(f"blk.{il}.ffn_gate.weight", n_ff, n_embd, qtype)
        matrix(f"blk.{il}.ffn_up.weight", n_ff, n_embd, qtype)
        matrix(f"blk.{il}.ffn_down.weight", n_embd, n_ff, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def probe_layer_weights(n_embd: int = PROBE_EMBD, n_ff: int = PROBE_FF) -> int:
    """Weights of one probe layer's matrix products (4 attention matrices, 3 FFN matrices)."""
    return 4 * n_embd * n_embd + 3 * n_embd * n_ff


def bytes_per_weight(qtype: str) -> float:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype.upper()]]
    except KeyError:
        return 1.0
    return size / block


@contextmanager
def _probe(path: Path, threads: int, gpu_layers: int, max_tokens: int) -> Iterator[Any]:
    """A context on the probe file at `path` (decodes of up to `max_tokens` tokens); the file is
    deleted afterwards, whatever happens."""
    llamacpp = llamacpp_module()
    try:
        model = llamacpp.LlamaModel(path, n_gpu_layers=gpu_layers)
        try:
            ctx = llamacpp.LlamaContext(model, n_ctx=max(512, max_tokens), max_tokens=max_tokens, n_threads=threads)
            try:
                yield ctx
            finally:
                ctx.close()
        finally:
            model.close()
    finally:
        path.unlink(missing_ok=True)


def _decode_fn(ctx, n: int, vocab: int, **kw: Any) -> Callable[[], object]:
    tokens = (np.arange(n) % (vocab - 3) + 3).astype(np.int32)
    positions = np.arange(n, dtype=np.int32)

    def run() -> object:
        ctx.clear()
        return ctx.decode_tokens(tokens, positions, outputs=kw.get("outputs", [n - 1]), head=kw.get("head"))

    return run


def _one_token_timing(folder: Path, qtype: str, threads: int, gpu_layers: int,
                      fixed: Callable[[int, int], float]) -> float:
    """Seconds per weight of one token: every weight read once, from a probe larger than the last
    level cache (up to 8 layers). `fixed(n, n_layer)`: the probe's cost besides its products."""
    per_layer = probe_layer_weights()
    n_layer = max(1, min(8, -(-NARROW_BYTES // int(per_layer * bytes_per_weight(qtype)))))
    path = write_probe(folder / f"probe-{qtype}-{n_layer}.gguf", qtype=qtype, n_layer=n_layer, n_embd=PROBE_EMBD,
                       n_ff=PROBE_FF, n_head=PROBE_HEADS, n_vocab=PROBE_VOCAB)
    with _probe(path, threads, gpu_layers, 1) as ctx:
        t = _timed(_decode_fn(ctx, 1, PROBE_VOCAB), reps=5)
    return max(t - fixed(1, n_layer), 0.5 * t) / (n_layer * per_layer)


def _wide_timings(folder: Path, qtype: str, threads: int, gpu_layers: int, fixed: Callable[[int, int], float],
                  head: dict[int, float] | None, cancel: threading.Event | None) -> dict[int, float]:
    """Seconds per weight at 4-256 tokens on a 1-layer probe. Every row's logits are asked for:
    llama.cpp runs the last layer's MLP only on the rows asked for, and here the whole layer must
    run at the probe's width; the probe's small LM head (PROBE_VOCAB rows, `head` timings) is
    taken out with the fixed costs."""
    per_layer = probe_layer_weights()
    widths = WIDTHS[1:]
    path = write_probe(folder / f"probe-{qtype}-wide.gguf", qtype=qtype, n_layer=1, n_embd=PROBE_EMBD,
                       n_ff=PROBE_FF, n_head=PROBE_HEADS, n_vocab=PROBE_VOCAB, output_type=qtype)
    out: dict[int, float] = {}
    with _probe(path, threads, gpu_layers, max(widths)) as ctx:
        for n in widths:
            _check(cancel)
            t = _timed(_decode_fn(ctx, n, PROBE_VOCAB, outputs=np.arange(n)), reps=5 if n < 64 else 2)
            lm_head = PROBE_VOCAB * PROBE_EMBD * _interpolate(head, n) if head else 0.0
            out[n] = max(t - fixed(n, 1) - lm_head, 0.5 * t) / per_layer
    return out


def _interpolate(table: dict[int, float], width: float) -> float:
    """A timing table's value at `width`: linear between its widths, proportional beyond the last."""
    pts = sorted(table.items())
    for (w0, t0), (w1, t1) in zip(pts, pts[1:]):
        if width <= w1:
            return t0 + (t1 - t0) * (max(width, w0) - w0) / (w1 - w0)
    return pts[-1][1] * width / pts[-1][0]


def _output_timings(folder: Path, qtype: str, threads: int, gpu_layers: int, one_token: float,
                    cancel: threading.Event | None) -> dict[int, float]:
    """The LM head's product per weight at 1-256 rows, on a probe whose output matrix (OUTPUT_VOCAB
    x PROBE_EMBD, `qtype`) outweighs its one small layer: decodes asking for n rows against the
    same decodes asking for one. One row reads the matrix once, as a layer's one token does."""
    path = write_probe(folder / f"probe-output-{qtype}.gguf", qtype="f16", n_layer=1, n_embd=PROBE_EMBD, n_ff=256,
                       n_head=PROBE_HEADS, n_vocab=OUTPUT_VOCAB, output_type=qtype)
    # (its one f16 layer of MLP width 256 runs its MLP on the rows asked for: 0.8 M weights beside
    # the head's 33.5 M, left in)
    weights = OUTPUT_VOCAB * PROBE_EMBD
    out = {1: one_token}
    with _probe(path, threads, gpu_layers, max(WIDTHS)) as ctx:
        for n in WIDTHS[1:]:
            _check(cancel)
            one = _timed(_decode_fn(ctx, n, OUTPUT_VOCAB), reps=3 if n < 64 else 2)
            rows = _timed(_decode_fn(ctx, n, OUTPUT_VOCAB, outputs=np.arange(n)), reps=3 if n < 64 else 2)
            out[n] = max(rows - one + weights * one_token, weights * one_token) / weights
    return out


def _overheads(folder: Path, threads: int, gpu_layers: int) -> tuple[float, float, float]:
    """decode_s, layer_s, layer_token_s from tiny probes of 1 and 16 layers at 1 and 64 tokens:
    t = decode_s + L * (layer_s + n * layer_token_s), read off as differences."""
    t: dict[tuple[int, int], float] = {}
    for n_layer in TINY_LAYERS:
        path = write_probe(folder / f"probe-tiny-{n_layer}.gguf", qtype="f16", n_layer=n_layer, n_embd=TINY_EMBD,
                           n_ff=2 * TINY_EMBD, n_head=2, n_vocab=256)
        with _probe(path, threads, gpu_layers, 64) as ctx:
            for n in (64, 1):
                t[n_layer, n] = _timed(_decode_fn(ctx, n, 256), reps=7)
    (l0, l1), dl = TINY_LAYERS, TINY_LAYERS[1] - TINY_LAYERS[0]
    layer_s = max(t[l1, 1] - t[l0, 1], 0.0) / dl
    layer_token_s = max((t[l1, 64] - t[l1, 1]) - (t[l0, 64] - t[l0, 1]), 0.0) / (dl * 63)
    decode_s = max(t[l0, 1] - l0 * layer_s, 0.0)
    return decode_s, layer_s, layer_token_s


def _head_costs(folder: Path, threads: int, gpu_layers: int, partial: DeviceProfile) -> tuple[float, float, float]:
    """Per-logit statistics, per-logit top-k selection and per-multiply-add exact soft embedding,
    from decodes of HEAD_ROWS rows on a HEAD_VOCAB-token probe with and without each part."""
    llamacpp = llamacpp_module()
    v, d, n = HEAD_VOCAB, HEAD_EMBD, HEAD_ROWS
    path = write_probe(folder / "probe-head.gguf", qtype="f16", n_layer=1, n_embd=d, n_ff=d, n_head=4, n_vocab=v)
    rng = np.random.default_rng(0)
    sc = llamacpp.SelfConditioningWeights(
        pre_norm=np.ones(d, np.float32), gate=0.02 * rng.standard_normal((d, d), dtype=np.float32),
        up=0.02 * rng.standard_normal((d, d), dtype=np.float32),
        down=0.02 * rng.standard_normal((d, d), dtype=np.float32), embed_scale=float(np.sqrt(d)), eps=1e-6)
    rows = np.arange(n)
    request = llamacpp.HeadRequest(inv_temp=np.ones(n, np.float32), uniform=rng.random(n, dtype=np.float32))
    with_signal = llamacpp.HeadRequest(inv_temp=request.inv_temp, uniform=request.uniform,
                                       sc_write=np.arange(2, n + 2, dtype=np.int32))
    with _probe(path, threads, gpu_layers, n) as ctx:
        base = _timed(_decode_fn(ctx, n, v), reps=4)
        ctx.configure_head(llamacpp.HeadSetup())
        stats = _timed(_decode_fn(ctx, n, v, outputs=rows, head=request), reps=4)
        ctx.configure_head(llamacpp.HeadSetup(self_conditioning=sc, n_slots=n + 2, soft_top_k=HEAD_TOP_K))
        topk = _timed(_decode_fn(ctx, n, v, outputs=rows, head=with_signal), reps=4)
        ctx.configure_head(llamacpp.HeadSetup(self_conditioning=sc, n_slots=n + 2, soft_top_k=0))
        exact = _timed(_decode_fn(ctx, n, v, outputs=rows, head=with_signal), reps=4)
    logits = v * n
    lm_head = v * d * partial.tau("f16", n, output=True)  # the output product the statistics' decode adds
    mlp = 3 * d * d * partial.tau("f32", n)
    stats_s = max(stats - base - lm_head, 0.1 * (stats - base)) / logits
    topk_s = max(topk - stats - mlp, 0.0) / logits
    # a difference of two timings: on a busy machine it can come out near zero; the product is no
    # faster than half the rate of a dense f32 product of the same size
    exact_s = max((exact - stats - mlp) / (logits * d), 0.5 * partial.tau("f32", n) / n)
    return stats_s, topk_s, exact_s


def _host_head_costs() -> tuple[float, float, float]:
    """An engine without the head samples in numpy: its statistics per logit, and numpy's product
    for the exact soft embedding (top-k is not used on the host)."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((HEAD_ROWS, HEAD_VOCAB // 4), dtype=np.float32)
    uniform = rng.random(HEAD_ROWS, dtype=np.float32)
    stats = _timed(lambda: row_stats(logits, inv_temp=1.0, uniform=uniform), ) / logits.size
    probs = rng.random((HEAD_ROWS, HEAD_VOCAB // 4), dtype=np.float32)
    embd = rng.standard_normal((HEAD_VOCAB // 4, HEAD_EMBD), dtype=np.float32)
    exact = _timed(lambda: probs @ embd, ) / (probs.size * HEAD_EMBD)
    return stats, 0.0, exact


def remove_stale_probes(older_than_s: float = 3600.0) -> None:
    """Probe folders left by a measurement that was killed (an hour old: not one running now in
    another dgchat process)."""
    now = time.time()
    for p in app_paths.cache_dir().glob("probe-*"):
        try:
            stale = p.is_dir() and now - p.stat().st_mtime > older_than_s
        except OSError:
            continue
        if stale:
            shutil.rmtree(p, ignore_errors=True)


def summary(profile: MachineProfile | None) -> list[tuple[str, str]]:
    """(label, value) rows for people: when it was measured, and each device's headline figures."""
    if profile is None:
        return [("Speed", "not measured yet (`dgchat models hardware --measure`, a few seconds)")]
    when = profile.measured_at.replace("T", " ").replace("+00:00", " UTC")
    rows = [("Speed", f"measured {when} with {profile.threads} threads in {profile.seconds:.0f} s")]
    for dev in (profile.cpu, profile.gpu):
        if dev is None:
            continue
        bandwidth = bytes_per_weight("q8_0") / dev.matmul["q8_0"][1] / 1e9
        flops = 2 * 256 / dev.matmul["q4_0"][256] / 1e9
        rows.append((dev.kind.upper(), f"{dev.name}: {bandwidth:.0f} GB/s reading weights for one token, "
                                       f"{flops:.0f} GFLOP/s in q4_0 products at 256 tokens"))
    return rows
