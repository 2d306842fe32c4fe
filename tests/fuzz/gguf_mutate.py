"""Structure-aware mutations of GGUF files, for the fuzz target (tests/fuzz/run.py).

A GGUF is parsed into its key/value list, tensor infos and data block, one or a few mutations are
applied (a value replaced by an edge case, a key's type changed, deleted, duplicated or added, an
array cut or corrupted, a tensor's shape, type or offset changed, NaN/inf written into weights,
raw bytes flipped in the header) and the file is written back with a valid layout (offsets and
alignment recomputed) unless the mutation is about the layout itself.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Any

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
        I64: "<q", F64: "<d"}
_INT_TYPES = (U8, I8, U16, I16, U32, I32, U64, I64)
_RANGES = {U8: (0, 255), I8: (-128, 127), U16: (0, 65535), I16: (-32768, 32767), U32: (0, 2**32 - 1),
           I32: (-2**31, 2**31 - 1), U64: (0, 2**64 - 1), I64: (-2**63, 2**63 - 1)}


@dataclass
class KV:
    key: str
    vtype: int
    value: Any  # scalar, str, or (item_type, [items])
    raw: bytes | None = None  # the serialized entry while unchanged (big arrays are not re-encoded)


@dataclass
class Tensor:
    name: str
    shape: list[int]
    ggml_type: int
    offset: int


@dataclass
class Gguf:
    version: int
    kvs: list[KV]
    tensors: list[Tensor]
    data: bytes
    alignment: int = 32
    raw_tail: bytes = field(default=b"", repr=False)


class _R:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s.decode("utf-8", "surrogateescape")

    def value(self, t: int) -> Any:
        if t in _FMT:
            return self.take(_FMT[t])
        if t == STR:
            return self.string()
        if t == ARR:
            it = self.take("<I")
            n = self.take("<Q")
            return (it, [self.value(it) for _ in range(n)])
        raise ValueError(t)


def parse(buf: bytes) -> Gguf:
    r = _R(buf)
    assert r.take("<4s") == b"GGUF"
    version = r.take("<I")
    n_t, n_kv = r.take("<Q"), r.take("<Q")
    kvs = []
    for _ in range(n_kv):
        start = r.pos
        key = r.string()
        t = r.take("<I")
        value = r.value(t)
        kvs.append(KV(key, t, value, buf[start:r.pos]))
    tensors = []
    for _ in range(n_t):
        name = r.string()
        nd = r.take("<I")
        shape = [r.take("<Q") for _ in range(nd)]
        tensors.append(Tensor(name, shape, r.take("<I"), r.take("<Q")))
    align = next((kv.value for kv in kvs if kv.key == "general.alignment"), 32)
    start = (r.pos + align - 1) // align * align
    return Gguf(version, kvs, tensors, buf[start:], align)


def _wstr(s: str) -> bytes:
    b = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _wval(t: int, v: Any) -> bytes:
    if t in _FMT:
        return struct.pack(_FMT[t], v)
    if t == STR:
        return _wstr(v)
    if t == ARR:
        it, items = v
        return struct.pack("<IQ", it, len(items)) + b"".join(_wval(it, x) for x in items)
    raise ValueError(t)


def serialize(g: Gguf) -> bytes:
    out = bytearray(b"GGUF" + struct.pack("<IQQ", g.version, len(g.tensors), len(g.kvs)))
    for kv in g.kvs:
        out += kv.raw if kv.raw is not None else _wstr(kv.key) + struct.pack("<I", kv.vtype) + _wval(kv.vtype, kv.value)
    for t in g.tensors:
        out += _wstr(t.name) + struct.pack("<I", len(t.shape)) + b"".join(struct.pack("<Q", d) for d in t.shape)
        out += struct.pack("<IQ", t.ggml_type, t.offset)
    align = g.alignment if isinstance(g.alignment, int) and g.alignment > 0 else 32
    out += b"\0" * ((-len(out)) % align)
    return bytes(out) + g.data + g.raw_tail


# -- value generators ---------------------------------------------------------------------------------
def _edge_int(rng: random.Random, t: int, current: int) -> int:
    lo, hi = _RANGES[t]
    picks = [0, 1, -1, 2, 3, 7, hi, lo, hi // 2, current + 1, current - 1, current * 2, current * 1000,
             current // 2, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 4_000_000_000, 513, 1025,
             rng.randrange(lo, hi + 1)]
    return min(max(rng.choice(picks), lo), hi)


def _edge_float(rng: random.Random, current: float) -> float:
    return rng.choice([0.0, -0.0, -1.0, -1e-6, 1e-45, 1e38, -1e38, float("nan"), float("inf"), float("-inf"),
                       current * -1, current * 1e6, current / 1e6, 3.4e38, 1.0, 2.0, 0.5])


def _random_value(rng: random.Random) -> tuple[int, Any]:
    kind = rng.randrange(7)
    if kind == 0:
        return U32, _edge_int(rng, U32, 8)
    if kind == 1:
        return I32, _edge_int(rng, I32, -8)
    if kind == 2:
        return F32, _edge_float(rng, 1.0)
    if kind == 3:
        return STR, rng.choice(["lots", "abc", "", "none", "yarn", "x" * 300, "-1", "1e9", "llada", "dream",
                                "\udcff", "{{ range(99999)|list }}"])
    if kind == 4:
        return BOOL, rng.random() < 0.5
    if kind == 5:
        return U64, _edge_int(rng, U64, 2**40)
    return ARR, (rng.choice([U32, I32, F32, STR]), [])


# keys worth adding even when the seed file lacks them (dgchat's, llama.cpp's, per arch)
_ADD_SUFFIXES = [
    "expert_count", "expert_used_count", "expert_group_count", "expert_group_used_count", "attention.key_length",
    "attention.value_length", "attention.sliding_window", "rope.scaling.type", "rope.scaling.factor",
    "rope.dimension_count", "attention.layer_norm_epsilon", "final_logit_softcapping", "nextn_predict_layers",
    "pooling_type", "attention.head_count_kv", "vocab_size", "rope.freq_base", "expert_feed_forward_length",
    "attention.sliding_window_pattern", "attention.shared_kv_layers", "embedding_length_per_layer_input",
    "rope.dimension_sections", "embedding_length_out",
]
_ADD_KEYS = ["dgchat.steps", "dgchat.gen_length", "dgchat.block_length", "dgchat.algorithm", "dgchat.threshold",
             "dgchat.temperature", "dgchat.eps", "dgchat.top_p", "dgchat.top_k", "dgchat.preset", "dgchat.family",
             "diffusion.shift_logits", "tokenizer.ggml.mask_token_id", "tokenizer.ggml.bos_token_id",
             "tokenizer.ggml.eos_token_id", "tokenizer.chat_template", "dgchat.engine.non_causal_type",
             "dgchat.diffusion.eos_token_ids", "tokenizer.ggml.model", "general.alignment", "general.architecture",
             "dgchat.diffusion.canvas_length", "dgchat.diffusion.max_denoising_steps"]


def _mutate_value(rng: random.Random, kv: KV) -> None:
    kv.raw = None
    if kv.vtype in _INT_TYPES:
        kv.value = _edge_int(rng, kv.vtype, kv.value)
    elif kv.vtype in (F32, F64):
        kv.value = _edge_float(rng, kv.value)
    elif kv.vtype == BOOL:
        kv.value = not kv.value
    elif kv.vtype == STR:
        kv.value = rng.choice(["", "x", kv.value * 2, kv.value[: len(kv.value) // 2], "none", "gpt2", "llama",
                               "foo", "\udcff\udcfe", kv.value + "{% for i in range(100000) %}{% endfor %}"])
    elif kv.vtype == ARR:
        it, items = kv.value
        items = list(items)
        op = rng.randrange(6)
        if op == 0 and items:
            del items[rng.randrange(len(items)):]
        elif op == 1 and items:
            i = rng.randrange(len(items))
            items[i] = items[rng.randrange(len(items))]  # duplicates (token lists!)
        elif op == 2 and items and it in _INT_TYPES:
            i = rng.randrange(len(items))
            items[i] = _edge_int(rng, it, items[i])
        elif op == 3 and items and it in (F32, F64):
            i = rng.randrange(len(items))
            items[i] = _edge_float(rng, items[i])
        elif op == 4 and items and it == STR:
            i = rng.randrange(len(items))
            items[i] = rng.choice(["", "a", items[i] * 3, "<0xZZ>", "\udcff"])
        else:
            items = items + items[: rng.randrange(1, 4)] if items else [0]
        kv.value = (it, items)


def _retype(rng: random.Random, kv: KV) -> None:
    kv.raw = None
    t, v = _random_value(rng)
    if t == ARR:
        t, v = ARR, (U32, [_edge_int(rng, U32, 4) for _ in range(rng.randrange(0, 5))])
    kv.vtype, kv.value = t, v


def copy_of(g: Gguf) -> Gguf:
    """A copy whose key/value and tensor lists can be mutated (values themselves are replaced, never edited)."""
    return Gguf(g.version, [KV(kv.key, kv.vtype, kv.value, kv.raw) for kv in g.kvs],
                [Tensor(t.name, list(t.shape), t.ggml_type, t.offset) for t in g.tensors], g.data, g.alignment)


def mutate(seed: Gguf, rng: random.Random, n_mutations: int | None = None) -> bytes:
    """One mutated copy of the parsed GGUF `seed`, serialized."""
    g = copy_of(seed)
    arch = next((kv.value for kv in g.kvs if kv.key == "general.architecture"), "llama")
    raw_flip = False
    for _ in range(n_mutations or rng.choice([1, 1, 1, 2, 3, 6])):
        op = rng.random()
        if op < 0.40 and g.kvs:
            _mutate_value(rng, rng.choice(g.kvs))
        elif op < 0.50 and g.kvs:
            _retype(rng, rng.choice(g.kvs))
        elif op < 0.56 and g.kvs:
            g.kvs.pop(rng.randrange(len(g.kvs)))
        elif op < 0.60 and g.kvs:
            g.kvs.append(KV(**vars(rng.choice(g.kvs))))  # duplicate key
        elif op < 0.72:
            key = rng.choice([f"{arch}.{rng.choice(_ADD_SUFFIXES)}", rng.choice(_ADD_KEYS)])
            t, v = _random_value(rng)
            existing = [kv for kv in g.kvs if kv.key == key]
            if existing:
                existing[0].vtype, existing[0].value, existing[0].raw = t, v, None
            else:
                g.kvs.append(KV(key, t, v))
        elif op < 0.82 and g.tensors:
            t = rng.choice(g.tensors)
            what = rng.randrange(4)
            if what == 0:
                i = rng.randrange(len(t.shape))
                t.shape[i] = rng.choice([0, 1, t.shape[i] * 2, t.shape[i] // 2, 2**62, 2**64 - 1, t.shape[i] + 1])
            elif what == 1:
                t.ggml_type = rng.choice([0, 1, 2, 8, 12, 30, 39, 99, 2**31])
            elif what == 2:
                t.offset = rng.choice([0, t.offset + 32, t.offset + 1, 2**63, len(g.data)])
            else:
                t.shape = t.shape[:-1] or [1, 1, 1, 1, 1]
        elif op < 0.92 and g.data:
            # NaN / inf / huge values into the weights (f32 data: any 4 aligned bytes)
            data = bytearray(g.data)
            for _ in range(rng.randrange(1, 64)):
                pos = rng.randrange(0, max(1, len(data) - 4)) & ~3
                data[pos:pos + 4] = struct.pack("<f", rng.choice([float("nan"), float("inf"), -float("inf"), 3e38]))
            g.data = bytes(data)
        else:
            raw_flip = True
    out = serialize(g)
    if raw_flip:
        # a few random bytes in the header region: exercises the container parser itself
        data = bytearray(out)
        header_end = len(out) - len(g.data)
        for _ in range(rng.randrange(1, 8)):
            pos = rng.randrange(4, max(5, header_end))
            data[pos] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(24, len(data))]
        out = bytes(data)
    return out
