"""DiffusionGemma decoder input embeddings, in numpy, from the weights stored in dgchat's GGUF.

The decoder pass does not start from token embeddings alone. transformers
(`DiffusionGemmaDecoderModel.forward` + `DiffusionGemmaSelfConditioning`) computes, per canvas row:

    x    = E[token] * sqrt(d)                                   # scaled token embedding
    soft = softmax(prev_logits) @ E * sqrt(d)   (zeros on the first step)
    n    = rmsnorm(soft) * pre_norm
    sc   = down(gelu_tanh(gate(n)) * up(n))                     # gated MLP
    emb  = rmsnorm_noscale(x + sc)                              # what layer 0 receives

`prev_logits` are the *processed* logits of the previous denoising step (after the temperature
schedule), exactly what the reference sampler feeds back. llama.cpp's gemma4 graph does not rescale
embeddings passed through `batch.embd`, so `emb` goes to the engine as is.

The self-conditioning weights and the scale live in the GGUF metadata (`dgchat.diffusion_gemma.*`,
see docs/diffusion-gemma-gguf.md); E is the file's `token_embd.weight`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dgchat.model_backend.errors import ModelFileError
from dgchat.model_backend.gguf_file import GgufHeader, LazyArray, read_gguf_header

PREFIX = "dgchat.diffusion_gemma."
_ITEM_DTYPES = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 10: "<u8", 11: "<i8", 12: "<f8"}


def _array(header: GgufHeader, key: str) -> np.ndarray:
    """A numeric metadata array as numpy, read straight from the file (they can be millions long)."""
    value = header.metadata.get(key)
    if value is None:
        raise ModelFileError(f"{header.path.name}: metadata key {key} is missing (not a dgchat DiffusionGemma file?)")
    if isinstance(value, LazyArray):
        dtype = _ITEM_DTYPES.get(value.item_type)
        if dtype is None:
            raise ModelFileError(f"{header.path.name}: {key} is not a numeric array")
        return np.fromfile(header.path, dtype=dtype, count=value.count, offset=value.offset)
    return np.asarray(value)


def _weights(raw: np.ndarray, dtype: str, shape: tuple[int, int]) -> np.ndarray:
    if dtype == "bf16":
        values = (raw.astype(np.uint32) << 16).view(np.float32)
    elif dtype == "f16":
        values = raw.view(np.float16).astype(np.float32)
    elif dtype == "f32":
        values = raw.astype(np.float32, copy=False)
    else:
        raise ModelFileError(f"unknown self-conditioning dtype {dtype!r}")
    if values.size != shape[0] * shape[1]:
        raise ModelFileError(f"self-conditioning weights have {values.size} values, expected {shape[0] * shape[1]}")
    return values.reshape(shape)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    # transformers "gelu_pytorch_tanh"
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps), rounded as ggml's CPU rms_norm rounds it (float squares summed in
    order in double, the reciprocal scale in float), so that the decoder input the engine's
    diffusion head builds in the graph and this one are the same bits."""
    x = np.asarray(x, dtype=np.float32)
    total = np.cumsum((x * x).astype(np.float64), axis=-1)[..., -1:]
    mean = (total / x.shape[-1]).astype(np.float32)
    return x * (np.float32(1.0) / np.sqrt(mean + np.float32(eps)))


_F32_TINY = np.float32(np.finfo(np.float32).tiny)  # the smallest normal float32


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


@dataclass
class SelfConditioning:
    pre_norm: np.ndarray  # [d]
    gate: np.ndarray  # [inter, d] (PyTorch Linear layout: out x in)
    up: np.ndarray  # [inter, d]
    down: np.ndarray  # [d, inter]
    eps: float
    embed_scale: float

    @classmethod
    def from_gguf(cls, source: str | Path | GgufHeader) -> SelfConditioning:
        header = source if isinstance(source, GgufHeader) else read_gguf_header(source)
        arch = header.architecture
        d = int(header.get(f"{arch}.embedding_length"))
        eps = float(header.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6))
        inter = int(header.get(PREFIX + "self_cond.intermediate_size"))
        dtype = str(header.get(PREFIX + "self_cond.dtype"))
        scale = header.get(PREFIX + "embed_scale")
        return cls(
            pre_norm=_array(header, PREFIX + "self_cond.pre_norm").astype(np.float32),
            gate=_weights(_array(header, PREFIX + "self_cond.gate"), dtype, (inter, d)),
            up=_weights(_array(header, PREFIX + "self_cond.up"), dtype, (inter, d)),
            down=_weights(_array(header, PREFIX + "self_cond.down"), dtype, (d, inter)),
            eps=eps,
            embed_scale=float(scale) if scale is not None else math.sqrt(d),
        )

    def signal(self, soft: np.ndarray) -> np.ndarray:
        """The MLP's output for soft embeddings `soft` [n, d]."""
        n = _rms(soft, self.eps) * self.pre_norm
        return (_gelu_tanh(n @ self.gate.T) * (n @ self.up.T)) @ self.down.T

    def soft_embeddings(self, embedding: np.ndarray, sc_logits: np.ndarray, top_k: int | None = None) -> np.ndarray:
        """softmax(sc_logits) @ E * scale. `top_k` keeps only each row's k most likely tokens
        (approximate: the error is bounded by the dropped probability mass times max|E|*scale)."""
        logits = np.asarray(sc_logits, dtype=np.float32)
        if top_k is None or top_k >= logits.shape[-1]:
            probs = _softmax(logits.copy())
            # subnormal probabilities (many tokens at a low temperature) cost the product a microcode
            # assist each on x86; as zeros the sum moves by < n_vocab * tiny (engine/patches/0010)
            probs[probs < _F32_TINY] = 0.0
            return (probs @ embedding.astype(np.float32, copy=False)) * self.embed_scale
        idx = np.argpartition(logits, -top_k, axis=-1)[:, -top_k:]
        full = _softmax(logits.copy())
        p = np.take_along_axis(full, idx, axis=-1)
        rows = embedding[idx].astype(np.float32, copy=False)  # [n, k, d]
        return np.einsum("nk,nkd->nd", p, rows) * self.embed_scale

    def decoder_inputs(
        self,
        embedding: np.ndarray,
        canvas: np.ndarray,
        sc_logits: np.ndarray | None = None,
        *,
        top_k: int | None = None,
    ) -> np.ndarray:
        """Decoder input embeddings [n, d] for canvas token ids [n] and the previous step's
        processed logits [n, vocab] (None on the first step). `embedding` is token_embd [vocab, d]."""
        ids = np.asarray(canvas, dtype=np.int64)
        x = embedding[ids].astype(np.float32) * self.embed_scale
        if sc_logits is not None:
            x = x + self.signal(self.soft_embeddings(embedding, sc_logits, top_k))
        # with no self-conditioning signal the MLP's output is exactly zero (gelu(0) = 0)
        return _rms(x, self.eps).astype(np.float32)


def layer_scalars(source: str | Path | GgufHeader) -> dict[str, np.ndarray]:
    """The encoder and decoder per-layer output scalars stored in the file."""
    header = source if isinstance(source, GgufHeader) else read_gguf_header(source)
    return {which: _array(header, PREFIX + f"layer_scalars.{which}").astype(np.float32)
            for which in ("encoder", "decoder")}
