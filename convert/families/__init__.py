"""Per-family conversion modules and the registry that picks one for a source.

A family module exposes `NAME`, `HF_ARCHITECTURES` (values of config.json "architectures" it
converts) and `plan_from_hf(checkpoint, outtype, name) -> GGUFPlan`. GGUF -> GGUF remaps of
foreign layouts live in `dgchat.convert.gguf_remap`, keyed by the source's general.architecture.
"""

from __future__ import annotations

from types import ModuleType

from dgchat.convert.errors import ConvertError
from dgchat.convert.families import diffusion_gemma

FAMILIES: tuple[ModuleType, ...] = (diffusion_gemma,)


def supported_hf_architectures() -> list[str]:
    return sorted(a for fam in FAMILIES for a in fam.HF_ARCHITECTURES)


def family_for_hf(config: dict) -> ModuleType:
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    for fam in FAMILIES:
        if any(a in fam.HF_ARCHITECTURES for a in archs):
            return fam
    found = ", ".join(map(str, archs)) or f"model_type {config.get('model_type')!r}"
    raise ConvertError(
        f"unsupported architecture {found}; supported: {', '.join(supported_hf_architectures())}"
    )
