"""Will a model fit this machine? One stated estimate, three badges, and a recommendation.

    need      = weights + kv_cache + overhead
    weights   = the GGUF file size (llama.cpp maps the file; all of it is resident while generating)
    kv_cache  = 2 (K and V) x 2 bytes (f16) x sum over layers of n_head_kv x head_dim x tokens,
                tokens = context for full-attention layers, min(context, sliding_window) for
                sliding-window layers (full layers may use n_head_kv_full / head_dim_full)
    overhead  = 512 MiB + 5% of the weights (compute buffers, llama.cpp's context, the Python side)
                + the entry's extra_bytes (e.g. logits over a 262k vocabulary)

    usable VRAM = free VRAM where nvidia-smi reports it, else 90% of the total; Apple silicon: 75%
                  of unified memory (Metal's default working-set limit is about that); 0 when this
                  llama.cpp build cannot offload
    usable RAM  = 85% of total RAM (the rest for the OS and the terminal)

    "fits in VRAM"           need <= usable VRAM
    "fits with experts in RAM"  a mixture of experts on a GPU it does not fit whole: the plan the
                             engine makes (model_backend.placement, through hub.split_speed) keeps
                             every layer on the GPU and the routed experts of some layers in RAM,
                             and those bytes fit in usable RAM
    "fits in RAM"            otherwise, need <= usable RAM (CPU, or GPU with whole layers split)
    "will not fit"           otherwise
    "fit unknown"            RAM could not be read and was not entered

A mixture of experts on a GPU goes by the engine's plan: "fits in VRAM" only where the planner puts
everything on the GPU too (its margin is larger than this estimate's, so a model can need less than
the usable VRAM and still be planned with experts in RAM).

Speed (dgchat.hub.speed, with the machine profile): where a model fits, how long a 256-token answer
takes on the device this engine build runs it on (the GPU when it fits there; a mixture of experts
that does not, by the engine's plan with experts in RAM, hub.split_speed; other models with layers
split by memory when only part does; else the CPU). A model that fits but is predicted to need more
than the limit (config `answer_seconds_limit`, default 90 s) is "too slow here" (`SpeedVerdict.too_slow`).

    recommend(): the strongest model (the catalog's rank) that fits and, when speeds are known,
    answers within the limit. A model that fits in GPU memory is preferred over stronger ones that
    would run from RAM, and the reason says so; entries whose download does not fit on the disk are
    skipped; stronger models passed over for speed are named with their predicted time. The bundled
    model when nothing else qualifies.

Masked-diffusion architectures without a KV cache in llama.cpp (llada, dream, ...) recompute the
whole sequence each step; the same term then stands for their per-pass attention buffers, so the
estimate stays on the safe side.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from dgchat import assets
from dgchat.hub.catalog import ArchInfo, CatalogEntry
from dgchat.hub.hardware import Hardware, rebuild_command
from dgchat.hub.speed import estimated_gpu_profile, predict, predict_split, shape_from_entry
from dgchat.hub.split_speed import plan_for, predict_placed
from dgchat.hub.util import format_bytes

if TYPE_CHECKING:
    from dgchat.hub.catalog import Catalog
    from dgchat.hub.machine_profile import MachineProfile
    from dgchat.hub.speed import ModelShape, SpeedPrediction
    from dgchat.model_backend.placement import Placement

OVERHEAD_BASE = 512 * 1024**2
OVERHEAD_FRACTION = 0.05
RAM_USABLE = 0.85
VRAM_USABLE_OF_TOTAL = 0.90
APPLE_GPU_USABLE = 0.75
DISK_MARGIN = 256 * 1024**2


class Fit(str, Enum):
    VRAM = "fits in VRAM"
    EXPERTS_RAM = "fits with experts in RAM"
    RAM = "fits in RAM"
    NONE = "will not fit"
    UNKNOWN = "fit unknown"

    @property
    def label(self) -> str:
        return self.value


@dataclass(frozen=True)
class FitEstimate:
    fit: Fit
    need: int  # bytes of memory while generating
    weights: int
    kv_cache: int
    overhead: int
    context: int
    usable_vram: int  # 0 when no offload
    usable_ram: int | None
    disk_need: int  # bytes still to write to disk (0 when the model is already here)
    disk_ok: bool | None  # None: free disk unknown
    reason: str  # one line for people: what was compared with what
    placement: Placement | None = None  # a mixture of experts on a GPU: the engine's plan for it

    @property
    def badge(self) -> str:
        return self.fit.value

    @property
    def fits(self) -> bool:
        """It runs here (in VRAM, with experts in RAM, or from RAM)."""
        return self.fit in FITS


FITS = (Fit.VRAM, Fit.EXPERTS_RAM, Fit.RAM)


def usable_vram(hw: Hardware) -> int:
    if not hw.gpu_offload:
        return 0
    if hw.unified_memory and hw.vram_total is not None:
        return int(hw.vram_total * APPLE_GPU_USABLE)
    if hw.vram_free is not None:
        return hw.vram_free
    if hw.vram_total is not None:
        return int(hw.vram_total * VRAM_USABLE_OF_TOTAL)
    return 0


def usable_ram(hw: Hardware) -> int | None:
    return int(hw.ram_total * RAM_USABLE) if hw.ram_total is not None else None


def memory_need(size: int, arch: ArchInfo, context: int) -> tuple[int, int, int]:
    """(weights, kv_cache, overhead) in bytes."""
    kv = arch.kv_bytes(context)
    overhead = OVERHEAD_BASE + int(OVERHEAD_FRACTION * size) + arch.extra_bytes
    return size, kv, overhead


def checkpoint_disk_need(entry: CatalogEntry) -> int:
    """Disk a checkpoint entry needs at its peak: the checkpoint, the unquantized GGUF the converter
    writes before llama.cpp quantizes it (about the checkpoint's size: the weights keep their float
    type), and the quantized result, all at once (dgchat.hub.checkpoint checks the same sum with the
    hub's real sizes before the first byte)."""
    return 2 * entry.checkpoint_size + entry.size


def estimate(size: int, arch: ArchInfo, context: int, hw: Hardware, *, on_disk: bool = False,
             convert: bool = False, disk_need: int | None = None, shape: ModelShape | None = None) -> FitEstimate:
    """The estimate for a model file of `size` bytes. on_disk: nothing to download;
    convert: a converted copy of about the same size is written after the download;
    disk_need: the disk the download needs, when it is not the file (a checkpoint entry);
    shape: the model's shape, which a mixture of experts on a GPU needs for the engine's plan."""
    weights, kv, overhead = memory_need(size, arch, context)
    need = weights + kv + overhead
    vram = usable_vram(hw)
    ram = usable_ram(hw)
    plan = plan_for(shape, arch, context, vram=vram, need=need) if vram and shape and shape.n_expert else None
    if vram and need <= vram and (plan is None or plan.mode == "gpu"):
        fit = Fit.VRAM
        why = f"needs {format_bytes(need)}, {format_bytes(vram)} of GPU memory usable"
    elif plan is not None and plan.mode == "experts-in-ram" and (ram is None or
                                                                 plan.ram_bytes + OVERHEAD_BASE <= ram):
        fit = Fit.EXPERTS_RAM
        in_ram = f"{format_bytes(plan.ram_bytes)} in RAM" + (f" ({format_bytes(ram)} usable)" if ram else "")
        why = (f"needs {format_bytes(need)}, more than the {format_bytes(vram)} of GPU memory: "
               f"{format_bytes(plan.gpu_bytes)} on the GPU, the experts of {len(plan.experts_in_ram)} of "
               f"{plan.n_layer} layers and the token embedding, {in_ram}")
    elif ram is None:
        fit = Fit.UNKNOWN
        why = f"needs {format_bytes(need)}; RAM unknown (enter it to get a verdict)"
    elif need <= ram:
        fit = Fit.RAM
        gpu = f", more than the {format_bytes(vram)} of GPU memory" if vram else ""
        why = f"needs {format_bytes(need)}{gpu}; {format_bytes(ram)} of RAM usable"
    else:
        fit = Fit.NONE
        best = max(vram, ram)
        why = f"needs {format_bytes(need)}, only {format_bytes(best)} usable"
    if on_disk:
        disk_need = 0
    elif disk_need is None:
        disk_need = size * (2 if convert else 1)
    disk_ok = None if hw.disk_free is None else (disk_need == 0 or hw.disk_free >= disk_need + DISK_MARGIN)
    if disk_ok is False:
        why += f"; the download needs {format_bytes(disk_need)} of disk, {format_bytes(hw.disk_free)} free"
    return FitEstimate(fit=fit, need=need, weights=weights, kv_cache=kv, overhead=overhead, context=context,
                       usable_vram=vram, usable_ram=ram, disk_need=disk_need, disk_ok=disk_ok, reason=why,
                       placement=plan)


def estimate_entry(entry: CatalogEntry, hw: Hardware, *, context: int | None = None, size: int | None = None,
                   on_disk: bool = False) -> FitEstimate:
    """Estimate for a catalog entry; `size` overrides the catalog's (e.g. the real installed file)."""
    if entry.bundled:
        path = assets.bundled_model_path()
        if path is not None and size is None:
            size = path.stat().st_size
        on_disk = True
    return estimate(size if size is not None else entry.size, entry.arch, context or entry.context, hw,
                    on_disk=on_disk, convert=entry.convert,
                    disk_need=checkpoint_disk_need(entry) if entry.checkpoint else None, shape=moe_shape(entry))


def moe_shape(entry: CatalogEntry) -> ModelShape | None:
    """A mixture of experts' shape from the catalog (what the engine's plan is made from), else None."""
    if not entry.arch.n_expert:
        return None
    try:
        return shape_from_entry(entry)
    except ValueError:  # an entry without the widths of its matrices: the estimate goes by size alone
        return None


TOO_SLOW = "too slow here"


@dataclass(frozen=True)
class SpeedVerdict:
    """How fast a model that fits would answer here, against the limit a person will wait."""

    prediction: SpeedPrediction  # on the device this engine build would run it on
    limit_s: float
    after_rebuild: SpeedPrediction | None = None  # on the GPU this build cannot use yet
    rebuild: str | None = None  # the command that builds an engine for that GPU

    @property
    def too_slow(self) -> bool:
        return self.prediction.seconds_per_answer > self.limit_s

    def short(self) -> str:
        """'~6 min', '~3 s' (one 256-token answer)."""
        return self.prediction.per_answer()

    def text(self) -> str:
        """'about 6 min per answer on this CPU (256 tokens, 0.7 tokens/s) · with your GPU after
        rebuilding: ~4 s'"""
        words = self.prediction.sentence()
        if self.prediction.steps_are_limit:
            words += ", at most"
        if self.after_rebuild is not None:
            words += f" · with your GPU after rebuilding: {self.after_rebuild.per_answer()}"
        return words


def speed_verdict(shape: ModelShape, est: FitEstimate, hw: Hardware, profile: MachineProfile,
                  limit_s: float, arch: ArchInfo | None = None) -> SpeedVerdict:
    """The prediction on the device the model would run on with this engine build (and, where a GPU
    is present that the build cannot offload to, on that GPU after rebuilding). A mixture of experts
    that does not fit the GPU whole is priced by the engine's plan (est.placement, or made here for
    the GPU after a rebuild from `arch`; hub.split_speed)."""
    def on_gpu(gpu) -> SpeedPrediction:  # all layers on it when they fit, else split by its memory
        vram = usable_vram(replace(hw, gpu_offload=True))
        plan = est.placement
        if plan is None and vram and shape.n_expert and arch is not None:
            plan = plan_for(shape, arch, est.context, vram=vram, need=est.need)
        # a mixture of experts the GPU does not hold whole: the engine's plan, priced per device
        # (block diffusion's steps are not priced per device yet: the share by memory below)
        if plan is not None and plan.mode != "gpu" and shape.family != "block_diffusion":
            return predict_placed(shape, gpu, profile.cpu, plan)
        if vram and est.need <= vram:
            return predict(shape, gpu)
        if vram:
            return predict_split(shape, gpu, profile.cpu, vram / est.need)
        return predict(shape, profile.cpu)

    if hw.gpu_offload:
        gpu = profile.gpu or estimated_gpu_profile(hw.gpus[0] if hw.gpus else None)
        return SpeedVerdict(on_gpu(gpu), limit_s)
    cpu = predict(shape, profile.cpu)
    if hw.gpus and usable_vram(replace(hw, gpu_offload=True)):  # a GPU whose memory is known
        after = on_gpu(estimated_gpu_profile(hw.gpus[0]))
        return SpeedVerdict(cpu, limit_s, after_rebuild=after, rebuild=rebuild_command(hw.gpus[0].kind))
    return SpeedVerdict(cpu, limit_s)


@dataclass(frozen=True)
class Recommendation:
    entry: CatalogEntry
    estimate: FitEstimate
    reason: str
    speed: SpeedVerdict | None = None
    passed_over: tuple[tuple[CatalogEntry, SpeedVerdict], ...] = ()  # stronger, fitting, too slow
    # `reason` in parts, for a screen that shows the model's predicted time beside it (the wizard):
    # why this model, in a clause ("the strongest model that answers within 90 s and fits in RAM"),
    # and the rest of the reason but that time: the memory it needs of what is usable, and what it
    # says of other models (preferred over, passed over, after a GPU rebuild)
    headline: str = ""
    notes: tuple[str, ...] = ()


def recommend(catalog: Catalog, hw: Hardware, *, on_disk: frozenset[str] | set[str] = frozenset(),
              sizes: dict[str, int] | None = None, speeds: dict[str, SpeedVerdict] | None = None) -> Recommendation:
    """The entry to preselect: the strongest (highest rank, then already on disk) of the entries
    that fit this machine, where "fits" means the estimate needs at most the usable memory (free
    GPU memory, or 85% of the RAM: the rest stays free for the system) and the download fits on
    the disk, and, with `speeds` (by entry name, from the machine profile), answers 256 tokens
    within the limit. One that fits in GPU memory beats stronger ones that would run from RAM,
    because it runs several times faster; the reason then names the stronger one. The bundled
    model is the answer when nothing else qualifies, so there is always a recommendation.

    on_disk: names of entries already installed or found in the HF cache; sizes: real sizes by name."""
    sizes = sizes or {}
    fitting: list[tuple[tuple[int, int, int], CatalogEntry, FitEstimate]] = []
    for entry in catalog:
        est = estimate_entry(entry, hw, size=sizes.get(entry.name), on_disk=entry.name in on_disk)
        if entry.bundled or est.fit not in FITS or est.disk_ok is False:
            continue
        fitting.append(((int(est.fit is Fit.VRAM), entry.rank, int(entry.name in on_disk)), entry, est))
    too_slow = [f for f in fitting if speeds is not None and (v := speeds.get(f[1].name)) is not None and v.too_slow]
    usable = [f for f in fitting if f not in too_slow]
    if not usable:
        bundled = catalog.bundled
        est = estimate_entry(bundled, hw)
        speed = speeds.get(bundled.name) if speeds else None
        if hw.ram_total is None:
            why = "RAM is unknown, so no download can be judged; the bundled model always works"
        elif fitting and speeds:
            limit = next(iter(speeds.values())).limit_s
            why = (f"no catalog model is predicted to answer within {limit:.0f} s on this machine; the bundled "
                   f"model answers in {speed.short() if speed else 'seconds'}")
        else:
            why = "no catalog model fits this machine's memory and disk; the bundled model always works"
        return _with_passed_over(Recommendation(bundled, est, why, speed, headline=why), too_slow, speeds)
    _, entry, est = max(usable, key=lambda f: f[0])
    speed = speeds.get(entry.name) if speeds else None
    if est.fit is Fit.VRAM:
        headline = "the strongest model that fits in GPU memory"
        notes = [f"it needs {format_bytes(est.need)} of the {format_bytes(est.usable_vram)} usable"]
        faster_than = max((f for f in usable if f[2].fit in (Fit.RAM, Fit.EXPERTS_RAM) and f[1].rank > entry.rank),
                          key=lambda f: f[1].rank, default=None)
        if faster_than is not None:
            how = "with its experts in RAM" if faster_than[2].fit is Fit.EXPERTS_RAM else "from RAM"
            notes.append(f"preferred for speed over {faster_than[1].title}, which is stronger but would run {how}, "
                         "several times slower")
    elif est.fit is Fit.EXPERTS_RAM and est.placement is not None:
        headline = "the strongest model that fits with its experts in RAM"
        notes = [(f"{format_bytes(est.placement.gpu_bytes)} on the GPU of the {format_bytes(est.usable_vram)} "
                  f"usable, {format_bytes(est.placement.ram_bytes)} in RAM: the experts of "
                  f"{len(est.placement.experts_in_ram)} of {est.placement.n_layer} layers and the token embedding")]
    else:
        headline = "the strongest model that fits in RAM"
        notes = [(f"it needs {format_bytes(est.need)} of the {format_bytes(est.usable_ram)} usable: 85% of the RAM, "
                  "the rest stays free for the system")]
    if speed is not None:
        headline = headline.replace("the strongest model that fits",
                                    f"the strongest model that answers within {speed.limit_s:.0f} s and fits", 1)
    why = "; ".join([f"{headline} ({notes[0]})", *notes[1:]]
                    + ([speed.prediction.sentence()] if speed is not None else []))
    return _with_passed_over(Recommendation(entry, est, why, speed, headline=headline, notes=tuple(notes)),
                             too_slow, speeds, above=entry.rank)


def _with_passed_over(rec: Recommendation, too_slow: list, speeds: dict[str, SpeedVerdict] | None,
                      above: int = -1) -> Recommendation:
    """Name the stronger models left out for speed ("DiffusionGemma ... would need ~13 min per
    answer here"), and where a GPU could run one after rebuilding the engine, say so and how."""
    if not speeds:
        return rec
    passed = sorted(((f[1], speeds[f[1].name]) for f in too_slow if f[1].rank > above),
                    key=lambda p: -p[0].rank)
    notes = list(rec.notes)
    if passed:
        named = [f"{e.title} would need {v.short()} per answer here" for e, v in passed[:2]]
        more = len(passed) - len(named)
        notes.append("passed over: " + "; ".join(named) + (f" (and {more} more)" if more else ""))
        fast_after = [(e, v) for e, v in passed if v.after_rebuild is not None
                      and v.after_rebuild.seconds_per_answer <= v.limit_s]
        if fast_after:
            e, v = fast_after[0]
            notes.append(f"with your GPU, after rebuilding the engine for it ({v.rebuild}), {e.title} would answer "
                         f"in {v.after_rebuild.per_answer()}")
    why = "; ".join([rec.reason, *notes[len(rec.notes):]])
    return replace(rec, reason=why, passed_over=tuple(passed), notes=tuple(notes))


DEFAULT_CONTEXT = 4096


def arch_from_header(header) -> tuple[ArchInfo, int]:  # header: dgchat.model_backend.gguf_file.GgufHeader
    """ArchInfo and the context to assume (min(trained context, 4096)) for any GGUF, from its header.

    Per-layer KV head counts (a list) count at their maximum; sliding-window layers are taken from
    `attention.sliding_window_pattern` (gemma4, as `dgchat convert` writes it)."""

    def num(value, default: int) -> int:
        if isinstance(value, list):
            value = max((v for v in value if isinstance(v, (int, float))), default=default)
        try:
            return int(value) if value is not None else default
        except (TypeError, ValueError):
            return default

    n_layer = max(num(header.arch_key("block_count"), 1), 1)
    n_head = max(num(header.arch_key("attention.head_count"), 1), 1)
    n_kv = max(num(header.arch_key("attention.head_count_kv"), n_head), 1)
    n_embd = num(header.arch_key("embedding_length"), 0)
    key_len = num(header.arch_key("attention.key_length"), 0)
    head_dim = key_len or (n_embd // n_head if n_embd else 128)
    window = num(header.arch_key("attention.sliding_window"), 0)
    pattern = header.arch_key("attention.sliding_window_pattern")
    n_swa = sum(1 for v in pattern if v) if isinstance(pattern, list) and window else 0
    swa_len = num(header.arch_key("attention.key_length_swa"), 0)
    arch = ArchInfo(
        n_layer=n_layer, n_head_kv=n_kv, head_dim=(swa_len or head_dim) if n_swa else head_dim,
        n_layer_swa=n_swa, sliding_window=window or None,
        head_dim_full=head_dim if n_swa and swa_len and swa_len != head_dim else None,
    )
    trained = num(header.arch_key("context_length"), DEFAULT_CONTEXT) or DEFAULT_CONTEXT
    return arch, min(trained, DEFAULT_CONTEXT)


def arch_from_dict(d: dict) -> ArchInfo | None:
    """ArchInfo from a registry record's `arch` (None when it has none)."""
    if not d or not all(k in d for k in ("n_layer", "n_head_kv", "head_dim")):
        return None
    known = ArchInfo.__dataclass_fields__
    return ArchInfo(**{k: v for k, v in d.items() if k in known})
