"""Random weights written straight in a GGUF storage type: no float tensor, no quantizer.

A block is a valid encoding (random quants, a finite positive scale), scaled so that the dequantized
weights have a spread of about `std`; float types get a random sign and mantissa at one exponent.
Used where only the shape and the storage type of weights matter: the full-shape speed files of
tests/bench (make_fullshape_dg.py) and the machine profile's probe models (dgchat.hub.machine_profile),
which time llama.cpp's matrix products per storage type. Writing 100 MB this way takes ~0.1 s.
"""

from __future__ import annotations

import math

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
WEIGHT_STD = 0.02  # spread of the dequantized random weights (a typical init std)

# Standard deviation of the integer part of a block whose bits are uniformly random.
_UNIFORM_STD = {Q.Q4_0: math.sqrt((16**2 - 1) / 12),  # nibble - 8 in [-8, 7]
                Q.Q8_0: math.sqrt((256**2 - 1) / 12),  # int8 in [-128, 127]
                Q.Q6_K: math.sqrt((64**2 - 1) / 12),  # 6 bits - 32 in [-32, 31]
                Q.Q4_K: math.sqrt((16**2 - 1) / 12),  # nibble in [0, 15], minus the sub-block min
                Q.Q5_K: math.sqrt((32**2 - 1) / 12)}  # 5 bits in [0, 31], minus the sub-block min
_Q6_K_SUBSCALE = 4  # int8 sub-block scale of every Q6_K sub-block; d carries the rest
# Q4_K / Q5_K: 12 bytes of packed 6-bit (scale, min) pairs for 8 sub-blocks (ggml's get_scale_min_k4):
# bytes 0-3 the scales of sub-blocks 0-3, bytes 4-7 their mins, bytes 8-11 scale | min << 4 of 4-7.
# Every scale and min is 1: a value is d * q - dmin, so dmin = d * mean(q) centres the weights on 0.
_K_SCALES = np.array([1, 1, 1, 1, 1, 1, 1, 1, 0x11, 0x11, 0x11, 0x11], dtype=np.uint8)
# Float types: one exponent for every value, |w| in [2^-6, 2^-5) (rms ~0.024), sign and mantissa random.
_FLOAT_BITS = {Q.F16: (np.uint16, 0x83FF, 9 << 10), Q.BF16: (np.uint16, 0x807F, 121 << 7),
               Q.F32: (np.uint32, 0x807FFFFF, 121 << 23)}


def _f16_scales(rng: np.random.Generator, n: int, base: float) -> np.ndarray:
    """Per-block f16 scales within 25 % of `base` (blocks of a trained model differ too)."""
    return (base * (0.75 + 0.5 * rng.random(n, dtype=np.float32))).astype(np.float16)


def _as_bytes(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8).reshape(-1, 2)


def random_blocks(rng: np.random.Generator, qtype: GGMLQuantizationType, n_blocks: int,
                  std: float = WEIGHT_STD) -> np.ndarray:
    """`n_blocks` random blocks of `qtype` as raw bytes [n_blocks, type_size]: uniformly random
    quants and a positive f16 scale, so the dequantized values have a spread of about `std`
    (float types: see _FLOAT_BITS; `std` does not apply)."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.bit_generator.random_raw(-(-n_blocks * type_size // 8)).view(np.uint8)
    blocks = raw[: n_blocks * type_size].reshape(n_blocks, type_size)
    if qtype in _FLOAT_BITS:
        dtype, keep, exponent = _FLOAT_BITS[qtype]
        words = blocks.reshape(-1).view(dtype)
        words &= dtype(keep)
        words |= dtype(exponent)
    elif qtype in (Q.Q4_0, Q.Q8_0):  # block: f16 d, then the quants
        blocks[:, :2] = _as_bytes(_f16_scales(rng, n_blocks, std / _UNIFORM_STD[qtype]))
    elif qtype == Q.Q6_K:  # block: ql[128], qh[64], int8 scales[16], f16 d
        blocks[:, 192:208] = _Q6_K_SUBSCALE
        d = _f16_scales(rng, n_blocks, std / (_UNIFORM_STD[qtype] * _Q6_K_SUBSCALE))
        blocks[:, 208:210] = _as_bytes(d)
    elif qtype in (Q.Q4_K, Q.Q5_K):  # block: f16 d, f16 dmin, scales[12], (qh[32],) qs[128]
        d = _f16_scales(rng, n_blocks, std / _UNIFORM_STD[qtype])
        mean_q = 7.5 if qtype == Q.Q4_K else 15.5
        blocks[:, :2] = _as_bytes(d)
        blocks[:, 2:4] = _as_bytes((d.astype(np.float32) * mean_q).astype(np.float16))
        blocks[:, 4:16] = _K_SCALES
    else:
        raise ValueError(f"no random block writer for {qtype.name}")
    return blocks


def random_tensor_bytes(rng: np.random.Generator, qtype: GGMLQuantizationType, n_elements: int) -> np.ndarray:
    """A whole tensor's data: `n_elements` random weights of `qtype`, flat bytes."""
    block, _ = GGML_QUANT_SIZES[qtype]
    if n_elements % block:
        raise ValueError(f"{n_elements} weights do not divide into {qtype.name} blocks of {block}")
    return random_blocks(rng, qtype, n_elements // block).reshape(-1)


SUPPORTED = tuple(sorted((*_UNIFORM_STD, *_FLOAT_BITS), key=int))
