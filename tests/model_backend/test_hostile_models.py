"""Hostile model files (issue 14): every value llama.cpp or dgchat reads from a GGUF is checked first.

Each crafted file is a real GGUF from the fixture builders with one value changed (rewritten by the
fuzzer's GGUF serializer). The answers are checked where users meet them: `dgchat generate` and
`dgchat models import` exit 2 with one `dgchat: error:` line, quickly, and a worker process that
loads the file and generates (as the fuzzer does) refuses it instead of dying with SIGABRT.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.gguf_models import TinySpec, write_tiny_gguf
from fuzz.gguf_mutate import BOOL, F32, I32, KV, STR, U32, parse, serialize

from dgchat.model_backend.errors import InvalidParameterError, ModelFileError, UnsupportedModelError
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.model_info import inspect_header
from dgchat.model_backend.params import MAX_GEN_LENGTH, MAX_STEPS, DiffusionParams


def with_value(src: Path, dest: Path, key: str, vtype: int | None, value: object = None) -> Path:
    """`src` with metadata `key` set to `value` of GGUF type `vtype` (None: the key removed)."""
    g = parse(src.read_bytes())
    g.kvs = [kv for kv in g.kvs if kv.key != key]
    if vtype is not None:
        g.kvs.append(KV(key, vtype, value))
    dest.write_bytes(serialize(g))
    return dest


def dgchat(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgchat", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "GGML_NO_BACKTRACE": "1", **(env or {})})


def one_line_error(res: subprocess.CompletedProcess, pattern: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    errors = [line for line in res.stderr.splitlines() if line.startswith("dgchat: error:")]
    assert len(errors) == 1 and pattern in errors[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr


# -- the findings, through the CLI ---------------------------------------------------------------------
def test_negative_norm_epsilon_is_refused_before_llama_cpp_asserts(tmp_path: Path) -> None:
    """Found by the issue's fuzzing: llama.cpp aborted (GGML_ASSERT(eps >= 0.0f), SIGABRT) at the first
    decode; now every entry point answers with one line."""
    path = write_tiny_gguf(tmp_path / "neg-eps.gguf", TinySpec(arch="llada", eps=-1.0))
    started = time.monotonic()
    res = dgchat("generate", "-m", str(path), "-p", "hi", "--gen-length", "16", "--steps", "4")
    one_line_error(res, "llada.attention.layer_norm_rms_epsilon = -1.0 is outside (0, 1]")
    assert time.monotonic() - started < 15  # includes starting Python; the check itself is milliseconds
    one_line_error(dgchat("models", "import", str(path)), "layer_norm_rms_epsilon")


@pytest.mark.parametrize("key, vtype, value, pattern", [
    ("dgchat.steps", U32, 4_000_000_000, "dgchat.steps = 4000000000 is out of range (--steps must be at most"),
    ("dgchat.steps", STR, "lots", "dgchat.steps = 'lots' is not a valid steps"),
    ("llada.context_length", STR, "abc", "llada.context_length = 'abc' is not an integer"),
    ("dgchat.gen_length", U32, 1 << 30, "dgchat.gen_length = 1073741824 is out of range"),
    ("dgchat.temperature", F32, float("nan"), "dgchat.temperature = nan is out of range"),
])
def test_sampler_defaults_and_sizes_from_the_file_are_typed_and_bounded(tmp_path: Path, llada_gguf: Path, key: str,
                                                                       vtype: int, value: object, pattern: str) -> None:
    """`dgchat.steps = 4e9` ran for minutes (or a MemoryError after 8 s at 2.7 GB: one schedule entry per
    step); a string value gave a traceback; `models import` accepted all of them."""
    path = with_value(llada_gguf, tmp_path / "bad.gguf", key, vtype, value)
    started = time.monotonic()
    one_line_error(dgchat("generate", "-m", str(path), "-p", "hi", "--gen-length", "16"), pattern)
    one_line_error(dgchat("generate", "-m", str(path), "-p", "hi"), pattern)  # the file's own defaults
    one_line_error(dgchat("models", "import", str(path)), pattern)
    assert time.monotonic() - started < 30  # three Python starts


# -- every hyper-parameter llama.cpp asserts on ---------------------------------------------------------
ASSERTED = [  # (base, key, type, value, what the one-line error names)
    ("llada", "llada.attention.layer_norm_rms_epsilon", F32, float("nan"), "layer_norm_rms_epsilon"),
    ("llada", "llada.attention.head_count_kv", U32, 3, "must divide attention.head_count"),
    ("llada", "llada.attention.head_count", U32, 0, "attention.head_count = 0"),
    ("llada", "llada.block_count", U32, 0, "block_count = 0"),
    ("llada", "llada.block_count", U32, 513, "block_count = 513"),
    ("llada", "llada.rope.dimension_count", U32, 8, "must equal the head size"),
    ("llada", "llada.rope.freq_base", F32, -1.0, "rope.freq_base"),
    ("llada", "llada.rope.scaling.type", STR, "bogus", "rope.scaling.type"),
    ("llada", "llada.expert_count", U32, 2000, "expert_count = 2000"),
    ("llada", "llada.expert_used_count", U32, 2, "exceeds expert_count"),
    ("llada", "llada.context_length", U32, 0, "context_length = 0"),
    ("llada", "llada.embedding_length", I32, -64, "embedding_length = -64"),
    ("llada", "llada.nextn_predict_layers", U32, 1, "nextn_predict_layers"),
    ("llada", "tokenizer.ggml.mask_token_id", U32, 99_999, "mask_token_id = 99999 is outside"),
    ("llada", "tokenizer.ggml.bos_token_id", U32, 1 << 31, "bos_token_id"),
    ("llada", "tokenizer.ggml.model", STR, "none", "tokenizer.ggml.model = 'none'"),
    ("llada", "tokenizer.ggml.model", STR, "llama", "byte token"),  # SentencePiece without byte tokens
    ("llada", "diffusion.shift_logits", U32, 7, "diffusion.shift_logits"),
    ("llama-nc", "dgchat.preset", STR, "gpt", "dgchat.preset"),
    ("llada", "tokenizer.chat_template", U32, 5, "tokenizer.chat_template = 5 is not a string"),
    ("llama-nc", "llama.attention.sliding_window_pattern", BOOL, True, "sliding_window_pattern"),
    ("llama-nc", "general.architecture", STR, "mamba", "unknown model architecture"),
]


@pytest.fixture(scope="module")
def crafted(tmp_path_factory: pytest.TempPathFactory, llada_gguf: Path, llama_nc_gguf: Path) -> list[tuple[Path, str]]:
    folder = tmp_path_factory.mktemp("crafted")
    bases = {"llada": llada_gguf, "llama-nc": llama_nc_gguf}
    out = [(with_value(bases[b], folder / f"{i}.gguf", k, t, v), p) for i, (b, k, t, v, p) in enumerate(ASSERTED)]
    # two tokens with the same text: llama.cpp GGML_ASSERTs its text -> id map has one entry per token
    g = parse(llada_gguf.read_bytes())
    tokens = next(kv for kv in g.kvs if kv.key == "tokenizer.ggml.tokens")
    items = list(tokens.value[1])
    items[200] = items[100]
    tokens.value, tokens.raw = (tokens.value[0], items), None
    dup = folder / "dup-token.gguf"
    dup.write_bytes(serialize(g))
    out.append((dup, "repeats an earlier token"))
    # a byte-type token whose text is not <0xNN>: token_to_piece throws through the C API
    g = parse(llada_gguf.read_bytes())
    types = next(kv for kv in g.kvs if kv.key == "tokenizer.ggml.token_type")
    items = list(types.value[1])
    items[50] = 6
    types.value, types.raw = (types.value[0], items), None
    byte = folder / "byte-type.gguf"
    byte.write_bytes(serialize(g))
    out.append((byte, "marks token 50 as a byte"))
    return out


def test_each_asserted_value_is_refused_with_one_line(crafted: list[tuple[Path, str]]) -> None:
    for path, pattern in crafted:
        with pytest.raises((ModelFileError, UnsupportedModelError)) as info:
            inspect_header(read_gguf_header(path))
        message = str(info.value)
        assert pattern in message and "\n" not in message, (path.name, message)


def test_llama_cpp_never_sees_them(crafted: list[tuple[Path, str]], tmp_path: Path) -> None:
    """Load and generate in a worker process, as the fuzzer does: a value that slipped through would
    abort it (counted as a crash) instead of coming back as a refusal."""
    from fuzz.run import Worker, worker_env

    worker = Worker("gguf", worker_env(tmp_path / "home"))
    try:
        for path, pattern in crafted:
            how, reply = worker.ask({"path": str(path)}, timeout=60)
            assert how == "answer" and reply["status"] == "refused", (path.name, how, reply)
            assert pattern in reply["detail"], (path.name, reply)
    finally:
        worker.stop()


def test_the_bundled_model_and_fixtures_pass(llada_gguf: Path, dream_gguf: Path, llama_nc_gguf: Path) -> None:
    from dgchat.assets import bundled_model_path

    for path in (llada_gguf, dream_gguf, llama_nc_gguf, bundled_model_path()):
        info = inspect_header(read_gguf_header(path))
        assert info.defaults


def test_gemma4_sliding_window_and_rotation(tmp_path: Path) -> None:
    from dgchat.assets import bundled_model_path

    bundled = Path(bundled_model_path())
    path = with_value(bundled, tmp_path / "pad.gguf", "dgchat.diffusion.pad_bias", F32, -500.0)
    with pytest.raises(ModelFileError, match="pad_bias = -500.0 is out of range"):
        inspect_header(read_gguf_header(path))
    path = with_value(bundled, tmp_path / "pad.gguf", "dgchat.diffusion.pad_bias", STR, "low")
    with pytest.raises(ModelFileError, match="is not a valid pad_bias"):
        inspect_header(read_gguf_header(path))
    for key, value, pattern in (("gemma4.attention.sliding_window", 0, "sliding_window = 0"),
                                ("gemma4.rope.dimension_count", 0, "must equal the head size (64)"),
                                ("dgchat.diffusion_gemma.self_cond.intermediate_size", 7, "must hold")):
        path = with_value(bundled, tmp_path / "dg.gguf", key, U32, value)
        with pytest.raises(ModelFileError, match=pattern.replace("(", r"\(").replace(")", r"\)")):
            inspect_header(read_gguf_header(path))


def test_duplicate_keys_are_refused(tmp_path: Path, llada_gguf: Path) -> None:
    g = parse(llada_gguf.read_bytes())
    g.kvs.append(KV("llada.context_length", U32, 1))
    path = tmp_path / "dup.gguf"
    path.write_bytes(serialize(g))
    with pytest.raises(ModelFileError, match="appears twice"):
        read_gguf_header(path)


# -- DiffusionParams: the bounds the CLI, the app and the API share ------------------------------------
@pytest.mark.parametrize("field, value, pattern", [
    ("steps", MAX_STEPS + 1, f"--steps must be at most {MAX_STEPS}"),
    ("steps", 0, "--steps must be a positive integer"),
    ("steps", "lots", "--steps must be a positive integer (got 'lots')"),
    ("steps", 2.5, "--steps must be a positive integer"),
    ("gen_length", MAX_GEN_LENGTH + 1, "--gen-length must be at most"),
    ("block_length", 10**9, "--block-length must be at most"),
    ("max_tokens", 1 << 40, "--max-tokens must be at most"),
    ("top_k", -1, "--top-k must be an integer >= 0"),
    ("top_k", True, "--top-k must be an integer >= 0"),
    ("top_k", 1 << 40, "--top-k must be at most"),
    ("temperature", float("nan"), "--temperature must be a finite number"),
    ("temperature", float("inf"), "--temperature must be a finite number"),
    ("temperature", 1e9, "--temperature must be at most"),
    ("top_p", "0.5", "--top-p must be a finite number"),
    ("cfg_scale", float("nan"), "--cfg-scale must be a finite number"),
    ("seed", -1, "--seed must be an integer >= 0"),
    ("seed", 1 << 64, "--seed must be at most"),
    ("stability_threshold", 10**9, "--stability-threshold must be at most"),
    ("logit_bias", ((1, float("nan")),), "logit_bias values must be numbers in [-100, 100]"),
    ("pad_bias", -101.0, "--pad-bias must be at most 100"),
    ("pad_bias", "low", "--pad-bias must be a finite number"),
    ("logit_bias", tuple((i, 1.0) for i in range(70_000)), "logit_bias has 70000 entries"),
])
def test_params_validate_names_the_field(field: str, value: object, pattern: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        DiffusionParams(**{field: value}).validate()
    assert pattern in str(info.value)


def test_params_at_the_bounds_are_valid() -> None:
    DiffusionParams(steps=MAX_STEPS, gen_length=MAX_GEN_LENGTH, block_length=MAX_GEN_LENGTH, top_k=0, seed=0,
                    temperature=0.0).validate()


async def test_the_app_answers_a_hostile_model_with_a_dialog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the app the negative epsilon once killed the whole TUI at the first answer."""
    from fixtures.app_harness import SIZE, make_app, setup_home, wait_for

    from dgchat.app.error_modal import ErrorModal

    setup_home(tmp_path, monkeypatch)
    path = write_tiny_gguf(tmp_path / "neg-eps.gguf", TinySpec(arch="llada", eps=-1.0))
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal) and bool(app.screen.query("#error-message")),
                       what="the load error")
        text = str(app.screen.query_one("#error-message").render())
        assert "layer_norm_rms_epsilon = -1.0 is outside (0, 1]" in text
        assert app.is_running and app.session.engine is None


def test_a_default_canvas_cannot_ask_for_gigabytes_of_logits(tmp_path: Path) -> None:
    """Every step holds canvas x vocabulary logits: a file's default canvas may not make that exceed
    2 GiB (the user can still ask for a longer canvas with --gen-length)."""
    path = write_tiny_gguf(tmp_path / "wide.gguf", TinySpec(arch="llada", extra_keys={"dgchat.gen_length": 8192}),
                           n_vocab=70_000)
    with pytest.raises(ModelFileError, match="needs more than 2 GiB of logits a step"):
        inspect_header(read_gguf_header(path))
    ok = write_tiny_gguf(tmp_path / "ok.gguf", TinySpec(arch="llada", extra_keys={"dgchat.gen_length": 4096}),
                         n_vocab=70_000)
    assert inspect_header(read_gguf_header(ok)).defaults["gen_length"] == 4096
