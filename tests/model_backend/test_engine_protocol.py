"""model_backend.engine_protocol: every engine answers the vocabulary questions the rest of dgchat
asks (nothing outside model_backend reads an engine's llama.cpp model), with the model's real
values; model_backend.loader picks the engine class from the file's header."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
from fixtures.fake_openai import FakeServer, Reply

import dgchat.model_backend.engine as engine_module
from dgchat.model_backend.diffusion_gemma import DiffusionGemmaEngine
from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.engine_protocol import Engine
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.model_info import inspect_header
from dgchat.model_backend.params import DiffusionParams
from dgchat.remote import RemoteEngine
from dgchat.remote.client import RemoteClient
from dgchat.server.app import ServeConfig, ServerThread

TEXT = "Halt, traveller! None may pass the gate after dark."
MESSAGES = [{"role": "user", "content": "Who goes there?"}]


def _protocol_members() -> set[str]:
    names = {n for n in vars(Engine) if not n.startswith("_")}
    return names | set(Engine.__annotations__)


def _satisfies_protocol(engine: object) -> None:
    missing = sorted(n for n in _protocol_members() if not hasattr(engine, n))
    assert not missing, f"{type(engine).__name__} lacks {missing}"


def _bundled() -> Path:
    from dgchat.assets import bundled_model_path

    path = bundled_model_path()
    if path is None:
        pytest.skip("no bundled model in this installation")
    return path


@pytest.fixture(params=["llada", "bundled"])
def local(request: pytest.FixtureRequest):
    path = request.getfixturevalue("llada_gguf") if request.param == "llada" else _bundled()
    with load_engine(path, n_threads=1) as engine:
        yield engine


def test_a_local_engine_answers_with_its_model_s_vocabulary(local: DiffusionEngine) -> None:
    _satisfies_protocol(local)
    model = local.model  # the llama.cpp model: what the answers must agree with
    assert local.n_vocab == model.n_vocab > 0
    np.testing.assert_array_equal(local.eog_ids(), model.eog_ids())
    assert local.eog_ids().size and all(local.is_end(t) for t in local.eog_ids())
    assert local.eos == model.eos
    assert local.end_token == (model.eot if model.eot is not None else model.eos)
    assert local.added_bos == (model.bos if model.add_bos else None)
    tokens = local.tokenize(TEXT)
    assert tokens.dtype == np.int32 and tokens.size and local.detokenize(tokens) == TEXT
    assert b"".join(local.token_bytes(int(t)) for t in tokens).decode("utf-8") == TEXT
    # encode = tokenize with the model's BOS in front
    expected = tokens if local.added_bos is None else np.r_[np.int32(local.added_bos), tokens]
    np.testing.assert_array_equal(local.encode(TEXT), expected)
    control = local.control_tokens()
    assert control == tuple(sorted(control)) and not set(control) & set(int(t) for t in local.eog_ids())
    assert all(model.is_control(t) and local.is_special(t) for t in control)
    assert all(local.token_bytes(t) == b"" for t in control)
    for t in control[:8]:  # a control token's text is that token only when the caller opts in to markup
        piece = local.piece(t)
        if piece:
            assert local.tokenize(piece, special=True).tolist() == [t]
            assert t not in local.tokenize(piece).tolist()


def test_the_loader_picks_the_engine_class_from_the_header(llada_gguf: Path,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    with load_engine(llada_gguf, n_threads=1) as engine:
        assert type(engine) is DiffusionEngine
    pytest.importorskip("torch")
    from fixtures.dg_cache import converted

    dg = converted(tmp_path_factory.mktemp("dg-loader"), "sw8")
    with load_engine(dg, n_threads=1) as engine:
        assert type(engine) is DiffusionGemmaEngine
        _satisfies_protocol(engine)
        extra = engine.model.header.get("dgchat.diffusion.eos_token_ids") or []
        assert all(engine.is_end(t) for t in extra)  # the model's own end ids end an answer too
    header = read_gguf_header(dg)
    with pytest.raises(InvalidParameterError, match="load_engine"):  # the base class refuses a family it does not run
        DiffusionEngine.open(dg, header, inspect_header(header), n_threads=1)


def test_the_base_engine_knows_no_subclass() -> None:
    source = inspect.getsource(engine_module)
    assert "DiffusionGemmaEngine" not in source and "diffusion_gemma" not in source


def test_a_remote_engine_answers_with_what_the_server_said(llada_gguf: Path) -> None:
    """RemoteEngine on a scripted server that replays a real `dgchat serve`'s /v1/models answer
    and one of its canvas streams: its vocabulary answers are the local engine's where the server
    says them, and nothing it cannot know is made up."""
    params = DiffusionParams(seed=3, max_tokens=16, gen_length=16, steps=8)
    with load_engine(llada_gguf, n_threads=1) as local:
        with ServerThread(local, ServeConfig(port=0, quiet=True)) as st, RemoteClient(st.url) as client:
            models = client.get_json("/v1/models")
            with RemoteEngine.connect(st.url) as live:
                path, body = live.request_body(live.chat_prompt(MESSAGES), live.resolve(params))
            stream = list(client.stream(path, body))
        local_final = [e for e in local.generate(local.chat_prompt(MESSAGES), params) if isinstance(e, FinalEvent)][0]

        def handler(method: str, p: str, b) -> Reply:
            if p == "/v1/models":
                return Reply(body=models)
            if p == path:
                return Reply(events=[*stream, "[DONE]"])
            return Reply(404, {"detail": "Not Found"})

        with FakeServer(handler) as fake, RemoteEngine.connect(fake.url) as remote:
            _satisfies_protocol(remote)
            # what differs from a local engine, said by the engine (the app asks these, not served())
            assert remote.is_dgchat and not remote.text_only and not remote.counts_tokens
            assert (local.counts_tokens, local.text_only, local.unsupported(params)) == (True, False, [])
            assert remote.unsupported(DiffusionParams(sampler_on="host")) == ["sampler_on"]
            assert remote.n_vocab == local.n_vocab
            np.testing.assert_array_equal(remote.eog_ids(), np.sort(local.eog_ids()))
            assert remote.eos == int(np.min(local.eog_ids())) and remote.end_token == remote.eos
            assert remote.added_bos is None
            assert all(remote.is_end(t) for t in local.eog_ids())
            with pytest.raises(InvalidParameterError, match="tokenizer"):
                remote.tokenize(TEXT)
            final = [e for e in remote.generate(remote.chat_prompt(MESSAGES), params) if isinstance(e, FinalEvent)][0]
            np.testing.assert_array_equal(final.tokens, local_final.tokens)  # the same answer, replayed
            assert final.text == local_final.text
            # the canvases showed each answer token's text (a piece is a string: a token that holds part
            # of a UTF-8 character shows as U+FFFD, as the module docstring says)
            for t in {int(t) for t in final.tokens}:
                assert remote.piece(t) == local.piece(t)
                raw = local.token_bytes(t)
                if raw.decode("utf-8", "replace").encode("utf-8") == raw:
                    assert remote.token_bytes(t) == raw
            control = remote.control_tokens()
            assert all(remote.is_special(t) and not remote.is_end(t) for t in control)


def test_a_logits_source_keeps_each_sequence_under_the_driver_s_index() -> None:
    """driver.drive hands a source (index, request) pairs; the index is the sequence's cache: a
    sequence whose batch-mate finished keeps its own cached prefix."""
    from types import SimpleNamespace

    from dgchat.model_backend.logits_source import LlamaLogits
    from dgchat.model_backend.requests import LogitsRequest

    class Ctx:
        has_memory = True

        def __init__(self) -> None:
            self.decodes: list[np.ndarray] = []
            self.removed: list[tuple] = []

        def clear(self) -> None:
            pass

        def seq_rm(self, *args) -> None:
            self.removed.append(args)

        def decode_tokens(self, tokens, positions, *, seq_ids, outputs):
            self.decodes.append(np.asarray(seq_ids).copy())
            return np.zeros((len(outputs), 8), np.float32)

    ctx = Ctx()
    engine = SimpleNamespace(info=SimpleNamespace(has_kv_memory=True), step_check=None,
                             context_for=lambda *a, **k: ctx)
    source = LlamaLogits(engine, cache="prefix", n_seq=2)  # type: ignore[arg-type]
    sequence = np.arange(12, dtype=np.int32)
    later = LogitsRequest(sequence, np.array([9, 10]), (8, 12), False)  # a block's later step: block only
    (logits,) = source.answer([(1, later)])
    assert logits.shape == (2, 8)
    assert set(ctx.decodes[-1].tolist()) == {1} and ctx.decodes[-1].size == 4
    assert ctx.removed == [(1, 8)]  # after the step: the block's cells of sequence 1 only
