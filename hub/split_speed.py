"""A mixture of experts on a GPU too small for it: the plan (model_backend.placement) and its speed.

The planner keeps every layer's attention, norms, router and dense MLP on the GPU and the routed
experts of as few layers as needed in system RAM (llama.cpp's `--n-cpu-moe` done by memory). This
module gives it a catalog model's bytes (`model_bytes`, from hub.speed's ModelShape, before anything
is downloaded) and predicts what a step costs once experts sit in RAM.

Where the experts in RAM are multiplied, read from the vendored llama.cpp
(vendor/llama.cpp of llama_cpp_python 0.3.36):

- `llama_context_params.op_offload` is true by default (src/llama-context.cpp,
  llama_context_default_params), and dgchat's context (model_backend/llamacpp/context.py) keeps the
  default. The scheduler then gives an op whose weights sit in a host buffer to the GPU when the GPU
  wants it (ggml/src/ggml-backend.cpp, ggml_backend_sched_backend_id_from_cur, cause "1.off"):
  ggml-cuda.cu and ggml-vulkan.cpp's `offload_op` say yes when the op's batch is at least
  GGML_OP_OFFLOAD_MIN_BATCH (default 32), and for MUL_MAT_ID the batch is ne[2], the tokens.
- the experts overridden to the CPU are in a host buffer: llama-model-loader.cpp picks from the CPU
  list, whose first entry on a GPU machine is the GPU's pinned host buffer (llama-model.cpp,
  make_cpu_buft_list), replaced by the plain CPU buffer under mmap; both are host (only the CPU's
  repacked buffer, later in that list, is not).
- when such an op runs on the GPU, the scheduler copies only the experts the batch routes to, in
  runs of consecutive ids (ggml-backend.cpp, "copying only the experts that are used").

So for a 256-position canvas (batch 256 >= 32) llama.cpp by default does NOT multiply the experts on
the CPU: every decode copies the touched experts of each layer in RAM over the bus to the GPU and
multiplies them there ("copy" below). A canvas touches nearly all of them (128 experts, top 8, 256
tokens: 127.9), so a step moves about all the experts' bytes in RAM. One left-to-right token (`--ar`,
batch 1) stays under 32: the CPU multiplies its 8 experts per layer from RAM ("cpu"). Both routes are
computed for the canvas; the prediction uses llama.cpp's default and keeps the other one beside it
(what op_offload = false, or GGML_OP_OFFLOAD_MIN_BATCH above 256, would give).

All of it is an estimate: no GPU has run DiffusionGemma here yet (issue 45).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dgchat.hub.machine_profile import bytes_per_weight
from dgchat.hub.speed import ModelShape, SpeedPrediction, decode_seconds, duration_words, predict
from dgchat.model_backend.placement import LayerBytes, ModelBytes, Placement, plan_placement, runtime_bytes

if TYPE_CHECKING:
    from dgchat.hub.catalog import ArchInfo
    from dgchat.hub.machine_profile import DeviceProfile

# Host-to-GPU copies: PCIe 4.0 x16 carries 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s each way (the
# PCI-SIG 4.0 signalling rate and encoding); host-to-device copies from pinned memory typically reach
# about 25 GB/s of it (published CUDA bandwidthTest results; not measured here, no GPU). A GPU on
# PCIe 3.0 (half the rate), or copies from pageable (mmap'ed) memory, get less: the prediction is
# then optimistic.
PCIE_BYTES_PER_S = 25e9
# ggml-cuda.cu and ggml-vulkan.cpp: `GGML_OP_OFFLOAD_MIN_BATCH`, default 32
OP_OFFLOAD_MIN_BATCH = 32
# one device hand-over (a stream synchronisation and a small copy's launch), per layer and crossing:
# tens of microseconds on CUDA; 20 us assumed
SYNC_S = 2e-5
# f32 norm vectors of width n_embd a layer holds (pre/post norms of attention, MLP and experts): an
# allowance of a few tens of KB a layer, next to DiffusionGemma's ~540 MB
NORMS_PER_LAYER = 8
ROUTES = ("copy", "cpu")


# -- bytes -----------------------------------------------------------------------------------------


def _bytes(table: dict[str, int]) -> float:
    return sum(w * bytes_per_weight(q) for q, w in table.items())


def model_bytes(shape: ModelShape, *, tied: bool | None = None) -> ModelBytes:
    """The planner's view of a model from its shape: per layer, the non-expert weights (attention,
    dense MLP, router, norms) and the routed experts, at their storage types; the token embedding
    (in RAM) and the LM head (on the output device). `tied` (default: DiffusionGemma's token
    embedding is its LM head, docs/diffusion-gemma-gguf.md; other families have their own): a tied
    head is token_embd's copy, the same bytes on each device. A shape's layers are alike, so each
    holds 1 / n_layer of the sums (the real file's layers differ by the attention kind and the
    layers llama-quantize gives more bits: a few percent per layer)."""
    n = max(shape.n_layer, 1)
    tied = shape.family == "diffusion_gemma" if tied is None else tied
    dense = (_bytes(shape.dense) + _bytes(shape.ffn)) / n + NORMS_PER_LAYER * shape.n_embd * 4
    experts = shape.n_expert * _bytes(shape.expert) / n
    head = round(shape.output[1] * bytes_per_weight(shape.output[0]))
    # an untied embedding is stored at the file's bulk type, the one most of the dense weights have
    bulk = max(shape.dense, key=shape.dense.get) if shape.dense else shape.output[0]
    embd = head if tied else round(shape.n_vocab * shape.n_embd * bytes_per_weight(bulk))
    return ModelBytes(layers=(LayerBytes(round(dense), round(experts)),) * n, token_embedding=embd,
                      output=head + shape.n_embd * 4, output_copy=head if tied else 0)


def runtime_for(arch: ArchInfo, context: int, canvas: int = 256) -> int:
    """The planner's GPU bytes beyond the weights (KV cache, logits, the diffusion head) for a
    catalog entry's architecture at `context` tokens."""
    return runtime_bytes(n_ctx=context, n_layer=arch.n_layer, n_head_kv=arch.n_head_kv, head_dim=arch.head_dim,
                         n_vocab=arch.n_vocab, n_embd=arch.n_embd, canvas=canvas, n_head=arch.n_head,
                         n_layer_swa=arch.n_layer_swa, sliding_window=arch.sliding_window or 0,
                         n_head_kv_full=arch.n_head_kv_full, head_dim_full=arch.head_dim_full,
                         self_cond_inter=arch.self_cond_inter)


def plan_for(shape: ModelShape, arch: ArchInfo, context: int, *, vram: int, need: int) -> Placement:
    """The plan the engine would make on `vram` usable bytes. Its runtime share is the larger of the
    planner's estimate and what the fit estimate counts beside the weights (`need` minus the bytes
    a whole-GPU load puts there), so that a model the fit estimate finds too big for the GPU is
    never planned whole onto it."""
    model = model_bytes(shape)
    on_gpu = sum(layer.total for layer in model.layers) + model.output + model.other
    canvas = shape.sampler.get("gen_length") if isinstance(shape.sampler.get("gen_length"), int) else 256
    runtime = max(runtime_for(arch, context, canvas), need - on_gpu)
    return plan_placement(model, gpu_free=vram, runtime=runtime)


# -- one decode ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepParts:
    """One decode split by device: the GPU's share (its layers' weights, attention, the LM head and
    the diffusion head), the share of the weights in RAM, and the bytes that crossed the bus."""

    gpu_s: float
    ram_s: float
    copied_bytes: float
    route: str  # how the weights in RAM were multiplied: "copy" (to the GPU) or "cpu"

    @property
    def seconds(self) -> float:
        return self.gpu_s + self.ram_s


def _layers_in_ram(shape: ModelShape, placement: Placement) -> tuple[int, int]:
    """(layers whose experts are in RAM, whole layers on the CPU)."""
    whole = max(0, shape.n_layer - placement.layers_on_gpu) if placement.mode == "layers-split" else 0
    return min(shape.n_layer, len(placement.experts_in_ram) + whole), whole


def _scaled(table: dict[str, int], share: float) -> dict[str, int]:
    return {q: round(w * share) for q, w in table.items() if round(w * share)}


def step_parts(shape: ModelShape, gpu: DeviceProfile, n_tokens: int, *, ctx: int, rows: int, head: str = "none",
               cpu: DeviceProfile, placement: Placement, route: str = "auto") -> StepParts:
    """One decode of `n_tokens` tokens with the weights placed as `placement` says. `route` "auto"
    is llama.cpp's default (op offload: "copy" for a batch of OP_OFFLOAD_MIN_BATCH tokens or more,
    else "cpu"); "copy" or "cpu" forces one.

    GPU share: decode_seconds on the GPU profile for the layers (and experts) it holds.
    Experts in RAM, per such layer, E_t of them touched (ModelShape.experts_touched), each reading
    its weights for n k / E_t tokens:
      copy  E_t x expert bytes / PCIE_BYTES_PER_S + the products on the GPU + a hand-over (the
            scheduler reads the routing back before it copies)
      cpu   the products on the CPU (bandwidth- or compute-bound, as the CPU profile's width says)
            + the CPU's fixed cost per layer + the hidden states both ways over the bus
    Whole layers on the CPU (mode "layers-split") the same way, their attention on the CPU (their
    KV cache is there)."""
    if route not in ("auto", *ROUTES):
        raise ValueError(f"route must be auto, copy or cpu (got {route!r})")
    n = max(1, n_tokens)
    L = max(shape.n_layer, 1)
    n_exp, n_whole = _layers_in_ram(shape, placement)
    on_gpu = replace(shape, n_layer=L - n_whole, dense=_scaled(shape.dense, (L - n_whole) / L),
                     ffn=_scaled(shape.ffn, (L - n_whole) / L), expert=_scaled(shape.expert, (L - n_exp) / L))
    gpu_s = decode_seconds(on_gpu, gpu, n, ctx=ctx, rows=rows, head=head) if L > n_whole else 0.0
    if route == "auto":
        route = "copy" if n >= OP_OFFLOAD_MIN_BATCH else "cpu"
    touched = shape.experts_touched(n) if shape.n_expert else 0.0
    per_expert = n * shape.n_expert_used / touched if touched else 0.0
    expert_w = {q: w / L for q, w in shape.expert.items()}  # one expert of one layer
    dense_w = {q: w / L for t in (shape.dense, shape.ffn) for q, w in t.items()}  # one layer's dense
    dev = gpu if route == "copy" else cpu
    ram_s = n_exp * touched * sum(w * dev.tau(q, per_expert) for q, w in expert_w.items())
    ram_s += n_whole * sum(w * dev.tau(q, n) for q, w in dense_w.items())
    copied = n_exp * touched * _bytes(expert_w) + n_whole * _bytes(dense_w)
    hidden = n * shape.n_embd * 4  # f32 hidden states
    if route == "copy":
        ram_s += copied / PCIE_BYTES_PER_S + (n_exp + n_whole) * SYNC_S
    else:
        ram_s += (n_exp + n_whole) * (cpu.layer_s + 2 * (hidden / PCIE_BYTES_PER_S + SYNC_S))
        ram_s += cpu.decode_s if n_exp + n_whole else 0.0
        copied = 2.0 * (n_exp + n_whole) * hidden
    if n_whole:  # attention of the layers on the CPU, and their hidden states both ways
        ram_s += n_whole * 2 * ctx * shape.n_head * shape.head_dim * cpu.tau("f16", n)
        if route == "copy":
            ram_s += n_whole * 2 * (hidden / PCIE_BYTES_PER_S + SYNC_S)
    return StepParts(gpu_s=gpu_s, ram_s=ram_s, copied_bytes=copied, route=route)


def split_decode_seconds(shape: ModelShape, gpu: DeviceProfile, n_tokens: int, *, ctx: int, rows: int,
                         head: str = "none", cpu: DeviceProfile, placement: Placement, route: str = "auto") -> float:
    """step_parts' total: what hub.speed.predict takes as its `decode`."""
    return step_parts(shape, gpu, n_tokens, ctx=ctx, rows=rows, head=head, cpu=cpu, placement=placement,
                      route=route).seconds


# -- a whole answer --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitPrediction(SpeedPrediction):
    """A prediction with weights in RAM: the plan, the first canvas step by device, and the canvas
    step the other route would give."""

    placement: dict[str, Any] = field(default_factory=dict)  # Placement.as_json()
    step: dict[str, Any] = field(default_factory=dict)  # the first canvas step, by device
    other_route: dict[str, Any] = field(default_factory=dict)  # the same with the canvas on the other route

    def where(self) -> str:
        n = len(self.placement.get("experts_in_ram", ()))
        if self.placement.get("mode") == "experts-in-ram":
            return f"on the GPU with the experts of {n} of {self.placement.get('n_layer')} layers in RAM"
        return "split between GPU and CPU"

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "placement": self.placement, "step": self.step,
                "other_route": self.other_route}


def _step_dict(parts: StepParts) -> dict[str, Any]:
    return {"route": parts.route, "seconds": round(parts.seconds, 5), "gpu_seconds": round(parts.gpu_s, 5),
            "ram_weights_seconds": round(parts.ram_s, 5), "bus_bytes": round(parts.copied_bytes)}


ROUTE_WORDS = {"copy": "the experts in RAM copied to the GPU each step (llama.cpp's op offload, batch >= 32)",
               "cpu": "the experts in RAM multiplied by the CPU (no op offload)"}


def predict_placed(shape: ModelShape, gpu: DeviceProfile, cpu: DeviceProfile, placement: Placement,
                   **kw: Any) -> SpeedPrediction:
    """The answer's time with the weights where `placement` puts them: predict() on the GPU profile
    with step_parts for each decode (llama.cpp's route per decode), plus the canvas step and the
    answer on the other route. A placement with everything on one device is predict() there."""
    if placement.mode == "gpu":
        return predict(shape, gpu, **kw)
    if placement.mode == "cpu":
        return predict(shape, cpu, **kw)
    decode = functools.partial(split_decode_seconds, cpu=cpu, placement=placement)
    base = predict(shape, gpu, decode=decode, **kw)
    canvas, ctx = base.canvas, base.prompt_tokens + base.canvas
    head = "dg" if shape.family == "diffusion_gemma" else "stats"
    first = step_parts(shape, gpu, canvas, ctx=ctx, rows=canvas, head=head, cpu=cpu, placement=placement)
    other = "cpu" if first.route == "copy" else "copy"
    alt = predict(shape, gpu, decode=functools.partial(split_decode_seconds, cpu=cpu, placement=placement,
                                                        route=other), **kw)
    alt_step = step_parts(shape, gpu, canvas, ctx=ctx, rows=canvas, head=head, cpu=cpu, placement=placement,
                          route=other)
    values = {f: getattr(base, f) for f in SpeedPrediction.__dataclass_fields__}
    values.update(device="gpu+cpu", device_name=f"{gpu.name} + RAM", basis=base.basis)
    return SplitPrediction(
        **values, placement=placement.as_json(),
        step={**_step_dict(first), "how": ROUTE_WORDS[first.route], "llama_cpp_default": True},
        other_route={**_step_dict(alt_step), "how": ROUTE_WORDS[other],
                     "seconds_per_answer": round(alt.seconds_per_answer, 3)})



def split_words(prediction: SpeedPrediction) -> str | None:
    """Where a canvas step's time goes with weights in RAM, and what the other route would give:
    one line for the wizard's and F4's details ("Step: ~0.59 s, 0.20 s on the GPU and 0.39 s for
    the experts in RAM copied to the GPU each step (...); multiplied by the CPU instead: 1.45 s a
    step, ~72 s per answer"). None for a prediction on one device."""
    if not isinstance(prediction, SplitPrediction) or not prediction.step:
        return None
    step, other = prediction.step, prediction.other_route
    answer = duration_words(other.get("seconds_per_answer", 0.0))
    return (f"Step (estimated): {step['seconds']:.2f} s, {step['gpu_seconds']:.2f} s on the GPU and "
            f"{step['ram_weights_seconds']:.2f} s for {step['how']}; with {other['how']}: "
            f"{other['seconds']:.2f} s a step, {'~' if not answer.startswith('<') else ''}{answer} per answer")
