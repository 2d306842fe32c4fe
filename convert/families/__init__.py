"""Per-family conversion modules and the registry that picks one for a source.

A family module exposes `NAME`, `HF_ARCHITECTURES` (values of config.json "architectures" it
converts) and `plan_from_hf(checkpoint, outtype, name, *, cache_capable=False) -> GGUFPlan`.
The masked-diffusion families (llada, dream, llada_moe, rnd1) also expose `FAMILY`
(`dgchat.convert.families.masked.Family`: their llama.cpp architecture, its cache-capable twin,
sampler defaults); what they share lives in `masked`. GGUF -> GGUF remaps live in
`dgchat.convert.gguf_remap`, keyed by the source's general.architecture.

A family may also expose `claims_config(config) -> bool` for configs no `architectures` entry
matches: `block_diffusion` answers for dllm's A2D configs and for plain Qwen3 / Qwen2 ones (which
it refuses as autoregressive, unless they carry SDAR's block keys).
"""

from __future__ import annotations

from types import ModuleType

from dgchat.convert.errors import ConvertError
from dgchat.convert.families import block_diffusion, diffusion_gemma, dream, llada, llada_moe, rnd1

FAMILIES: tuple[ModuleType, ...] = (diffusion_gemma, llada, llada_moe, dream, rnd1, block_diffusion)
MASKED: tuple[ModuleType, ...] = (llada, llada_moe, dream, rnd1)


def supported_hf_architectures() -> list[str]:
    return sorted(a for fam in FAMILIES for a in fam.HF_ARCHITECTURES)


def family_for_hf(config: dict) -> ModuleType:
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    for fam in FAMILIES:
        if any(a in fam.HF_ARCHITECTURES for a in archs):
            return fam
    for fam in FAMILIES:
        claims = getattr(fam, "claims_config", None)
        if claims is not None and claims(config):
            return fam
    found = ", ".join(map(str, archs)) or f"model_type {config.get('model_type')!r}"
    raise ConvertError(
        f"unsupported architecture {found}; supported: {', '.join(supported_hf_architectures())}"
    )


def masked_family_for_gguf(arch: str, dgchat_family: str | None) -> ModuleType | None:
    """The masked family a GGUF belongs to: by its llama.cpp diffusion architecture, or, for a
    cache-capable file (`llama`, `qwen2`, ...), by the `dgchat.family` key dgchat wrote."""
    for fam in MASKED:
        if arch == fam.FAMILY.gguf_arch or (dgchat_family == fam.NAME and arch == fam.FAMILY.cache_arch):
            return fam
    return None
