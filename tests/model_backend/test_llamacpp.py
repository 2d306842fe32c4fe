"""The llama.cpp wrapper against a numpy forward pass and the tokenizers library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fixtures.gguf_models import TinySpec, build_vocab, reference_logits
from dgchat.model_backend.llamacpp import LlamaContext, LlamaModel

SPECS = {"llada": TinySpec(arch="llada"), "dream": TinySpec(arch="dream"), "llama": TinySpec(arch="llama")}


@pytest.fixture(scope="module")
def models(llada_gguf: Path, dream_gguf: Path, llama_nc_gguf: Path):
    loaded = {"llada": LlamaModel(llada_gguf), "dream": LlamaModel(dream_gguf), "llama": LlamaModel(llama_nc_gguf)}
    yield loaded
    for m in loaded.values():
        m.close()


@pytest.mark.parametrize("arch", ["llada", "dream", "llama"])
def test_logits_match_numpy_forward(models, arch: str) -> None:
    """Non-causal logits equal an independent numpy implementation of the architecture.
    f32 KV + no flash attention: 1e-4 absolute (logits are O(10)); the default f16 KV cache: 1e-2."""
    m = models[arch]
    tokens = np.concatenate([m.tokenize("Good morrow, friend."), np.full(12, m.mask, np.int32)])
    ref = reference_logits(SPECS[arch], tokens)
    for exact, tol in ((True, 1e-4), (False, 1e-2)):
        ctx = LlamaContext(m, n_ctx=256, max_tokens=256, exact_kv=exact)
        ctx.set_causal(False)
        out = ctx.decode_tokens(tokens, np.arange(tokens.size))
        assert out.shape == ref.shape
        assert np.abs(out - ref).max() < tol, (arch, exact, np.abs(out - ref).max())
        ctx.close()


@pytest.mark.parametrize("arch", ["llada", "llama"])
def test_only_requested_rows(models, arch: str) -> None:
    m = models[arch]
    tokens = np.concatenate([m.tokenize("Halt!"), np.full(10, m.mask, np.int32)])
    ctx = LlamaContext(m, n_ctx=128, max_tokens=128, exact_kv=True)
    ctx.set_causal(False)
    full = ctx.decode_tokens(tokens, np.arange(tokens.size)).copy()
    ctx.clear()
    rows = np.array([2, 5, 6, 7])
    part = ctx.decode_tokens(tokens, np.arange(tokens.size), outputs=rows)
    np.testing.assert_allclose(part, full[rows], atol=1e-5)
    if arch == "llama":  # a context with memory computes only the flagged rows
        assert ctx.has_memory
    else:
        assert not ctx.has_memory


def test_kv_removal_and_prefix_decode(models) -> None:
    """On an architecture with a KV cache: prefill a prompt, decode a canvas against it, drop the
    canvas cells, decode again: identical logits; and equal to one full pass."""
    m = models["llama"]
    prompt = m.tokenize("None may pass the gate after dark.")
    canvas = np.full(8, m.mask, np.int32)
    ctx = LlamaContext(m, n_ctx=128, max_tokens=64, exact_kv=True)
    ctx.set_causal(False)
    ctx.decode_tokens(prompt, np.arange(prompt.size), outputs=[])
    pos = np.arange(prompt.size, prompt.size + canvas.size)
    a = ctx.decode_tokens(canvas, pos).copy()
    assert ctx.seq_pos_max(0) == pos[-1]
    ctx.seq_rm(0, int(pos[0]))
    assert ctx.seq_pos_max(0) == prompt.size - 1
    b = ctx.decode_tokens(canvas, pos).copy()
    np.testing.assert_array_equal(a, b)
    # the cached prompt never saw the canvas: compare with the numpy forward under that visibility
    # (prompt rows see the prompt only, canvas rows see everything)
    n, T = prompt.size, prompt.size + canvas.size
    visible = np.ones((T, T), dtype=bool)
    visible[:n, n:] = False
    ref = reference_logits(SPECS["llama"], np.concatenate([prompt, canvas]), visible=visible)
    assert np.abs(a - ref[n:]).max() < 1e-4


def test_embeddings_input_equals_tokens(models) -> None:
    m = models["llama"]
    tokens = np.concatenate([m.tokenize("The quick brown fox"), np.full(6, m.mask, np.int32)])
    emb = m.embedding_matrix()[tokens]
    ctx = LlamaContext(m, n_ctx=128, max_tokens=64, exact_kv=True)
    ctx.set_causal(False)
    a = ctx.decode_tokens(tokens, np.arange(tokens.size)).copy()
    ctx.clear()
    b = ctx.decode_embeddings(emb.astype(np.float32), np.arange(tokens.size))
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_tokenizer_matches_tokenizers_library(models) -> None:
    from tokenizers import Tokenizer

    hf = Tokenizer.from_str(build_vocab().tokenizer_json)
    m = models["llada"]
    samples = ["Halt, traveller! None may pass.", "  spaces   and\ttabs\n", "naïve café 東京 😀", "x=1+2*3",
               "<|im_start|>user\nhi<|im_end|>"]
    for text in samples:
        ours = m.tokenize(text, add_special=False, parse_special=True).tolist()
        assert ours == hf.encode(text).ids, text
        assert m.detokenize(ours, unparse_special=True) == text
    assert m.mask == build_vocab().mask and m.bos == build_vocab().bos
    assert m.is_eog(build_vocab().eos) and m.is_eog(build_vocab().eot)
    assert not m.is_eog(m.tokenize("a", add_special=False)[0])


def test_llama_log_is_captured(llada_gguf: Path) -> None:
    code = (
        "from dgchat.model_backend.llamacpp import LlamaModel, recent_log; import sys; "
        f"m = LlamaModel({str(llada_gguf)!r}); print(len(recent_log(100)))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "llama_model_loader" not in res.stderr  # silent unless --verbose
    assert int(res.stdout.strip()) > 10  # but kept for error messages


def test_abort_flag_stops_a_decode_and_clears(models) -> None:
    """The cancel flag is polled by llama.cpp itself between graph nodes: a decode started with the
    flag set aborts (GenerationCancelled) and leaves the context usable once the flag is cleared."""
    from dgchat.model_backend.errors import GenerationCancelled

    m = models["llama"]
    tokens = np.concatenate([m.tokenize("Halt!"), np.full(40, m.mask, np.int32)])
    ctx = LlamaContext(m, n_ctx=128, max_tokens=128)
    ctx.set_causal(False)
    ctx.cancel_event.set()
    with pytest.raises(GenerationCancelled):
        ctx.decode_tokens(tokens, np.arange(tokens.size))
    assert not ctx.cancel_event.is_set()  # the wrapper clears it after reporting
    ctx.clear()
    out = ctx.decode_tokens(tokens, np.arange(tokens.size))
    assert out.shape == (tokens.size, m.n_vocab) and np.isfinite(out).all()


def test_the_vocabulary_after_close_is_an_error_not_a_crash(llada_gguf: Path) -> None:
    """llama.cpp frees the vocabulary with the model: a piece asked for after close() would go
    through a stale pointer (a segfault seen in a test); it is an EngineError instead."""
    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.errors import EngineError

    with load_engine(llada_gguf, n_threads=1) as engine:
        assert engine.model.token_piece(5)
    for call in (lambda: engine.model.token_piece(6), lambda: engine.model.tokenize("hi"),
                 lambda: engine.model.is_eog(1)):
        with pytest.raises(EngineError, match="closed"):
            call()


def test_no_extra_weight_buffers_on_an_amx_cpu(monkeypatch) -> None:
    """Built by GCC 12, ggml's AMX weight buffer segfaults on the first decode of a q8_0 model
    (ggml-org/llama.cpp#20824): on an AMX CPU only an engine with patch 0009 (level 4) uses it."""
    from dgchat.model_backend import llamacpp
    from dgchat.model_backend.llamacpp import build_info, library

    monkeypatch.delenv("DGCHAT_CPU_EXTRA_BUFFERS", raising=False)
    amx = b"CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | "
    plain = b"CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 | "
    monkeypatch.setattr(library.llama_cpp, "llama_print_system_info", lambda: amx)
    for level, extra in ((0, False), (3, False), (4, True)):
        monkeypatch.setattr(build_info, "engine_info", lambda level=level: llamacpp.EngineInfo("?", False, level))
        assert llamacpp.cpu_uses_amx() and llamacpp.use_extra_buffer_types() is extra, level
    monkeypatch.setattr(build_info, "engine_info", lambda: llamacpp.EngineInfo("?", False, 0))
    monkeypatch.setenv("DGCHAT_CPU_EXTRA_BUFFERS", "1")
    assert llamacpp.use_extra_buffer_types()
    monkeypatch.delenv("DGCHAT_CPU_EXTRA_BUFFERS")
    monkeypatch.setattr(library.llama_cpp, "llama_print_system_info", lambda: plain)
    assert not llamacpp.cpu_uses_amx() and llamacpp.use_extra_buffer_types()
    monkeypatch.setenv("DGCHAT_CPU_EXTRA_BUFFERS", "0")
    assert not llamacpp.use_extra_buffer_types()


def test_a_q8_0_model_decodes_on_this_cpu() -> None:
    """The bundled q8_0 model answers in a child process, with the extra CPU buffers this engine
    allows (on an AMX CPU, before patch 0009, this child died with SIGSEGV; a crash here fails the
    test instead of the whole run)."""
    asset = Path(__file__).resolve().parents[2] / "assets" / "dgchat-tiny-plays.gguf"
    run = subprocess.run([sys.executable, "-m", "dgchat", "generate", "-m", str(asset), "-p", "Who goes there?",
                          "--seed", "1", "--max-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF symbol scopes")
def test_engine_library_binds_the_one_cpp_runtime() -> None:
    """After the engine library loads, libstdc++ is in the process's global scope, so no llama.cpp
    library can bind another library's copy of libstdc++ code (an H200 CUDA build's libggml-cuda
    carried some: there every model load after `import numpy` segfaulted).
    Checked in a fresh interpreter that imports numpy first, as the app and the tests do."""
    code = (
        "import ctypes, numpy\n"
        "sym = '_ZNSo9_M_insertIlEERSoT_'  # std::ostream::_M_insert<long>\n"
        "before = hasattr(ctypes.CDLL(None), sym)\n"
        "import dgchat.model_backend.llamacpp\n"
        "print(before, hasattr(ctypes.CDLL(None), sym))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = out.stdout.split()
    assert after == "True", f"libstdc++ not in the global scope (before the import: {before})"
