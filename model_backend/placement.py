"""Where a model's weights go: the GPU, system RAM, or both, decided from sizes and free memory.

One plan per load: everything on the GPU when the weights, the KV cache and the canvas's buffers fit
in its free memory; else every layer on the GPU with the routed experts of as few layers as needed
kept in RAM (what llama.cpp's `--n-cpu-moe N` does by hand: the experts are most of a mixture of
experts' bytes but a small share of its work per token); else the experts of every layer in RAM and
as many whole layers as fit on the GPU; else the CPU. The plan becomes llama.cpp's `n_gpu_layers`
and a list of tensor-name patterns kept in RAM (`llama_model_params.tensor_buft_overrides`, passed
by model_backend/llamacpp/model.py).

Why a module of ours, not llama.cpp's fitter: the vendored llama.cpp has one (common/fit.cpp,
`common_fit_params`), but it lives in llama-common, which dgchat's lean engine build leaves out,
includes the internal src/llama-ext.h, and is not part of libllama's C API, so using it would need
a patch that builds llama-common's internals into libllama. It also measures by loading the file
with no_alloc, so it cannot predict for a catalog model that is not downloaded yet (the wizard and
`models list` need that), and it does not know the buffers dgchat's diffusion head adds (the
transposed token embedding of DiffusionGemma's exact self-conditioning). Sizes here come from the
GGUF header (`ModelBytes.from_header`) or from a catalog shape (`ModelBytes.from_shape`).

Facts of the vendored llama.cpp this relies on (src/llama-model.cpp, `load_tensors`):
- the input layer (token_embd) always stays on the CPU ("there is very little benefit to
  offloading the input layer");
- `n_gpu_layers = N` offloads the OUTPUT layer first, then the last N-1 repeating layers
  (i_gpu_start = n_layer + 1 - N; the output layer is index n_layer): N >= n_layer + 1 is
  everything; a model with tied embeddings gets a copy of token_embd as its LM head
  (TENSOR_DUPLICATED) on the output layer's device;
- a tensor whose name a pattern matches (std::regex_search, src/llama-model-loader.cpp) goes to the
  pattern's buffer type; the CPU's keeps it in RAM even when its layer is on the GPU.

No ctypes here: hub/ imports this for predictions on machines without the engine loaded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.gguf_file import GgufHeader

GiB = 1 << 30
MiB = 1 << 20
MODES = ("gpu", "experts-in-ram", "layers-split", "cpu")
EXPERTS_ON = ("auto", "cpu", "gpu")
# Free memory kept back: a share of the device (fragmentation, allocations that grow after the
# load such as a larger context) plus a fixed amount (driver scratch, cuBLAS/Vulkan workspaces).
DEFAULT_MARGIN = 0.06
RESERVE_BYTES = 256 * MiB
# The routed experts' tensors, as llama.cpp's LLM_FFN_EXPS_REGEX names them (common/common.h:
# "\.ffn_(up|down|gate|gate_up)_(ch|)exps"): their weights, and the scales or biases beside them.
_EXPERTS = r"ffn_(?:up|down|gate|gate_up)_(?:ch)?exps"
_EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\." + _EXPERTS)
_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")
# the input layer: llama.cpp keeps these on the CPU whatever n_gpu_layers is
_INPUT_PREFIXES = ("token_embd.", "per_layer_token_embd.", "position_embd.", "pos_embd.", "token_types.")
_OUTPUT_PREFIXES = ("output.", "output_norm.")
# diffusion_gemma.py's EMBD_T_F32_BYTES: above this the head keeps the transposed embedding in f16
# (a test holds the two equal; this module may not import the engine)
HEAD_EMBD_T_F32_BYTES = 512 << 20
# logits-sized f32 buffers a decode of the canvas holds at once on the output device: the logits,
# the soft-capped / biased copy, the softmax of the diffusion head, and its row statistics'
# scratch. 4 x 256 x 262,144 x 4 B = 1 GiB for DiffusionGemma, the catalog's `extra_bytes`.
LOGIT_BUFFERS = 4


@dataclass(frozen=True)
class LayerBytes:
    dense: int  # a repeating layer's weights other than routed experts (attention, norms, shared MLP, router)
    experts: int  # its routed experts' tensors (blk.N.ffn_*_exps.*)

    @property
    def total(self) -> int:
        return self.dense + self.experts


@dataclass(frozen=True)
class ModelBytes:
    """A model's weight bytes by where llama.cpp can put them."""

    layers: tuple[LayerBytes, ...]
    # the input layer (token_embd): always in RAM (src/llama-model.cpp, `dev_input = cpu_dev`)
    token_embedding: int
    # output norm + LM head: on the output layer's device, which is the GPU whenever n_gpu_layers
    # >= 1; with tied embeddings the head is a copy of token_embd there (counted here)
    output: int
    # anything else (gemma4's rope_freqs, which llama.cpp duplicates into every layer; gemma3n's
    # projections): small; counted on the GPU whenever any layer is. DiffusionGemma's
    # self-conditioning weights are metadata, not tensors: dgchat's head uploads them to the
    # output device at run time, so they are in `runtime_bytes`.
    other: int = 0
    # the bytes of `output` that are llama.cpp's copy of token_embd (tied embeddings, no
    # output.weight; 0 when untied): in the file, and on the CPU, they are token_embd's own
    output_copy: int = 0

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    @property
    def experts(self) -> int:
        return sum(layer.experts for layer in self.layers)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def weights(self) -> int:
        """Every weight byte as the file holds it (a tied head counted once)."""
        head = self.output - self.output_copy
        return self.token_embedding + sum(layer.total for layer in self.layers) + head + self.other

    @classmethod
    def from_header(cls, header: GgufHeader) -> ModelBytes:
        """Sizes from a GGUF header's tensor list (each tensor's bytes from its ggml type and shape)."""
        n_layer = header.arch_key("block_count")
        dense: dict[int, int] = {}
        experts: dict[int, int] = {}
        token_embedding = output = other = 0
        has_head = "output.weight" in header.tensors
        for name, info in header.tensors.items():
            if (m := _EXPERT_TENSOR.match(name)) is not None:
                experts[int(m.group(1))] = experts.get(int(m.group(1)), 0) + info.nbytes
            elif (m := _LAYER_TENSOR.match(name)) is not None:
                dense[int(m.group(1))] = dense.get(int(m.group(1)), 0) + info.nbytes
            elif name.startswith(_INPUT_PREFIXES):
                token_embedding += info.nbytes
            elif name.startswith(_OUTPUT_PREFIXES):
                output += info.nbytes
            else:
                other += info.nbytes
        embd = header.tensors.get("token_embd.weight")
        copy = embd.nbytes if not has_head and embd is not None else 0
        output += copy  # llama.cpp loads a copy of token_embd as the LM head (TENSOR_DUPLICATED)
        indices = set(dense) | set(experts)
        count = max(n_layer if isinstance(n_layer, int) else 0, max(indices, default=-1) + 1)
        layers = tuple(LayerBytes(dense.get(i, 0), experts.get(i, 0)) for i in range(count))
        return cls(layers=layers, token_embedding=token_embedding, output=output, other=other, output_copy=copy)

    @classmethod
    def from_shape(cls, *, n_layer: int, n_embd: int, n_vocab: int, file_size: int, n_head: int = 0,
                   head_dim: int = 0, n_head_kv: int = 0, n_ff: int = 0, n_expert: int = 0, n_ff_expert: int = 0,
                   tied: bool = True) -> ModelBytes:
        """An estimate for a model that is not on disk (a catalog entry): parameter counts from the
        shape, scaled so that they add up to the file's size: one average bits-per-weight for the
        whole file, where a Q4 file's token embedding is often Q6_K (the full-shape DiffusionGemma's
        header has 1.4x this estimate's embedding bytes, 2% fewer expert bytes). Unknown widths (0)
        count as none. tied: the LM head is the token embedding (a copy of it goes to the GPU)."""
        head_dim = head_dim or (n_embd // n_head if n_head else 0)
        attention = n_embd * head_dim * (2 * n_head + 2 * (n_head_kv or n_head)) if n_head else 4 * n_embd * n_embd
        dense = attention + 3 * n_embd * n_ff + n_embd * n_expert + 4 * n_embd  # + router and norms
        experts = 3 * n_embd * n_ff_expert * n_expert
        embd = n_embd * n_vocab
        total = n_layer * (dense + experts) + embd * (1 if tied else 2)
        scale = file_size / total if total else 0.0
        layer = LayerBytes(round(dense * scale), round(experts * scale))
        embd_bytes = round(embd * scale)
        return cls(layers=(layer,) * n_layer, token_embedding=embd_bytes, output=embd_bytes,
                   output_copy=embd_bytes if tied else 0)


@dataclass(frozen=True)
class Placement:
    mode: str  # "gpu" (everything), "experts-in-ram", "layers-split", "cpu"
    gpu_layers: int  # llama.cpp's n_gpu_layers for this placement
    experts_in_ram: tuple[int, ...]  # layer indices whose experts stay in RAM
    gpu_bytes: int  # weights + context/compute buffers on the GPU
    ram_bytes: int  # weights in RAM
    gpu_free: int  # the free memory the plan was made for (0: no GPU)
    reason: str  # why this placement
    n_layer: int = 0  # the model's repeating layers (for the summary)

    @property
    def layers_on_gpu(self) -> int:
        """Repeating layers on the GPU (n_gpu_layers counts the output layer first)."""
        return max(0, min(self.gpu_layers - 1, self.n_layer))

    def overrides(self) -> list[str]:
        """The tensor-name patterns llama.cpp keeps in RAM (std::regex_search against each name):
        one pattern per run of consecutive layers."""
        return [_run_pattern(a, b) for a, b in _runs(self.experts_in_ram)]

    def summary(self) -> str:
        """One line for `model: info` and logs."""
        if self.mode == "cpu":
            return f"CPU only · RAM {_gib(self.ram_bytes)} ({self.reason})"
        parts = [f"{self.layers_on_gpu} of {self.n_layer} layers"]
        if self.experts_in_ram:
            parts.append(f"experts of {_layers(len(self.experts_in_ram))} in RAM")
        return f"GPU {_gib(self.gpu_bytes)} ({', '.join(parts)}) · RAM {_gib(self.ram_bytes)}"

    def as_json(self) -> dict[str, Any]:
        """For `dgchat generate --json`'s "placement"."""
        return {"mode": self.mode, "gpu_layers": self.gpu_layers, "layers_on_gpu": self.layers_on_gpu,
                "n_layer": self.n_layer, "experts_in_ram": list(self.experts_in_ram), "gpu_bytes": self.gpu_bytes,
                "ram_bytes": self.ram_bytes, "gpu_free": self.gpu_free, "reason": self.reason}


def _layers(n: int) -> str:
    return f"{n} layer" if n == 1 else f"{n} layers"


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB // 10 else f"{n / (1 << 20):.1f} MiB"  # a small model: not "0.0 GiB"


def _runs(indices: Iterable[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i in sorted(set(indices)):
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _run_pattern(first: int, last: int) -> str:
    # the layer numbers spelled out: std::regex has no numeric ranges, and `blk\.1\.` must not
    # match blk.10 (the dot after the number sees to that)
    numbers = "|".join(str(i) for i in range(first, last + 1))
    return rf"^blk\.(?:{numbers})\.{_EXPERTS}"


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether llama.cpp's regex_search of `pattern` finds `name` (the patterns here use only
    syntax that ECMAScript std::regex and Python's re read alike)."""
    return re.search(pattern, name) is not None


def parse_bytes(text: str) -> int:
    """"12G", "12GiB", "2048M", "1.5G", "8000000000": bytes (K, M, G, T are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if m is None:
        raise InvalidParameterError(f"{text!r} is not a memory size (examples: 12G, 2048M, 1.5GiB)")
    return int(float(m.group(1)) * 1024 ** "_kmgt".index(m.group(2) or "_"))


# -- runtime buffers -------------------------------------------------------------------------------
def runtime_bytes(*, n_ctx: int, n_layer: int, n_head_kv: int, head_dim: int, n_vocab: int, n_embd: int,
                  canvas: int = 256, n_head: int = 0, n_layer_swa: int = 0, sliding_window: int = 0,
                  n_head_kv_full: int | None = None, head_dim_full: int | None = None, self_cond_inter: int = 0,
                  kv_bytes_per_value: int = 2) -> int:
    """GPU memory a loaded model needs beyond its weights, for a context of `n_ctx` tokens and
    decodes of a `canvas`-token canvas. An estimate, meant to err high:

      KV cache   2 (K and V) x bytes per value (f16: 2, --precise's f32: 4) x
                 [full layers: n_head_kv_full x head_dim_full x n_ctx
                  + sliding layers: n_head_kv x head_dim x min(n_ctx, sliding_window + canvas)]
                 (llama.cpp's iSWA cache holds window + one ubatch for sliding layers)
      logits     LOGIT_BUFFERS x canvas x n_vocab x 4 (f32 logits and the diffusion head's copies)
      activations canvas x 4 x (n_head x n_ctx (attention scores, no flash attention) + 16 x n_embd)
      head       DiffusionGemma (self_cond_inter > 0): the exact soft embedding's transposed token
                 embedding n_vocab x n_embd (f16 above HEAD_EMBD_T_F32_BYTES, else f32) and the
                 self-conditioning MLP's 3 x inter x n_embd f32 weights
    """
    n_swa = n_layer_swa if sliding_window else 0
    n_full = max(n_layer - n_swa, 0)
    kv_full = n_full * (n_head_kv_full or n_head_kv) * (head_dim_full or head_dim) * n_ctx
    kv_swa = n_swa * n_head_kv * head_dim * min(n_ctx, sliding_window + canvas)
    kv = 2 * kv_bytes_per_value * (kv_full + kv_swa)
    logits = LOGIT_BUFFERS * canvas * n_vocab * 4
    activations = canvas * 4 * ((n_head or 1) * n_ctx + 16 * n_embd)
    head = 0
    if self_cond_inter:
        f32 = n_vocab * n_embd * 4
        head = (f32 // 2 if f32 > HEAD_EMBD_T_F32_BYTES else f32) + 3 * self_cond_inter * n_embd * 4
    return kv + logits + activations + head


def runtime_from_header(header: GgufHeader, *, n_ctx: int, canvas: int = 256, kv_bytes_per_value: int = 2,
                        kv_cache: bool = True) -> int:
    """`runtime_bytes` with the shape read from a GGUF header: per-layer KV head counts at their
    largest among the sliding and among the full-attention layers (gemma4's sliding layers from
    attention.sliding_window_pattern). kv_cache False: an architecture llama.cpp keeps no KV cache
    for (model_info's has_kv_memory: LLaDA, Dream)."""

    def num(key: str, default: int = 0) -> int:
        value = header.arch_key(key)
        if isinstance(value, list):
            value = max((v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)), default=default)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    n_layer = max(num("block_count", 1), 1)
    n_head = max(num("attention.head_count", 1), 1)
    n_embd = num("embedding_length")
    n_kv = max(num("attention.head_count_kv", n_head), 1)
    head_dim = num("attention.key_length") or (n_embd // n_head if n_embd else 128)
    window = num("attention.sliding_window")
    pattern = header.arch_key("attention.sliding_window_pattern")
    n_swa = sum(1 for v in pattern if v) if isinstance(pattern, list) and window else 0
    kv_list = header.arch_key("attention.head_count_kv")
    n_kv_full = None
    if n_swa and isinstance(kv_list, list) and len(kv_list) == len(pattern):
        swa_heads = [int(h) for h, s in zip(kv_list, pattern) if s]
        full_heads = [int(h) for h, s in zip(kv_list, pattern) if not s]
        n_kv, n_kv_full = max(swa_heads, default=n_kv) or 1, max(full_heads, default=n_kv) or 1
    head_swa = num("attention.key_length_swa") or head_dim
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    count = getattr(tokens, "count", None)  # a header's array summary; a list's `count` is its method
    n_vocab = count if isinstance(count, int) else (len(tokens) if isinstance(tokens, (list, tuple)) else 0)
    if not n_vocab and (embd := header.tensors.get("token_embd.weight")) is not None:
        n_vocab = embd.shape[-1]
    inter = header.get("dgchat.diffusion_gemma.self_cond.intermediate_size")
    n_ctx = min(n_ctx, num("context_length", n_ctx) or n_ctx)
    return runtime_bytes(n_ctx=n_ctx, n_layer=n_layer, n_head_kv=n_kv, head_dim=head_swa if n_swa else head_dim,
                         n_vocab=int(n_vocab), n_embd=n_embd, canvas=canvas, n_head=n_head, n_layer_swa=n_swa,
                         sliding_window=window, n_head_kv_full=n_kv_full, head_dim_full=head_dim if n_swa else None,
                         self_cond_inter=int(inter) if isinstance(inter, int) else 0,
                         kv_bytes_per_value=kv_bytes_per_value if kv_cache else 0)


# -- the plan --------------------------------------------------------------------------------------
def plan_placement(model: ModelBytes, *, gpu_free: int, runtime: int, gpu_layers: int | None = None,
                   experts_on: str = "auto", margin: float = DEFAULT_MARGIN,
                   reserve: int = RESERVE_BYTES) -> Placement:
    """Where `model` goes on a GPU with `gpu_free` bytes free (0: no GPU), `runtime` bytes of
    KV cache and compute buffers included (`runtime_bytes`). `gpu_layers` forces llama.cpp's
    n_gpu_layers (the output layer first, then the last N-1 layers); `experts_on` "cpu" keeps
    every routed expert in RAM, "gpu" never keeps one there, "auto" as few as the memory needs.
    `margin`: the share of the free memory kept free, `reserve` bytes besides (a driver's own
    allocations; 0 and 0 where a person stated the memory the plan may use)."""
    if experts_on not in EXPERTS_ON:
        raise InvalidParameterError(f"experts_on must be one of {', '.join(EXPERTS_ON)} (got {experts_on!r})")
    if gpu_layers is not None and gpu_layers < 0:
        raise InvalidParameterError(f"gpu_layers must be 0 or more (got {gpu_layers})")
    n = model.n_layer
    if gpu_free <= 0:
        return _cpu(model, 0, "no GPU to offload to")
    if gpu_layers == 0:
        return _cpu(model, gpu_free, "--gpu-layers 0")
    budget = int(gpu_free * (1 - margin)) - reserve
    moe = model.is_moe and experts_on != "gpu"
    if gpu_layers is not None:
        return _forced(model, gpu_free, runtime, budget, min(gpu_layers, n + 1), experts_on, f"--gpu-layers {gpu_layers}")
    if experts_on == "cpu" and model.is_moe:
        placement = _make(model, gpu_free, runtime, n + 1, range(n), "experts-in-ram", "")
        if placement.gpu_bytes <= budget:
            return _with_reason(placement, f"--experts-on cpu: the experts of all {n} layers in RAM")
        return _split(model, gpu_free, runtime, budget, True, "--experts-on cpu")
    whole = _make(model, gpu_free, runtime, n + 1, (), "gpu", "")
    if whole.gpu_bytes <= budget:
        return _with_reason(whole, f"fits: {_gib(whole.gpu_bytes)} of {_gib(gpu_free)} free")
    if moe:
        k = _experts_needed(model, runtime, budget, range(n))
        if k is not None:
            placement = _make(model, gpu_free, runtime, n + 1, range(k), "experts-in-ram", "")
            return _with_reason(placement, f"fits with experts of {k} of {n} layers in RAM "
                                           f"({_gib(gpu_free)} free)")
    return _split(model, gpu_free, runtime, budget, moe, f"{_gib(gpu_free)} free")


def _make(model: ModelBytes, gpu_free: int, runtime: int, gpu_layers: int, experts_in_ram: Iterable[int],
          mode: str, reason: str) -> Placement:
    """The bytes per device of one llama.cpp setting: n_gpu_layers and the layers whose experts
    are overridden to the CPU (only those on the GPU are listed)."""
    n = model.n_layer
    first_gpu = n + 1 - gpu_layers  # src/llama-model.cpp's i_gpu_start
    on_gpu = [i >= first_gpu for i in range(n)]
    in_ram = tuple(sorted(i for i in set(experts_in_ram) if 0 <= i < n and on_gpu[i]))
    ram_set = set(in_ram)
    gpu = runtime + model.output + model.other
    ram = model.token_embedding
    for i, layer in enumerate(model.layers):
        if not on_gpu[i]:
            ram += layer.total
        elif i in ram_set:
            gpu += layer.dense
            ram += layer.experts
        else:
            gpu += layer.total
    return Placement(mode=mode, gpu_layers=gpu_layers, experts_in_ram=in_ram, gpu_bytes=gpu, ram_bytes=ram,
                     gpu_free=gpu_free, reason=reason, n_layer=n)


def _with_reason(placement: Placement, reason: str) -> Placement:
    return Placement(placement.mode, placement.gpu_layers, placement.experts_in_ram, placement.gpu_bytes,
                     placement.ram_bytes, placement.gpu_free, reason, placement.n_layer)


def _cpu(model: ModelBytes, gpu_free: int, reason: str) -> Placement:
    return Placement("cpu", 0, (), 0, model.weights, gpu_free, reason, model.n_layer)


def _experts_needed(model: ModelBytes, runtime: int, budget: int, layers: Iterable[int]) -> int | None:
    """The fewest first layers (of `layers`, all on the GPU) whose experts must stay in RAM for
    the rest to fit; None when even all of them do not make it fit."""
    order = list(layers)
    gpu = runtime + model.output + model.other + sum(model.layers[i].total for i in order)
    for k in range(len(order) + 1):
        if gpu <= budget:
            return k
        if k < len(order):
            gpu -= model.layers[order[k]].experts
    return None


def _split(model: ModelBytes, gpu_free: int, runtime: int, budget: int, experts_in_ram: bool, why: str) -> Placement:
    """As many whole layers (the last ones) as fit, their experts in RAM when allowed; else the CPU."""
    n = model.n_layer
    best: Placement | None = None
    for k in range(n, 0, -1):  # k repeating layers + the output layer
        keep = range(n - k, n) if experts_in_ram else ()
        placement = _make(model, gpu_free, runtime, k + 1, keep, "layers-split", "")
        if placement.gpu_bytes <= budget:
            best = placement
            break
    if best is None:
        return _cpu(model, gpu_free, f"not even the output layer and buffers fit ({why})")
    what = "with every layer's experts in RAM" if best.experts_in_ram else "whole layers"
    return _with_reason(best, f"{best.layers_on_gpu} of {n} layers on the GPU, {what} ({why})")


def _forced(model: ModelBytes, gpu_free: int, runtime: int, budget: int, gpu_layers: int, experts_on: str,
            label: str) -> Placement:
    n = model.n_layer
    gpu_idx = range(max(n + 1 - gpu_layers, 0), n)
    if model.is_moe and experts_on == "cpu":
        placement = _make(model, gpu_free, runtime, gpu_layers, gpu_idx, "experts-in-ram", "")
        return _with_reason(placement, f"{label}, --experts-on cpu")
    mode = "gpu" if gpu_layers >= n + 1 else "layers-split"
    plain = _make(model, gpu_free, runtime, gpu_layers, (), mode, "")
    if plain.gpu_bytes <= budget or not model.is_moe or experts_on == "gpu":
        fits = "" if plain.gpu_bytes <= budget else f" (needs {_gib(plain.gpu_bytes)}, {_gib(gpu_free)} free)"
        return _with_reason(plain, label + fits)
    k = _experts_needed(model, runtime, budget, gpu_idx)
    keep = list(gpu_idx)[: k if k is not None else len(gpu_idx)]
    placement = _make(model, gpu_free, runtime, gpu_layers, keep, "experts-in-ram", "")
    return _with_reason(placement, f"{label}, experts of {_layers(len(placement.experts_in_ram))} in RAM to fit")
