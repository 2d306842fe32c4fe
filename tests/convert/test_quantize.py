"""--quantize: llama.cpp's quantizer through the wrapper, after conversion or on an existing GGUF.

The logit-difference figure is rel = rms(logits_q - logits_f32) / rms(logits_f32) over a prompt +
masked canvas, exact f32 KV cache. Random tiny weights quantize worse than trained ones (no
outliers structure, every weight matters); measured here: Q8_0 ~0.017, Q4_K_M ~0.15."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dgchat.convert import convert
from dgchat.convert.errors import ConvertError
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.llamacpp import LlamaContext, LlamaModel
from fixtures import convert_cache as cc

pytest.importorskip("tokenizers")

BOUNDS = {"Q8_0": 0.05, "Q4_K_M": 0.3}
FILE_TYPES = {"Q8_0": 7, "Q4_K_M": 15}


def _logits(path: Path, tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    with LlamaModel(path, n_gpu_layers=0) as m:
        if tokens is None:
            tokens = np.concatenate([m.tokenize("Halt, traveller! None may pass.", add_special=False),
                                     np.full(16, m.mask, np.int32)])
        ctx = LlamaContext(m, n_ctx=256, max_tokens=256, exact_kv=True)
        ctx.set_causal(False)
        out = ctx.decode_tokens(tokens, np.arange(tokens.size)).copy()
        ctx.close()
    return tokens, out


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M"])
def test_quantize_after_conversion(base: Path, tmp_path: Path, qtype: str) -> None:
    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.events import FinalEvent
    from dgchat.model_backend.params import DiffusionParams

    ckpt = cc.checkpoint(base, "llada-q")
    seen: list[tuple[int, int, str]] = []
    written: list[int] = []
    res = convert(ckpt, tmp_path, quantize=qtype, progress=lambda d, t, n: written.append(d),
                  quantize_progress=lambda i, n, name: seen.append((i, n, name)))
    assert res.output == tmp_path / f"{ckpt.name}-{qtype.lower()}.gguf" and res.quantized == qtype
    assert sorted(p.name for p in tmp_path.iterdir()) == [res.output.name]  # the unquantized step is gone
    assert written and seen and seen[-1][0] == seen[-1][1] == res.n_tensors
    assert [i for i, _, _ in seen] == list(range(1, res.n_tensors + 1))
    h = read_gguf_header(res.output)
    ref_h = read_gguf_header(cc.converted(base, "llada-q"))
    assert h.get("general.file_type") == FILE_TYPES[qtype]
    assert h.tensors["blk.0.attn_norm.weight"].type_name == "F32"
    assert h.tensors["blk.0.ffn_up.weight"].type_name == {"Q8_0": "Q8_0", "Q4_K_M": "Q4_K"}[qtype]
    for key in ref_h.metadata:  # every key survives llama.cpp's quantizer (dgchat.*, tokenizer, diffusion)
        if key not in ("general.file_type", "general.quantization_version", "general.name"):
            assert h.get(key) == ref_h.get(key), key
    assert res.n_bytes == res.output.stat().st_size < ref_h.path.stat().st_size
    tokens, ref = _logits(ref_h.path)
    _, out = _logits(res.output, tokens)
    rel = float(np.sqrt(((out - ref) ** 2).mean() / (ref ** 2).mean()))
    assert rel < BOUNDS[qtype], rel
    with load_engine(res.output, n_threads=2) as engine:
        final = [e for e in engine.generate(engine.encode("Halt!"), DiffusionParams(gen_length=16, steps=8, seed=3))
                 if isinstance(e, FinalEvent)][0]
        assert final.stats.steps == 8 and final.tokens.size > 0


def test_quantize_existing_gguf_and_cache_capable_in_one_go(base: Path, tmp_path: Path) -> None:
    src = cc.converted(base, "dream")
    res = convert(src, tmp_path, quantize="q8_0")  # a dgchat file: quantized as it is
    assert res.output == tmp_path / f"{src.stem}.q8_0.gguf" and res.gguf_arch == "dream"
    res2 = convert(src, tmp_path, quantize="Q8_0", cache_capable=True)  # remapped, then quantized
    assert res2.output.name == f"{src.stem}.kvcache.q8_0.gguf" and res2.gguf_arch == "qwen2"
    h = read_gguf_header(res2.output)
    assert h.get("qwen2.attention.causal") is False and h.get("dgchat.preset") == "dream"
    assert h.get("diffusion.shift_logits") is True and h.get("general.file_type") == 7
    tokens, a = _logits(res.output)
    _, b = _logits(res2.output, tokens)
    assert np.abs(a - b).max() < 1e-3  # same quantized weights, two graphs of the same function
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([res.output.name, res2.output.name])


def test_failed_or_interrupted_quantization_leaves_nothing(base: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from dgchat.model_backend import llamacpp
    from dgchat.model_backend.errors import EngineError

    ckpt = cc.checkpoint(base, "llada")
    for exc in (EngineError("llama_model_quantize: failed to quantize: simulated"), KeyboardInterrupt()):
        def broken(src, dst, ftype, **kw):
            Path(dst).write_bytes(b"GGUF partial")  # llama.cpp had started writing
            raise exc

        monkeypatch.setattr(llamacpp, "quantize_model", broken)
        with pytest.raises((ConvertError, KeyboardInterrupt)) as info:
            convert(ckpt, tmp_path / "out.gguf", quantize="Q4_K_M")
        if isinstance(exc, EngineError):
            assert "could not quantize" in str(info.value) and "simulated" in str(info.value)
        assert list(tmp_path.iterdir()) == []


def test_quantize_checks_space_first(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    import dgchat.convert.writer as writer

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(writer.shutil, "disk_usage", lambda _p: usage._replace(free=10_000))
    with pytest.raises(ConvertError, match="not enough disk space"):
        convert(cc.converted(base, "llada"), tmp_path / "q.gguf", quantize="Q8_0")
    assert list(tmp_path.iterdir()) == []


def test_unknown_quantization_type(base: Path) -> None:
    with pytest.raises(ConvertError, match="unknown quantization type 'Q7_Z'; choose one of: Q8_0"):
        convert(cc.converted(base, "llada"), quantize="Q7_Z")
