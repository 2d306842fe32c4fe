"""What kind of diffusion model a GGUF holds, and how to run it by default — from the header alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dgchat.model_backend.errors import UnsupportedModelError
from dgchat.model_backend.gguf_file import GgufHeader

# Architectures llama.cpp itself treats as diffusion models (llm_arch_is_diffusion): no KV memory.
NATIVE_DIFFUSION_ARCHS = ("llada", "llada-moe", "dream", "rnd1")
SUPPORTED_HELP = (
    "llada, llada-moe, dream, rnd1, DiffusionGemma (gemma4 GGUFs converted by `dgchat convert`), "
    "or any architecture whose GGUF sets attention.causal = false and a mask token"
)

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
        temperature=0.0, algorithm="entropy",
    ),
}
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
}


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    family: str  # "masked" | "diffusion_gemma"
    preset: str  # key into _FAMILY_DEFAULTS
    has_kv_memory: bool  # llama.cpp keeps a KV cache for this architecture
    mask_token: int | None
    shift_logits: bool
    chat_template: str | None
    name: str
    context_length: int
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def uniform_state(self) -> bool:
        return self.family == "diffusion_gemma"


def _bool(value: Any, default: bool) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.lower() == "true"
    return default


def inspect_header(header: GgufHeader) -> ModelInfo:
    """Classify the model or raise UnsupportedModelError with a one-line reason."""
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
    ctx_len = int(header.arch_key("context_length", 0) or 0)
    if arch == "gemma4" and header.get("dgchat.family") == "diffusion-gemma":
        family, preset, has_memory, shift = "diffusion_gemma", "diffusion_gemma", True, False
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
        shift = _bool(header.get("diffusion.shift_logits"), preset == "dream")
    defaults = dict(_FAMILY_DEFAULTS.get(preset, _FAMILY_DEFAULTS["llada"]))
    if family == "diffusion_gemma":
        # the converter stores the checkpoint's generation_config under dgchat.diffusion.*
        for key, param in _DG_KEYS.items():
            value = header.get("dgchat.diffusion." + key)
            if value is not None:
                defaults[param] = value
    for key, param in _DEFAULT_KEYS.items():
        value = header.get(key)
        if value is not None:
            defaults[param] = value
    if defaults.get("block_length") and "eps" in defaults:
        defaults.pop("eps")  # a file that asks for blocks overrides the family's timestep schedule
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
    )
