"""Types and ranges of everything a GGUF's metadata tells llama.cpp and dgchat, checked before either acts.

`gguf_file.read_gguf_header` guarantees a well-formed container (every tensor inside the file);
this module guarantees sane *values*. llama.cpp answers many bad values with an exception that
dgchat turns into a one-line error, but it answers others with `GGML_ASSERT`, which aborts the whole
process (a negative `attention.layer_norm_rms_epsilon` passed its loader and killed the app at the
first decode), or with allocations sized by the file. Every key listed here is one that llama.cpp's
loader (src/llama-model.cpp `load_hparams`, src/models/<arch>.cpp, src/llama-vocab.cpp) or dgchat
reads for the architectures dgchat accepts; the bounds are far above any real model and below what
the C++ code asserts on or overflows with.

`check_model_header` raises ModelFileError / UnsupportedModelError naming the file, the key and the
value. It is called by `model_info.inspect_header` (CLI, app, `models import`, the server all go
through it) and by `llamacpp.LlamaModel` (nothing reaches llama.cpp without it).
"""

from __future__ import annotations

import math
import mmap
import numbers
import re
import struct
from collections.abc import Sequence
from typing import Any

from dgchat.model_backend.architectures import MAX_ATTENTION_BLOCK, SUPPORTED_HELP
from dgchat.model_backend.errors import ModelFileError, UnsupportedModelError
from dgchat.model_backend.gguf_file import GgufHeader, LazyArray

# general.architecture values dgchat runs: llama.cpp's diffusion architectures, DiffusionGemma's
# gemma4, and the KV-cache architectures `dgchat convert --cache-capable` writes
# (llada -> llama, dream -> qwen2, rnd1 -> qwen3moe, llada-moe -> hy_v3), and the block-diffusion
# files (SDAR, BD3LM: qwen3, qwen2). Any other architecture's loader reads keys this module does not
# know, so it is refused rather than half-checked.
ACCEPTED_ARCHS = ("llada", "llada-moe", "dream", "rnd1", "gemma4", "llama", "qwen2", "qwen3", "qwen3moe", "hy_v3")
# tokenizer.ggml.model values whose llama.cpp tokenizers these architectures use. Others are refused:
# "none"/"no_vocab" leave a vocabulary that GGML_ASSERTs on its first use, "rwkv" asserts without a
# newline token, "bert" aborts on byte tokens.
TOKENIZER_MODELS = ("gpt2", "llama", "gemma4")
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # anything else: GGML_ASSERT in load_hparams

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
MAX_CONTEXT = 1 << 24
MAX_EMBD = 1 << 16
MAX_FF = 1 << 20
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_VOCAB = 1 << 20  # the largest real vocabularies have ~262k tokens
MAX_TOKEN_BYTES = 1024  # one vocabulary entry (llama.cpp sizes buffers by the longest)
MAX_TEMPLATE_CHARS = 1 << 20  # a chat template; real ones are a few KB
MAX_FLOAT = 1e30  # rope bases, scales, softcaps: finite and far from float32 overflow

_BYTE_TOKEN = re.compile(rb"^<0x[0-9A-Fa-f]{2}>$")
_TOKEN_TYPE_BYTE = 6
_SPECIAL_ID_KEYS = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask", "cls", "fim_pre",
                    "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep", "prefix", "suffix", "middle")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Check:
    """Helpers that read one key and raise a one-line ModelFileError naming it."""

    def __init__(self, header: GgufHeader) -> None:
        self.h = header
        self.name = header.path.name
        self.arch = header.architecture or ""

    def fail(self, key: str, value: Any, why: str) -> None:
        raise ModelFileError(f"{self.name}: metadata {key} = {_show(value)} {why}; the file is corrupt or hostile")

    def raw(self, key: str) -> Any:
        value = self.h.metadata.get(key)
        if isinstance(value, LazyArray):
            if value.item_type == 8:  # strings: bounded by the file, but not needed as Python objects here
                return value
            return self.h.array(key)
        return value

    def integer(self, key: str, lo: int, hi: int, *, required: bool = False) -> int | None:
        value = self.raw(key)
        if value is None:
            if required:
                raise ModelFileError(f"{self.name}: metadata key {key} is missing")
            return None
        if not _is_int(value):
            self.fail(key, value, "is not an integer")
        if not lo <= value <= hi:
            self.fail(key, value, f"is outside [{lo}, {hi}]")
        return int(value)

    def number(self, key: str, lo: float, hi: float, *, lo_open: bool = False) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        if not _is_num(value) or not math.isfinite(float(value)):
            self.fail(key, value, "is not a finite number")
        value = float(value)
        if value < lo or value > hi or (lo_open and value == lo):
            self.fail(key, value, f"is outside {'(' if lo_open else '['}{lo:g}, {hi:g}]")
        return value

    def boolean(self, key: str) -> bool | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            self.fail(key, value, "is not true/false")
        return value

    def string(self, key: str, choices: Sequence[str] | None = None, max_len: int = 4096) -> str | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail(key, value, "is not a string")
        if len(value) > max_len:
            self.fail(key, value[:20] + "...", f"is longer than {max_len} characters")
        if choices is not None and value not in choices:
            self.fail(key, value, f"is not one of {', '.join(choices)}")
        return value

    def per_layer(self, key: str, n_layer: int, lo: int, hi: int, *, required: bool = False) -> list[int] | None:
        """A scalar or an array of one value per layer (llama.cpp's get_key_or_arr)."""
        value = self.raw(key)
        if value is None:
            if required:
                raise ModelFileError(f"{self.name}: metadata key {key} is missing")
            return None
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(value) != n_layer:
            self.fail(key, f"<{len(value)} values>", f"must have one value per layer ({n_layer})")
        for v in values:
            if not _is_int(v):
                self.fail(key, v, "is not an integer")
            if not lo <= v <= hi:
                self.fail(key, v, f"is outside [{lo}, {hi}]")
        return [int(v) for v in values] * (n_layer if not isinstance(value, list) else 1)

    def float_array(self, key: str, n: int | None, lo: float = -MAX_FLOAT, hi: float = MAX_FLOAT) -> None:
        value = self.raw(key)
        if value is None:
            return
        if not isinstance(value, list):
            self.fail(key, value, "is not an array")
        if n is not None and len(value) != n:
            self.fail(key, f"<{len(value)} values>", f"must have {n} values")
        for v in value:
            if not _is_num(v) or not math.isfinite(float(v)) or not lo <= float(v) <= hi:
                self.fail(key, v, "is not a finite number in range")


def vocab_size(header: GgufHeader) -> int:
    """Number of tokens in the vocabulary (0 when there is none)."""
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, LazyArray):
        return tokens.count
    return len(tokens) if isinstance(tokens, list) else 0


def _k(arch: str, suffix: str) -> str:
    return f"{arch}.{suffix}"


def check_model_header(header: GgufHeader) -> None:
    """Raise a one-line error if any value llama.cpp or dgchat reads from this GGUF is out of range."""
    if header.values_checked:
        return
    c = _Check(header)
    arch = header.architecture
    if arch is None:
        raw = header.metadata.get("general.architecture")
        if raw is None:
            raise UnsupportedModelError(f"{c.name}: GGUF has no general.architecture key")
        c.fail("general.architecture", raw, "is not a string")
    if arch not in ACCEPTED_ARCHS and arch != "diffusion-gemma":
        raise UnsupportedModelError(f"{c.name}: unknown model architecture: {_show(arch)}; dgchat runs {SUPPORTED_HELP}")
    if arch == "diffusion-gemma":
        return  # never loaded: inspect_header asks for `dgchat convert`, which validates the tensors it remaps
    _check_hparams(c, arch)
    _check_tensors(c)
    n_vocab = _check_vocab(c)
    _check_dgchat_keys(c, arch, n_vocab)
    header.values_checked = True


def _check_hparams(c: _Check, arch: str) -> None:
    k = lambda suffix: _k(arch, suffix)  # noqa: E731
    c.integer(k("context_length"), 1, MAX_CONTEXT, required=True)
    n_embd = c.integer(k("embedding_length"), 1, MAX_EMBD, required=True)
    n_layer = c.integer(k("block_count"), 1, MAX_LAYERS, required=True)
    assert n_embd is not None and n_layer is not None
    c.integer(k("embedding_length_out"), 0, MAX_EMBD)
    c.integer(k("nextn_predict_layers"), 0, 0)  # multi-token-prediction layers: dgchat's graphs have none
    c.integer(k("pooling_type"), -1, 0)  # an embedding pooling would replace the logits dgchat reads
    c.boolean(k("attention.causal"))
    c.per_layer(k("feed_forward_length"), n_layer, 0, MAX_FF)

    # experts: load_hparams GGML_ASSERTs every one of these relations
    n_expert = c.integer(k("expert_count"), 0, MAX_EXPERTS) or 0
    used = c.per_layer(k("expert_used_count"), n_layer, 0, MAX_EXPERTS) or [0]
    groups = c.integer(k("expert_group_count"), 0, MAX_EXPERTS) or 0
    group_used = c.integer(k("expert_group_used_count"), 0, MAX_EXPERTS) or 0
    if max(used) > n_expert:
        c.fail(k("expert_used_count"), max(used), f"exceeds expert_count ({n_expert})")
    if n_expert > 0:
        if max(used) == 0:
            c.fail(k("expert_used_count"), max(used), "must be > 0 when the model has experts")
        if groups >= n_expert:
            c.fail(k("expert_group_count"), groups, f"must be below expert_count ({n_expert})")
        if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
            c.fail(k("expert_group_used_count"), group_used, f"does not fit {groups} groups of {n_expert} experts")
    elif groups or (arch in ("llada-moe", "rnd1", "qwen3moe", "hy_v3")):
        if arch in ("llada-moe", "rnd1", "qwen3moe", "hy_v3"):
            raise ModelFileError(f"{c.name}: metadata key {k('expert_count')} must be > 0 for {arch}")
        c.fail(k("expert_group_count"), groups, "must be 0 without experts")
    c.per_layer(k("expert_feed_forward_length"), n_layer, 0 if n_expert == 0 else 1, MAX_FF)
    c.integer(k("expert_shared_feed_forward_length"), 0, MAX_FF)
    c.integer(k("expert_gating_func"), 0, 4)
    c.number(k("expert_weights_scale"), -MAX_FLOAT, MAX_FLOAT)
    c.boolean(k("expert_weights_norm"))
    c.integer(k("expert_shared_count"), 0, MAX_EXPERTS)

    # attention heads and their sizes
    heads = c.per_layer(k("attention.head_count"), n_layer, 1, MAX_HEADS, required=True)
    assert heads is not None
    heads_kv = c.per_layer(k("attention.head_count_kv"), n_layer, 1, MAX_HEADS) or heads
    for h, hkv in zip(heads, heads_kv):
        if hkv > h or h % hkv:
            c.fail(k("attention.head_count_kv"), hkv, f"must divide attention.head_count ({h})")
    n_head = heads[0]
    default_head = n_embd // n_head
    head_k = c.integer(k("attention.key_length"), 1, MAX_HEAD_DIM)
    head_v = c.integer(k("attention.value_length"), 1, MAX_HEAD_DIM)
    if head_k is None and default_head < 1:
        c.fail(k("attention.head_count"), n_head, f"exceeds embedding_length ({n_embd})")
    head_k = head_k or default_head
    head_v = head_v or default_head
    head_k_swa = c.integer(k("attention.key_length_swa"), 1, MAX_HEAD_DIM) or head_k
    head_v_swa = c.integer(k("attention.value_length_swa"), 1, MAX_HEAD_DIM) or head_v
    for key, value in (("attention.key_length", head_k), ("attention.value_length", head_v),
                       ("attention.key_length_swa", head_k_swa), ("attention.value_length_swa", head_v_swa)):
        if value % 2:
            c.fail(k(key), value, "must be even (rotary pairs)")
    for suffix in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        # ggml asserts eps >= 0 at the first decode (the crash that started this module)
        c.number(k(suffix), 0.0, 1.0, lo_open=True)
    c.number(k("attention.scale"), -MAX_FLOAT, MAX_FLOAT)
    for suffix in ("final_logit_softcapping", "attn_logit_softcapping"):
        c.number(k(suffix), 0.0, MAX_FLOAT)
    c.number(k("attention.clamp_kqv"), 0.0, MAX_FLOAT)
    c.number(k("attention.max_alibi_bias"), 0.0, MAX_FLOAT)

    # rotary embeddings: every graph of these architectures rotates the whole head and
    # GGML_ASSERTs n_embd_head_v == n_embd_head_k == n_rot when it is built (src/models/*.cpp); a
    # gemma4 graph with a shorter rotation never finished its first decode
    n_rot = c.integer(k("rope.dimension_count"), 0, head_k)
    n_rot_swa = c.integer(k("rope.dimension_count_swa"), 0, head_k_swa)
    for key, value in (("rope.dimension_count", n_rot), ("rope.dimension_count_swa", n_rot_swa)):
        if value is not None and value % 2:
            c.fail(k(key), value, "must be even")
    if head_v != head_k:
        c.fail(k("attention.value_length"), head_v, f"must equal attention.key_length ({head_k})")
    if head_v_swa != head_k_swa:
        c.fail(k("attention.value_length_swa"), head_v_swa, f"must equal attention.key_length_swa ({head_k_swa})")
    if n_rot is not None and n_rot != head_k:
        c.fail(k("rope.dimension_count"), n_rot, f"must equal the head size ({head_k})")
    if n_rot_swa is not None and n_rot_swa != head_k_swa:
        c.fail(k("rope.dimension_count_swa"), n_rot_swa, f"must equal the sliding-window head size ({head_k_swa})")
    for suffix in ("rope.freq_base", "rope.freq_base_swa"):
        c.number(k(suffix), 0.0, MAX_FLOAT, lo_open=True)
    c.string(k("rope.scaling.type"), ROPE_SCALING_TYPES)
    for suffix in ("rope.scaling.factor", "rope.scale_linear"):
        factor = c.number(k(suffix), 0.0, 1e6)
        if factor is not None and 0 < factor < 1e-6:
            c.fail(k(suffix), factor, "is too small")
    c.number(k("rope.scaling.attn_factor"), 0.0, 1e6, lo_open=True)
    c.number(k("rope.scaling.alpha"), 0.0, 1e6)
    c.integer(k("rope.scaling.original_context_length"), 0, MAX_CONTEXT)
    c.boolean(k("rope.scaling.finetuned"))
    for suffix in ("rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_beta_fast",
                   "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_log_multiplier"):
        c.number(k(suffix), -1e6, 1e6)
    sections = c.raw(k("rope.dimension_sections"))
    if sections is not None:
        if not isinstance(sections, list) or len(sections) > 4 or not all(_is_int(v) and 0 <= v <= head_k for v in sections):
            c.fail(k("rope.dimension_sections"), sections, "is not up to 4 section sizes")

    # sliding-window attention
    pattern = c.raw(k("attention.sliding_window_pattern"))
    has_swa = False
    if pattern is not None:
        if isinstance(pattern, list):
            if len(pattern) != n_layer or not all(isinstance(v, bool) for v in pattern):
                c.fail(k("attention.sliding_window_pattern"), f"<{len(pattern)} values>",
                       f"must be {n_layer} true/false values")
            has_swa = any(pattern)
        elif not _is_int(pattern) or not 0 <= pattern <= n_layer:
            c.fail(k("attention.sliding_window_pattern"), pattern, f"is outside [0, {n_layer}]")
        else:
            has_swa = pattern != 1
    window = c.integer(k("attention.sliding_window"), 0, MAX_CONTEXT, required=arch == "gemma4")
    if (has_swa or arch == "gemma4") and window is not None and window < 1:
        c.fail(k("attention.sliding_window"), window, "must be >= 1 for sliding-window layers")
    shared = c.integer(k("attention.shared_kv_layers"), 0, n_layer - 1)
    if arch == "gemma4" and shared:
        c.fail(k("attention.shared_kv_layers"), shared, "must be 0 (dgchat's DiffusionGemma layout)")
    c.integer(k("embedding_length_per_layer_input"), 0, MAX_EMBD)
    if arch == "gemma4":
        c.integer(k("attention.sliding_window"), 1, MAX_CONTEXT, required=True)
        c.integer(k("attention.key_length_swa"), 1, MAX_HEAD_DIM, required=True)
        c.integer(k("attention.value_length_swa"), 1, MAX_HEAD_DIM, required=True)
        c.integer(k("embedding_length_per_layer_input"), 0, MAX_EMBD, required=True)
    if arch in ("llada", "llada-moe", "dream", "rnd1", "llama", "qwen2", "qwen3", "qwen3moe", "hy_v3", "gemma4"):
        c.number(k("attention.layer_norm_rms_epsilon"), 0.0, 1.0, lo_open=True)
        if c.raw(k("attention.layer_norm_rms_epsilon")) is None:
            raise ModelFileError(f"{c.name}: metadata key {k('attention.layer_norm_rms_epsilon')} is missing")
    c.integer(k("vocab_size"), 1, MAX_VOCAB)
    # dgchat's engine patches read these (llama.cpp throws on wrong types; values are checked here)
    c.integer("dgchat.engine.non_causal_type", 0, 3)  # LLAMA_NON_CAUSAL_TYPE_DGCHAT_CANVAS = 3
    c.integer("dgchat.engine.attention_block", 1, MAX_ATTENTION_BLOCK)  # block-causal attention (patch 0017)
    for which in ("causal", "non_causal"):
        c.float_array(f"dgchat.engine.layer_output_scale.{which}", n_layer, -1e6, 1e6)


# ggml types a weight may have: what `dgchat convert` and llama.cpp's quantizer write, all with CPU
# kernels. The integer types (I8..I64, F64) and the dot-product-only Q8_1 / Q8_K abort in mul_mat.
WEIGHT_TYPES = frozenset({0, 1, 30, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21, 22, 23, 29, 34, 35, 39})
_F32 = 0


def _check_tensors(c: _Check) -> None:
    """Tensor types: a weight of a type without kernels aborts the first decode, and a vector (norm,
    bias, scale) feeds element-wise ops whose CPU kernels abort on anything but f32
    ("binary_op: unsupported types"); converters and the quantizer keep them f32."""
    for info in c.h.tensors.values():
        if info.ggml_type not in WEIGHT_TYPES:
            raise ModelFileError(f"{c.name}: tensor {_show(info.name)} has ggml type {info.type_name}, "
                                 f"which dgchat's engine cannot compute with; the file is corrupt or hostile")
        if sum(1 for d in info.shape[1:] if d != 1) == 0 and info.ggml_type != _F32:
            raise ModelFileError(f"{c.name}: tensor {_show(info.name)} is a vector of type {info.type_name}; "
                                 f"vectors (norms, biases, scales) must be F32; the file is corrupt or hostile")


def _raw_strings(header: GgufHeader, key: str) -> list[bytes] | None:
    """A string array as raw bytes (uniqueness must be judged on bytes: llama.cpp compares bytes)."""
    value = header.metadata.get(key)
    if value is None:
        return None
    if isinstance(value, list):
        return [v.encode("utf-8", "surrogatepass") if isinstance(v, str) else b"" for v in value]
    if not isinstance(value, LazyArray) or value.item_type != 8:
        return None
    out: list[bytes] = []
    with open(header.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos = value.offset
        for _ in range(value.count):
            (length,) = struct.unpack_from("<Q", mm, pos)
            pos += 8
            out.append(bytes(mm[pos : pos + length]))
            pos += length
    return out


def _check_vocab(c: _Check) -> int:
    h = c.h
    c.string("tokenizer.ggml.model", TOKENIZER_MODELS)
    if c.raw("tokenizer.ggml.model") is None:
        raise ModelFileError(f"{c.name}: metadata key tokenizer.ggml.model is missing")
    c.string("tokenizer.ggml.pre", max_len=256)
    tokens_meta = h.metadata.get("tokenizer.ggml.tokens")
    is_strings = (isinstance(tokens_meta, LazyArray) and tokens_meta.item_type == 8) or (
        isinstance(tokens_meta, list) and all(isinstance(t, str) for t in tokens_meta))
    if tokens_meta is None:
        raise ModelFileError(f"{c.name}: metadata key tokenizer.ggml.tokens is missing (no vocabulary)")
    if not is_strings:
        c.fail("tokenizer.ggml.tokens", "<array>", "is not an array of strings")
    tokens = _raw_strings(h, "tokenizer.ggml.tokens") or []
    n_vocab = len(tokens)
    if not 1 <= n_vocab <= MAX_VOCAB:
        c.fail("tokenizer.ggml.tokens", f"<{n_vocab} tokens>", f"must hold 1 to {MAX_VOCAB} tokens")
    # llama.cpp maps text -> id and GGML_ASSERTs that no two tokens share a text (an empty one is
    # renamed "[EMPTY_<i>]" first)
    seen: set[bytes] = set()
    for i, tok in enumerate(tokens):
        if len(tok) > MAX_TOKEN_BYTES:
            c.fail("tokenizer.ggml.tokens", f"<token {i} of {len(tok)} bytes>", f"exceeds {MAX_TOKEN_BYTES} bytes")
        key = tok or f"[EMPTY_{i}]".encode()
        if key in seen:
            c.fail("tokenizer.ggml.tokens", f"<token {i}>", "repeats an earlier token (llama.cpp aborts on that)")
        seen.add(key)
    if c.raw("tokenizer.ggml.model") == "llama":
        # SentencePiece-style tokenizing falls back to byte tokens for any text its pieces cannot
        # spell and looks them up with unordered_map::at: a missing one throws through llama.cpp's
        # C API and terminates the process at the first such prompt
        missing = [b for b in range(256) if b"<0x%02X>" % b not in seen and bytes([b]) not in seen]
        if missing:
            c.fail("tokenizer.ggml.tokens", f"<{n_vocab} tokens>",
                   f"lacks the byte token <0x{missing[0]:02X}> that a SentencePiece vocabulary needs")
    types = h.get("tokenizer.ggml.token_type")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_vocab:
            c.fail("tokenizer.ggml.token_type", "<array>", f"must hold one type per token ({n_vocab})")
        for i, t in enumerate(types):
            if not _is_int(t) or not 0 <= t <= 6:
                c.fail("tokenizer.ggml.token_type", t, f"(token {i}) is not a token type 0-6")
            # llama.cpp reads a byte token's value from characters 3-4 of its text and throws past
            # its C API (std::terminate) when the text is shorter
            if t == _TOKEN_TYPE_BYTE and not _BYTE_TOKEN.match(tokens[i]):
                c.fail("tokenizer.ggml.token_type", t, f"marks token {i} as a byte but its text is not <0xNN>")
    scores = h.get("tokenizer.ggml.scores")
    if scores is not None:
        if not isinstance(scores, list) or len(scores) != n_vocab:
            c.fail("tokenizer.ggml.scores", "<array>", f"must hold one score per token ({n_vocab})")
        if any(not _is_num(s) or not math.isfinite(float(s)) for s in scores):
            c.fail("tokenizer.ggml.scores", "<array>", "holds a value that is not a finite number")
    merges = h.metadata.get("tokenizer.ggml.merges")
    if merges is not None and not ((isinstance(merges, LazyArray) and merges.item_type == 8)
                                   or (isinstance(merges, list) and all(isinstance(m, str) for m in merges))):
        c.fail("tokenizer.ggml.merges", "<array>", "is not an array of strings")
    for name in _SPECIAL_ID_KEYS:
        c.integer(f"tokenizer.ggml.{name}_token_id", 0, n_vocab - 1)
    for name in ("add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix", "remove_extra_whitespaces"):
        c.boolean(f"tokenizer.ggml.{name}")
    template = h.metadata.get("tokenizer.chat_template")
    if template is not None:
        if not isinstance(template, str):
            c.fail("tokenizer.chat_template", template, "is not a string")
        if len(template) > MAX_TEMPLATE_CHARS:
            c.fail("tokenizer.chat_template", template[:20] + "...", f"is longer than {MAX_TEMPLATE_CHARS} characters")
    return n_vocab


def _check_dgchat_keys(c: _Check, arch: str, n_vocab: int) -> None:
    c.string("general.name", max_len=1024)
    shift = c.raw("diffusion.shift_logits")
    if shift is not None and not isinstance(shift, bool) and shift not in ("true", "false", "True", "False"):
        c.fail("diffusion.shift_logits", shift, "is not true/false")
    c.string("dgchat.family", max_len=64)
    c.string("dgchat.block_diffusion.variant", max_len=64)
    eos = c.raw("dgchat.diffusion.eos_token_ids")
    if eos is not None:
        if not isinstance(eos, list) or len(eos) > 4096 or not all(_is_int(t) and 0 <= t < n_vocab for t in eos):
            c.fail("dgchat.diffusion.eos_token_ids", eos, f"must be token ids below {n_vocab}")
    if arch == "gemma4" and c.raw("dgchat.family") == "diffusion-gemma":
        n_embd = int(c.raw(_k(arch, "embedding_length")))
        n_layer = int(c.raw(_k(arch, "block_count")))
        prefix = "dgchat.diffusion_gemma."
        inter = c.integer(prefix + "self_cond.intermediate_size", 1, MAX_FF, required=True)
        dtype = c.string(prefix + "self_cond.dtype", ("bf16", "f16", "f32"))
        if dtype is None:
            raise ModelFileError(f"{c.name}: metadata key {prefix}self_cond.dtype is missing")
        weight_type = 6 if dtype == "f32" else 2  # float32 values, or 16-bit patterns stored as uint16
        c.number(prefix + "embed_scale", 0.0, 1e6, lo_open=True)
        assert inter is not None
        sizes = {"self_cond.pre_norm": n_embd, "self_cond.gate": inter * n_embd, "self_cond.up": inter * n_embd,
                 "self_cond.down": n_embd * inter, "layer_scalars.encoder": n_layer,
                 "layer_scalars.decoder": n_layer}
        for suffix, want in sizes.items():
            key = prefix + suffix
            value = c.h.metadata.get(key)
            count = value.count if isinstance(value, LazyArray) else len(value) if isinstance(value, list) else None
            if count is None:
                raise ModelFileError(f"{c.name}: metadata key {key} is missing or not an array")
            item_type = value.item_type if isinstance(value, LazyArray) else None
            want_type = weight_type if suffix in ("self_cond.gate", "self_cond.up", "self_cond.down") else 6
            if item_type is not None and item_type != want_type:
                c.fail(key, "<array>", f"has GGUF item type {item_type}, expected {want_type}")
            if isinstance(value, list) and not all(_is_num(v) for v in value):
                c.fail(key, "<array>", "is not a numeric array")
            if count != want:
                c.fail(key, f"<{count} values>", f"must hold {want} values")
