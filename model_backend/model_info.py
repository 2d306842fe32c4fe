"""What kind of diffusion model a GGUF holds, and how to run it by default — from the header alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dgchat.model_backend.architectures import NATIVE_DIFFUSION_ARCHS, SUPPORTED_HELP
from dgchat.model_backend.errors import InvalidParameterError, ModelFileError, UnsupportedModelError
from dgchat.model_backend.gguf_file import GgufHeader
from dgchat.model_backend.model_check import check_model_header, vocab_size
from dgchat.model_backend.params import DiffusionParams

# Published sampler settings per family (model cards / reference generate code):
# LLaDA generate.py: gen_length 128, steps 128, block_length 32, low_confidence remasking, temperature 0.
# Dream generation_utils: alg "entropy", eps 1e-3, steps = max_new_tokens, temperature 0.2, top_p 0.95.
# RND1: entropy-based selection, eps 1e-3 (llama.cpp's README example).
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llada": dict(steps=128, gen_length=128, block_length=32, algorithm="confidence", temperature=0.0),
    "dream": dict(steps=128, gen_length=128, eps=1e-3, algorithm="entropy", temperature=0.0),
    "rnd1": dict(steps=128, gen_length=128, eps=1e-3, algorithm="entropy", temperature=0.0),
    "diffusion_gemma": dict(
        steps=48, entropy_bound=0.1, t_min=0.4, t_max=0.8, stability_threshold=1, confidence_threshold=0.005,
        temperature=0.0, algorithm="entropy", pad_bias=0.0,
    ),
    # Block diffusion (docs/BLOCK_DIFFUSION.md); steps are per block, the block size is the file's.
    # SDAR generate.py: denoising_steps 4, low_confidence_dynamic at confidence_threshold 0.85; the
    # SDAR README's benchmarks decode greedily. dllm examples/a2d/bd3lm: steps 128 over 4 blocks of 32
    # (32 a block), temperature 0, low_confidence. max_tokens 512 is dgchat's (a chat answer).
    "sdar": dict(steps=4, threshold=0.85, temperature=0.0, algorithm="confidence", max_tokens=512),
    "bd3lm": dict(steps=32, temperature=0.0, algorithm="confidence", max_tokens=512),
}
BLOCK_VARIANTS = ("sdar", "bd3lm")
VARIANT_NAMES = {"sdar": "SDAR", "bd3lm": "BD3LM"}  # how labels and notes name a block-diffusion variant
BLOCK_DIFFUSION = "block_diffusion"  # ModelInfo.family of SDAR and BD3LM models
BLOCK_ARCHS = ("qwen3", "qwen2")  # llama.cpp graphs a block-diffusion file may use
_ARCH_FAMILY = {"llada": "llada", "llada-moe": "llada", "dream": "dream", "rnd1": "rnd1"}

# GGUF keys with dgchat's recommended defaults (written by `dgchat convert`)
_DEFAULT_KEYS = {
    "dgchat.steps": "steps",
    "dgchat.gen_length": "gen_length",
    "dgchat.block_length": "block_length",
    "dgchat.algorithm": "algorithm",
    "dgchat.threshold": "threshold",
    "dgchat.temperature": "temperature",
    "dgchat.eps": "eps",
    "dgchat.top_p": "top_p",
    "dgchat.top_k": "top_k",
    "dgchat.block_diffusion.max_tokens": "max_tokens",
}


# dgchat.diffusion.* (docs/diffusion-gemma-gguf.md) -> DiffusionParams
_DG_KEYS = {
    "canvas_length": "gen_length",
    "max_denoising_steps": "steps",
    "entropy_bound": "entropy_bound",
    "t_min": "t_min",
    "t_max": "t_max",
    "stability_threshold": "stability_threshold",
    "confidence_threshold": "confidence_threshold",
    "pad_bias": "pad_bias",
}


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    family: str  # "masked" | "diffusion_gemma" | "block_diffusion"
    preset: str  # key into _FAMILY_DEFAULTS
    has_kv_memory: bool  # llama.cpp keeps a KV cache for this architecture
    mask_token: int | None
    shift_logits: bool
    chat_template: str | None
    name: str
    context_length: int
    defaults: dict[str, Any] = field(default_factory=dict)
    # the names in `defaults` that the file itself sets (dgchat.* keys), the rest are the family's:
    # model_backend/param_resolution reports "model file" or "family default" for them
    file_defaults: frozenset[str] = frozenset()
    # block diffusion: the block size B of the file's block-causal attention (dgchat.engine.attention_block)
    attention_block: int | None = None

    @property
    def uniform_state(self) -> bool:
        return self.family == "diffusion_gemma"

    @property
    def block_diffusion(self) -> bool:
        """SDAR, BD3LM: written block after block (one block a canvas, steps per block, no infill)."""
        return self.family == BLOCK_DIFFUSION


def _bool(value: Any, default: bool) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.lower() == "true"
    return default


# the settings a file may recommend (the values of the key tables above); each must have its
# DiffusionParams.FIELDS type and range
_FILE_SETTINGS = frozenset(_DEFAULT_KEYS.values()) | frozenset(_DG_KEYS.values())


def _checked_default(header: GgufHeader, key: str, param: str, value: Any) -> Any:
    """A sampler default from the file, type- and range-checked like a user's flag (the same bounds:
    a file must not be able to ask for 4e9 steps or a canvas of a billion tokens)."""
    spec = DiffusionParams.FIELDS[param]
    if not spec.has_type(value):
        raise ModelFileError(f"{header.path.name}: metadata {key} = {value!r:.60} is not a valid {param} "
                             f"({spec.type_text} expected)")
    if spec.kind is float and isinstance(value, float) and math.isfinite(value):
        # GGUF floats are float32: 0.85 reads back as 0.8500000238418579; keep the value that was written
        value = float(f"{value:.7g}")
    try:
        DiffusionParams(**{param: value}).validate()
    except InvalidParameterError as exc:
        raise ModelFileError(f"{header.path.name}: metadata {key} = {value!r:.60} is out of range ({exc})") from None
    return value


# A step computes logits for every canvas position over the whole vocabulary: the file's default
# canvas may ask for at most this many float32 logits (2 GiB; DiffusionGemma 26B: 256 x 262,144 = 67 M).
# A user can still ask for more with --gen-length; a file cannot make every run allocate it.
MAX_DEFAULT_LOGITS = 1 << 29


def _check_defaults(header: GgufHeader, defaults: dict[str, Any]) -> None:
    """The defaults together, as `DiffusionEngine.resolve` will combine them (a block at least as long
    as the canvas is dropped there, so it is dropped here too)."""
    canvas = int(defaults.get("gen_length") or 128)
    if canvas * vocab_size(header) > MAX_DEFAULT_LOGITS:
        raise ModelFileError(f"{header.path.name}: the file's default canvas of {canvas} tokens over its "
                             f"{vocab_size(header):,}-token vocabulary needs more than 2 GiB of logits a step")

    combined = {k: v for k, v in defaults.items() if k in _FILE_SETTINGS}
    if combined.get("block_length") and combined.get("gen_length") and combined["block_length"] >= combined["gen_length"]:
        combined.pop("block_length")
    try:
        DiffusionParams(**combined).validate()
    except InvalidParameterError as exc:
        raise ModelFileError(f"{header.path.name}: the file's recommended sampler settings do not fit together ({exc})") from None


def inspect_header(header: GgufHeader) -> ModelInfo:
    """Classify the model or raise UnsupportedModelError / ModelFileError with a one-line reason.

    Every value dgchat or llama.cpp will read is type- and range-checked first (model_check)."""
    check_model_header(header)
    arch = header.architecture
    name = header.get("general.name") or header.path.stem
    if not arch:
        raise UnsupportedModelError(f"{header.path.name}: GGUF has no general.architecture key")
    if arch == "diffusion-gemma":
        raise UnsupportedModelError(
            f"{header.path.name} uses the upstream `diffusion-gemma` layout that this llama.cpp cannot load; "
            f"convert it once with: dgchat convert {header.path}"
        )
    mask = header.get("tokenizer.ggml.mask_token_id")
    template = header.get("tokenizer.chat_template")
    ctx_len = int(header.arch_key("context_length", 0) or 0)  # an int in range: model_check
    block = None
    if arch == "gemma4" and header.get("dgchat.family") == "diffusion-gemma":
        family, preset, has_memory, shift = "diffusion_gemma", "diffusion_gemma", True, False
    elif header.get("dgchat.family") == "block-diffusion":
        family, has_memory, shift = BLOCK_DIFFUSION, True, False
        preset = header.get("dgchat.block_diffusion.variant")
        block = header.get("dgchat.engine.attention_block")
        if arch not in BLOCK_ARCHS:
            raise UnsupportedModelError(f"{header.path.name}: a block-diffusion file must use llama.cpp's "
                                        f"{' or '.join(BLOCK_ARCHS)} graph, not {arch!r:.60}")
        if preset not in BLOCK_VARIANTS:
            raise ModelFileError(f"{header.path.name}: metadata dgchat.block_diffusion.variant = {preset!r:.60} "
                                 f"is not one of {', '.join(BLOCK_VARIANTS)}")
        if block is None:
            raise ModelFileError(f"{header.path.name}: a block-diffusion file needs dgchat.engine.attention_block "
                                 "(its block size)")
        if mask is None:
            raise UnsupportedModelError(f"{header.path.name}: block-diffusion GGUF has no mask token "
                                        "(tokenizer.ggml.mask_token_id)")
    elif arch in NATIVE_DIFFUSION_ARCHS:
        if mask is None:
            raise UnsupportedModelError(f"{header.path.name}: {arch} GGUF has no mask token (tokenizer.ggml.mask_token_id)")
        family, preset, has_memory = "masked", _ARCH_FAMILY[arch], False
        # llama.cpp's example defaults to shifted logits when the key is missing
        shift = _bool(header.get("diffusion.shift_logits"), True)
    else:
        causal = header.arch_key("attention.causal")
        if causal is None or _bool(causal, True):
            raise UnsupportedModelError(
                f"{header.path.name}: `{arch}` is a causal (autoregressive) model, not a diffusion model; "
                f"dgchat runs {SUPPORTED_HELP}"
            )
        if mask is None:
            raise UnsupportedModelError(
                f"{header.path.name}: `{arch}` declares non-causal attention but has no mask token; "
                f"dgchat runs {SUPPORTED_HELP}"
            )
        family, has_memory = "masked", True
        preset = header.get("dgchat.preset") or ("dream" if arch in ("qwen2", "qwen3moe") else "llada")
        if not isinstance(preset, str) or preset not in _FAMILY_DEFAULTS or preset == "diffusion_gemma":
            raise ModelFileError(f"{header.path.name}: metadata dgchat.preset = {preset!r:.60} is not one of "
                                 f"llada, dream, rnd1")
        shift = _bool(header.get("diffusion.shift_logits"), preset == "dream")
    defaults = dict(_FAMILY_DEFAULTS.get(preset, _FAMILY_DEFAULTS["llada"]))
    from_file: set[str] = set()
    if family == "diffusion_gemma":
        # the converter stores the checkpoint's generation_config under dgchat.diffusion.*
        for key, param in _DG_KEYS.items():
            value = header.get("dgchat.diffusion." + key)
            if value is not None:
                defaults[param] = _checked_default(header, "dgchat.diffusion." + key, param, value)
                from_file.add(param)
    for key, param in _DEFAULT_KEYS.items():
        value = header.get(key)
        if value is not None:
            defaults[param] = _checked_default(header, key, param, value)
            from_file.add(param)
    if family == BLOCK_DIFFUSION:
        # the canvas is one block, fixed by the file's attention (model_backend/param_resolution)
        defaults.update(gen_length=int(block), block_length=int(block))
        from_file.update(("gen_length", "block_length"))
    elif defaults.get("block_length") and "eps" in defaults:
        defaults.pop("eps")  # a file that asks for blocks overrides the family's timestep schedule
    _check_defaults(header, defaults)
    return ModelInfo(
        architecture=arch,
        family=family,
        preset=preset,
        has_kv_memory=has_memory,
        mask_token=int(mask) if mask is not None else None,
        shift_logits=shift,
        chat_template=template if isinstance(template, str) else None,
        name=str(name),
        context_length=ctx_len,
        defaults=defaults,
        file_defaults=frozenset(from_file),
        attention_block=int(block) if block is not None else None,
    )
