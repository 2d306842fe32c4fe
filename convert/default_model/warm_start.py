"""Start a training run from a shipped default-model GGUF, with a grown vocabulary (issue 13).

The v2 default model continues from v1's weights instead of starting over: v1 took ~90 minutes
of this project's 2-core budget, and a second run from scratch would only reach where v1 already
is. v2's tokenizer is the same byte-level BPE trained on the same plays with a larger entry
count; BPE learns its merges in frequency order, so the first 8,192 entries and merges of the
16,384-entry tokenizer are v1's, id for id (`check_vocab_prefix` insists on it). Tokens v1 has
are copied; a grown token starts as the mean of the two pieces its merge joins (the merges are
walked in order, so both pieces exist by then), which keeps its logit close to what v1 gave the
same text spelled in pieces instead of a random guess.

The GGUF holds what the trainer needs: the tensors (q8_0/f16/f32, dequantized here), the per-layer
scalars and the self-conditioning MLP (metadata written by convert/families/diffusion_gemma.py).
Quantized weights are not v1's exact float weights; the card measures what that costs (the warm
started model's held-out losses at step 0 against v1's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dgchat.convert.families.diffusion_gemma import _LAYER_MAP, DEC, ENC, P
from dgchat.model_backend.errors import DgchatError


def _field_value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise DgchatError(f"warm start: the GGUF has no {key}")
    return [field.parts[i] for i in field.data]


def _strings(reader: Any, key: str) -> list[str]:
    return [bytes(p).decode("utf-8") for p in _field_value(reader, key)]


def _floats(reader: Any, key: str, dtype_key: str | None = None) -> np.ndarray:
    parts = _field_value(reader, key)
    arr = np.concatenate([np.asarray(p).reshape(-1) for p in parts])
    if dtype_key is not None:
        dtype = bytes(_field_value(reader, dtype_key)[0]).decode()
        if dtype == "bf16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        if dtype == "f16":
            return arr.astype(np.uint16).view(np.float16).astype(np.float32)
    return arr.astype(np.float32)


def check_vocab_prefix(gguf_tokens: list[str], gguf_merges: list[str], tokenizer_json: dict[str, Any]) -> None:
    """The new tokenizer must extend the GGUF's: same ids, same merges first."""
    vocab = dict(tokenizer_json["model"]["vocab"])
    for t in tokenizer_json.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    for i, tok in enumerate(gguf_tokens):
        if vocab.get(tok) != i:
            raise DgchatError(f"warm start: token {i} ({tok!r}) has id {vocab.get(tok)} in the new tokenizer;"
                              " the new vocabulary must extend the old one")
    merges = [" ".join(m) if isinstance(m, list) else m for m in tokenizer_json["model"]["merges"]]
    if merges[:len(gguf_merges)] != gguf_merges:
        raise DgchatError("warm start: the new tokenizer's first merges differ from the GGUF's")


def grown_embeddings(old: np.ndarray, tokenizer_json: dict[str, Any], vocab_size: int) -> np.ndarray:
    """Rows for the grown vocabulary: old rows kept, each new token = mean of its merge's two pieces."""
    vocab = dict(tokenizer_json["model"]["vocab"])
    emb = np.zeros((vocab_size, old.shape[1]), np.float32)
    emb[:old.shape[0]] = old
    done = np.zeros(vocab_size, bool)
    done[:old.shape[0]] = True
    for m in tokenizer_json["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ")
        new = vocab.get(a + b)
        if new is None or done[new]:
            continue
        ia, ib = vocab[a], vocab[b]
        if not (done[ia] and done[ib]):
            raise DgchatError(f"warm start: merge {a!r} {b!r} uses a piece not yet initialised")
        emb[new] = (emb[ia] + emb[ib]) / 2
        done[new] = True
    missing = np.flatnonzero(~done)
    if missing.size:  # tokens no merge makes (none for a BPE vocabulary): the mean row
        emb[missing] = old.mean(axis=0)
    return emb


def _open_checked(gguf_path: Path, tokenizer_path: Path) -> tuple[Any, dict[str, Any]]:
    """(GGUF reader, tokenizer.json) once the tokenizer is known to extend the GGUF's vocabulary."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    tok_json = json.loads(Path(tokenizer_path).read_text(encoding="utf-8"))
    check_vocab_prefix(_strings(reader, "tokenizer.ggml.tokens"), _strings(reader, "tokenizer.ggml.merges"), tok_json)
    return reader, tok_json


def embedding_from_gguf(gguf_path: Path, tokenizer_path: Path, vocab_size: int) -> np.ndarray:
    """A default-model GGUF's token embedding (dequantized, f32) for `tokenizer_path`'s vocabulary,
    grown as in `load_from_gguf` where that vocabulary extends the GGUF's."""
    from gguf.quants import dequantize

    reader, tok_json = _open_checked(gguf_path, tokenizer_path)
    tensor = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if tensor is None:
        raise DgchatError(f"{gguf_path.name} has no token_embd.weight")
    old = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    return grown_embeddings(old, tok_json, vocab_size)


def load_from_gguf(model: Any, gguf_path: Path, tokenizer_path: Path) -> dict[str, Any]:
    """Fill a freshly built DiffusionGemmaForBlockDiffusion from a default-model GGUF."""
    import torch
    from gguf.quants import dequantize

    reader, tok_json = _open_checked(gguf_path, tokenizer_path)
    tensors = {t.name: dequantize(t.data, t.tensor_type).astype(np.float32) for t in reader.tensors}

    params = dict(model.named_parameters(remove_duplicate=False))
    weights = {**dict(model.named_buffers(remove_duplicate=False)), **params}  # layer scalars are buffers
    filled: set[str] = set()

    def put(name: str, value: np.ndarray) -> None:
        p = weights[name]
        value = np.asarray(value, np.float32).reshape(p.shape)
        with torch.no_grad():
            p.copy_(torch.from_numpy(value))
        filled.add(name)

    vocab_size = params[DEC + "embed_tokens.weight"].shape[0]
    put(DEC + "embed_tokens.weight", grown_embeddings(tensors["token_embd.weight"], tok_json, vocab_size))
    put(DEC + "norm.weight", tensors["output_norm.weight"])
    n_layer = model.config.text_config.num_hidden_layers
    enc_scalars = _floats(reader, P + "layer_scalars.encoder")
    dec_scalars = _floats(reader, P + "layer_scalars.decoder")
    for il in range(n_layer):
        for src, dst in _LAYER_MAP.items():
            key = f"blk.{il}.{dst}"
            name = f"{DEC}layers.{il}.{src}"
            if key not in tensors:
                if name in params:
                    raise DgchatError(f"warm start: the GGUF has no {key}")
                continue
            put(name, tensors[key])
        put(f"{DEC}layers.{il}.layer_scalar", dec_scalars[il:il + 1])
        put(f"{ENC}layers.{il}.layer_scalar", enc_scalars[il:il + 1])
    put(DEC + "self_conditioning.pre_norm.weight", _floats(reader, P + "self_cond.pre_norm"))
    for part in ("gate", "up", "down"):
        put(f"{DEC}self_conditioning.{part}_proj.weight",
            _floats(reader, P + f"self_cond.{part}", dtype_key=P + "self_cond.dtype"))

    # Encoder weights are tied to the decoder's; count a parameter filled through its twin.
    ptr_filled = {weights[n].data_ptr() for n in filled}
    left = [n for n, p in params.items() if n not in filled and p.data_ptr() not in ptr_filled
            and "vision" not in n]
    if left:
        raise DgchatError(f"warm start: {len(left)} weights not in the GGUF, e.g. {left[:3]}")
    old_vocab = tensors["token_embd.weight"].shape[0]
    return {"gguf": gguf_path.name, "old_vocab": int(old_vocab), "new_vocab": int(vocab_size),
            "grown_tokens": int(vocab_size - old_vocab)}
