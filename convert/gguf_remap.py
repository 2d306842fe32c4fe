"""GGUF -> GGUF remaps: foreign GGUF layouts of models dgchat runs, rewritten into dgchat's layout.

Tensor data is copied byte for byte (quantized tensors stay as they are); only names, metadata and
the few tensors stock llama.cpp would reject change. Each remap is keyed by the source file's
`general.architecture`.

diffusion-gemma: the layout of llama.cpp PR #24423's converter as published by unsloth
(`unsloth/diffusiongemma-26B-A4B-it-GGUF`): gemma4's keys under the `diffusion-gemma.` prefix,
`diffusion-gemma.attention.causal = false`, `diffusion.canvas_length` and optional
`diffusion.eb_*` sampler keys, per-layer `blk.N.layer_output_scale.weight` (decoder scalars) and
`blk.N.enc_layer_output_scale.weight` (encoder scalars), and the self-conditioning MLP as
`self_cond_{pre_norm,gate,up,down}.weight` tensors. Details: docs/diffusion-gemma-gguf.md.

llada / dream / llada-moe / rnd1 (llama.cpp's own converter, or `dgchat convert`): the same
architecture with dgchat's keys added (sampler defaults, mask token, shift flag), or with
`--cache-capable` the architecture with a KV cache that computes the same function (`llama`,
`qwen2`, `hy_v3`, `qwen3moe`): keys renamed to the new prefix, every tensor copied as it is.
Details: docs/convert.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType, GGUFValueType

from dgchat.convert.checkpoint import to_f32
from dgchat.convert.errors import ConvertError
from dgchat.convert.families import MASKED, masked, masked_family_for_gguf
from dgchat.convert.families import diffusion_gemma as dgf
from dgchat.convert.writer import GGUFPlan, TensorPlan
from dgchat.model_backend.errors import ModelFileError
from dgchat.model_backend.gguf_file import GgufHeader, TensorInfo, read_gguf_header

Q = GGMLQuantizationType


def _raw_tensor(header: GgufHeader, info: TensorInfo, name: str | None = None) -> TensorPlan:
    shape = tuple(reversed(info.shape))
    path, offset, nbytes = header.path, info.offset, info.nbytes

    def produce() -> np.ndarray:
        return np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(nbytes,))

    return TensorPlan(name or info.name, shape, Q(info.ggml_type), produce)


def _float_values(header: GgufHeader, info: TensorInfo) -> tuple[str, np.ndarray]:
    """A small tensor's values as stored when float (bf16/f16 as uint16 bits), else dequantized f32."""
    shape = tuple(reversed(info.shape))
    raw = np.memmap(header.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes,))
    qtype = Q(info.ggml_type)
    if qtype == Q.F32:
        return "f32", np.array(raw.view("<f4").reshape(shape))
    if qtype in (Q.F16, Q.BF16):
        return ("f16" if qtype == Q.F16 else "bf16"), np.array(raw.view("<u2").reshape(shape))
    from gguf.quants import dequantize

    return "f32", dequantize(np.array(raw).reshape(shape[:-1] + (-1,)), qtype).reshape(shape).astype(np.float32)


def _as_f32(dtype: str, values: np.ndarray) -> np.ndarray:
    return to_f32(values, dtype)


# -- diffusion-gemma (llama.cpp PR #24423 / unsloth) ----------------------------------------------


def _dg_hparams(header: GgufHeader, n_vocab: int, rope_freqs: np.ndarray) -> dgf.Hparams:
    a = "diffusion-gemma"

    def need(suffix: str) -> Any:
        value = header.get(f"{a}.{suffix}")
        if value is None:
            raise ConvertError(f"{header.path.name}: key {a}.{suffix} is missing")
        return value

    n_layer = int(need("block_count"))
    pattern = header.get(f"{a}.attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) != n_layer:
        raise ConvertError(f"{header.path.name}: {a}.attention.sliding_window_pattern is missing or malformed")
    n_head = int(need("attention.head_count"))
    kv = header.get(f"{a}.attention.head_count_kv", n_head)
    kv_list = [int(x) for x in kv] if isinstance(kv, list) else [int(kv)] * n_layer
    head_full = int(need("attention.key_length"))
    canvas = header.get("diffusion.canvas_length")
    if canvas is None:
        raise ConvertError(f"{header.path.name}: diffusion.canvas_length is missing")
    full_pairs = int(np.count_nonzero(rope_freqs < 1e29))
    return dgf.Hparams(
        vocab_size=n_vocab,
        hidden_size=int(need("embedding_length")),
        intermediate_size=int(need("feed_forward_length")),
        layer_types=["sliding_attention" if s else "full_attention" for s in pattern],
        n_head=n_head,
        n_head_kv=kv_list,
        head_dim_swa=int(header.get(f"{a}.attention.key_length_swa", head_full)),
        head_dim_full=head_full,
        rope_theta_swa=float(header.get(f"{a}.rope.freq_base_swa", 10_000.0)),
        rope_theta_full=float(header.get(f"{a}.rope.freq_base", 1_000_000.0)),
        full_rope_pairs=full_pairs,
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        softcap=header.get(f"{a}.final_logit_softcapping"),
        sliding_window=int(need("attention.sliding_window")),
        n_expert=int(need("expert_count")),
        n_expert_used=int(need("expert_used_count")),
        expert_ff=int(need("expert_feed_forward_length")),
        context_length=int(need("context_length")),
        canvas_length=int(canvas),
        tied="output.weight" not in header.tensors,
    )


_DG_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
_DG_SC = {"self_cond_pre_norm.weight": "pre_norm", "self_cond_gate.weight": "gate",
          "self_cond_up.weight": "up", "self_cond_down.weight": "down"}
_DG_EB = {"max_denoising_steps": "diffusion.eb_max_steps", "t_min": "diffusion.eb_t_min",
          "t_max": "diffusion.eb_t_max", "entropy_bound": "diffusion.eb_entropy_bound",
          "stability_threshold": "diffusion.eb_stability_threshold",
          "confidence_threshold": "diffusion.eb_confidence_threshold"}


def remap_diffusion_gemma(header: GgufHeader, outtype: str, name: str) -> GGUFPlan:
    if "token_embd.weight" not in header.tensors or "rope_freqs.weight" not in header.tensors:
        raise ConvertError(f"{header.path.name}: token_embd.weight or rope_freqs.weight is missing")
    n_vocab = header.tensors["token_embd.weight"].shape[1]
    _, freqs = _float_values(header, header.tensors["rope_freqs.weight"])
    hp = _dg_hparams(header, n_vocab, _as_f32("f32", freqs))
    plan = GGUFPlan(dgf.GGUF_ARCH)

    enc = np.full(hp.n_layer, np.nan, np.float32)
    dec = np.full(hp.n_layer, np.nan, np.float32)
    sc: dict[str, tuple[str, np.ndarray]] = {}
    layer_tensors: list[TensorPlan] = []
    known_layer = set(dgf._LAYER_MAP.values())
    for tname, info in header.tensors.items():
        if tname in ("token_embd.weight", "output_norm.weight", "rope_freqs.weight", "output.weight"):
            plan.tensors.append(_raw_tensor(header, info))
        elif tname in _DG_SC:
            sc[_DG_SC[tname]] = _float_values(header, info)
        elif m := _DG_LAYER.match(tname):
            il, rest = int(m.group(1)), m.group(2)
            if il >= hp.n_layer:
                raise ConvertError(f"{header.path.name}: tensor {tname} is past block_count")
            if rest in ("layer_output_scale.weight", "enc_layer_output_scale.weight"):
                dtype, values = _float_values(header, info)
                (dec if rest.startswith("layer") else enc)[il] = float(_as_f32(dtype, values).reshape(-1)[0])
            elif rest in known_layer:
                layer_tensors.append(_raw_tensor(header, info))
            else:
                raise ConvertError(f"{header.path.name}: unexpected tensor {tname}")
        else:
            raise ConvertError(f"{header.path.name}: unexpected tensor {tname}")
    if np.isnan(enc).any() or np.isnan(dec).any():
        raise ConvertError(f"{header.path.name}: layer_output_scale / enc_layer_output_scale missing for some layers")
    if set(sc) != set(_DG_SC.values()):
        raise ConvertError(f"{header.path.name}: self-conditioning tensors (self_cond_*) are missing")

    plan.tensors.extend(layer_tensors)
    chosen = enc if dgf.TENSOR_SCALARS == "encoder" else dec
    for il in range(hp.n_layer):
        plan.tensors.append(dgf._const_tensor(f"blk.{il}.layer_output_scale.weight", np.array([chosen[il]])))

    dtypes = {sc[p][0] for p in ("gate", "up", "down")}
    if len(dtypes) != 1:  # mixed storage: fall back to exact f32 values
        for p in ("gate", "up", "down"):
            sc[p] = ("f32", _as_f32(*sc[p]))
    sc_dtype = sc["gate"][0]
    self_cond = dgf.SelfCond(sc_dtype, _as_f32(*sc["pre_norm"]), sc["gate"][1], sc["up"][1], sc["down"][1])
    if self_cond.gate.shape != (hp.intermediate_size, hp.hidden_size):
        raise ConvertError(f"{header.path.name}: self_cond_gate.weight has an unexpected shape")

    dgf.write_model_kv(plan, hp)
    for key in list(header.metadata):
        if key.startswith("tokenizer."):
            plan.add(key, header.get(key), *_kv_type(header, key))

    gen: dict[str, Any] = {}
    for param, key in _DG_EB.items():
        if header.get(key) is not None:
            gen[param] = header.get(key)
    if "entropy_bound" in gen:
        gen["sampler_config"] = {"entropy_bound": gen.pop("entropy_bound")}
    diffusion, defaulted = dgf.diffusion_params(gen)
    eos_ids = _eos_ids(header)
    dgf.write_dgchat_kv(plan, hp, source="gguf:diffusion-gemma", diffusion=diffusion, defaulted=defaulted,
                        eos_ids=eos_ids, enc_scalars=enc, dec_scalars=dec, self_cond=self_cond)
    if defaulted:
        plan.notes.append(f"sampler defaults not in the file, transformers' used: {', '.join(defaulted)}")
    dgf.finish_plan(plan, name)
    return plan


def _eos_ids(header: GgufHeader) -> list[int]:
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        value = header.get(key)
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    tokens = header.get("tokenizer.ggml.tokens") or []
    for text in ("<turn|>",):  # Gemma 4's end-of-turn marker
        if text in tokens and tokens.index(text) not in ids:
            ids.append(tokens.index(text))
    return ids


def _kv_type(header: GgufHeader, key: str) -> tuple[GGUFValueType, GGUFValueType | None]:
    """GGUF value type (and array item type) of an existing key, read with gguf's own reader."""
    field = _reader(header.path).fields[key]
    vtype = GGUFValueType(field.types[0])
    return vtype, (GGUFValueType(field.types[1]) if vtype == GGUFValueType.ARRAY else None)


_READER: dict[Path, Any] = {}


def _reader(path: Path) -> Any:
    from gguf import GGUFReader

    if path not in _READER:
        _READER.clear()  # one source at a time; the reader memory-maps the file
        _READER[path] = GGUFReader(path)
    return _READER[path]


# -- llada / dream / llada-moe / rnd1 -------------------------------------------------------------


def remap_masked(header: GgufHeader, fam: ModuleType, name: str, cache_capable: bool) -> GGUFPlan:
    F: masked.Family = fam.FAMILY
    src = header.architecture or "?"
    dst = F.cache_arch if cache_capable else src
    plan = GGUFPlan(dst)
    for key in header.metadata:
        if key == "general.architecture":
            continue
        new_key = dst + key[len(src):] if key.startswith(src + ".") else key
        plan.add(new_key, header.get(key), *_kv_type(header, key))
    plan.boolean(f"{dst}.attention.causal", False)
    if header.get("diffusion.shift_logits") is None:
        plan.boolean("diffusion.shift_logits", F.shift_logits)
    if header.get("tokenizer.ggml.mask_token_id") is None:
        tokens = header.get("tokenizer.ggml.tokens") or []
        mask = next((tokens.index(t) for t in F.mask_texts if t in tokens), None)
        if mask is None and F.mask_id is not None and F.mask_id < len(tokens):
            mask = F.mask_id
        if mask is None:
            raise ConvertError(f"{header.path.name}: no mask token (tokenizer.ggml.mask_token_id) and none of "
                               f"{', '.join(F.mask_texts) or 'the known mask texts'} in the vocabulary")
        plan.u32("tokenizer.ggml.mask_token_id", mask)
    if header.get("dgchat.format") is None:
        masked.write_dgchat_kv(plan, F, f"gguf:{src}", shift_logits=False)
    if header.get("general.name") is None:
        plan.string("general.name", name)
    for info in header.tensors.values():
        plan.tensors.append(_raw_tensor(header, info))
    if cache_capable:
        if F.cache_extras is not None:
            F.cache_extras(plan, _masked_hparams(header, src))
        plan.notes.append(f"cache-capable: `{src}` rewritten as `{dst}` with attention.causal = false "
                          "(tensors copied byte for byte)")
    return plan


def _masked_hparams(header: GgufHeader, arch: str) -> masked.Hparams:
    def need(suffix: str) -> int:
        value = header.get(f"{arch}.{suffix}")
        if value is None:
            raise ConvertError(f"{header.path.name}: key {arch}.{suffix} is missing")
        return int(value)

    hidden, n_head = need("embedding_length"), need("attention.head_count")
    return masked.Hparams(
        n_vocab=header.tensors["token_embd.weight"].shape[1] if "token_embd.weight" in header.tensors else 0,
        hidden=hidden, n_layer=need("block_count"), n_head=n_head,
        n_head_kv=int(header.get(f"{arch}.attention.head_count_kv", n_head)),
        head_dim=int(header.get(f"{arch}.attention.key_length", hidden // n_head)),
        ff=int(header.get(f"{arch}.feed_forward_length", 0)), rope_theta=0.0, rms_eps=0.0, context_length=0,
        tied="output.weight" not in header.tensors,
    )


REMAPS: dict[str, Callable[[GgufHeader, str, str], GGUFPlan]] = {"diffusion-gemma": remap_diffusion_gemma}


def supported_gguf_architectures() -> list[str]:
    return sorted({*REMAPS, *(f.FAMILY.gguf_arch for f in MASKED)})


def plan_from_gguf(path: Path, outtype: str, name: str, *, cache_capable: bool = False,
                   passthrough: bool = False) -> tuple[str, GGUFPlan | None]:
    """(source architecture, plan). With `passthrough` (the caller only quantizes), a file that
    needs no rewriting gives plan None: the caller uses it as it is."""
    try:
        header = read_gguf_header(path)
    except ModelFileError as exc:
        raise ConvertError(str(exc)) from None
    arch = header.architecture or "?"
    if outtype != "auto":
        raise ConvertError("a GGUF source keeps its tensor types; use --outtype auto (and --quantize to re-quantize)")
    dg_layout = header.get("dgchat.format") is not None
    fam = masked_family_for_gguf(arch, header.get("dgchat.family"))
    try:
        if fam is not None:
            is_cache_arch = arch == fam.FAMILY.cache_arch
            if dg_layout and (is_cache_arch or not cache_capable):
                if passthrough:
                    return arch, None
                hint = "" if is_cache_arch else " (--cache-capable rewrites it for the KV cache)"
                raise ConvertError(f"{path.name} is already in dgchat's layout; nothing to convert{hint}")
            return arch, remap_masked(header, fam, name, cache_capable and not is_cache_arch)
        if dg_layout:
            if passthrough:
                return arch, None
            raise ConvertError(f"{path.name} is already in dgchat's layout; nothing to convert")
        remap = REMAPS.get(arch)
        if remap is None:
            raise ConvertError(
                f"unsupported GGUF architecture {arch!r}; supported: {', '.join(supported_gguf_architectures())}"
            )
        plan = remap(header, outtype, name)
        if cache_capable:
            plan.notes.append("--cache-capable: gemma4 already keeps a KV cache; nothing to change")
        return arch, plan
    finally:
        _READER.clear()
