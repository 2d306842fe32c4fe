"""dgchat.remote reads OpenAI's wire format as vLLM's OpenAI-compatible server documents it.

The shapes below are written from vLLM's own response models (github.com/vllm-project/vllm):
- streamed chat chunks: `ChatCompletionStreamResponse` / `ChatCompletionResponseStreamChoice` in
  vllm/entrypoints/openai/chat_completion/protocol.py (commit 002032ee2b18): `choices[].delta`,
  `finish_reason` (null until the choice ends), vLLM's own `stop_reason` (int | str | null) and
  `token_ids`, `usage` (null, or a `UsageInfo` on the last chunk with `stream_options.include_usage`,
  on every chunk with `continuous_usage_stats`), `system_fingerprint`, `prompt_token_ids`, `metrics`;
- `UsageInfo` (prompt_tokens, total_tokens, completion_tokens which may be null,
  prompt_tokens_details), `ModelCard` (`max_model_len`, `owned_by: "vllm"`, `permission`) and the
  error body `ErrorResponse{error: ErrorInfo{message, type, param, code: int}}` in
  vllm/entrypoints/openai/engine/protocol.py (commit 040a2cc2a629); a stream reports a failure
  after its head as `data: {"error": {...}}` (`create_streaming_error_response` in
  vllm/entrypoints/openai/engine/serving.py);
- older vLLM releases answered errors with a top-level `{"object": "error", "message", "type",
  "param", "code"}` (`ErrorResponse` of vllm/entrypoints/openai/protocol.py before the `error`
  wrapper), and FastAPI answers an unknown route with `{"detail": "Not Found"}`.
Each is then served by a scripted server and read by RemoteEngine as a user would.
"""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.fake_openai import FakeServer, Reply

from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.params import DiffusionParams
from dgchat.remote import NoInfillEndpoint, RemoteApiError, RemoteEngine
from dgchat.remote.engine import SYNTHETIC_BASE
from dgchat.remote.errors import AuthRejected
from dgchat.remote.wire import error_message, parse_chunk, parse_models

MODEL = "google/diffusiongemma-26B-A4B-it"
VLLM_MODELS = {"object": "list", "data": [{
    "id": MODEL, "object": "model", "created": 1781000000, "owned_by": "vllm", "root": MODEL, "parent": None,
    "max_model_len": 32768,
    "permission": [{"id": "modelperm-1", "object": "model_permission", "created": 1781000000,
                    "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                    "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                    "organization": "*", "group": None, "is_blocking": False}]}]}


def _chunk(content: str | None, finish: str | None = None, *, role: bool = False, usage=None,
           stop_reason=None) -> dict:
    delta = {"role": "assistant", "content": ""} if role else ({} if content is None else {"content": content})
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1781000000, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                         "stop_reason": stop_reason, "token_ids": None}],
            "usage": usage, "system_fingerprint": None, "prompt_token_ids": None}


VLLM_STREAM = [
    _chunk(None, role=True),
    _chunk("Halt, "),
    _chunk("traveller."),
    _chunk("", "length", stop_reason=None),
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1781000000, "model": MODEL, "choices": [],
     "usage": {"prompt_tokens": 17, "total_tokens": 21, "completion_tokens": 4,
               "prompt_tokens_details": None}},
    "[DONE]",
]


def test_vllm_shapes_parse() -> None:
    (model,) = parse_models(VLLM_MODELS)
    assert model.id == MODEL and model.context_length == 32768 and not model.is_dgchat
    first = parse_chunk(VLLM_STREAM[1])
    assert [(c.index, c.text, c.finish_reason) for c in first.choices] == [(0, "Halt, ", None)]
    assert first.usage is None and first.dgchat is None
    end = parse_chunk(VLLM_STREAM[3])
    assert end.choices[0].finish_reason == "length" and end.choices[0].text == ""
    usage = parse_chunk(VLLM_STREAM[4])
    assert usage.choices == () and (usage.usage.prompt_tokens, usage.usage.completion_tokens) == (17, 4)
    # continuous_usage_stats: usage on an ordinary chunk; completion_tokens may be null
    cont = parse_chunk(_chunk("x", usage={"prompt_tokens": 17, "total_tokens": 17, "completion_tokens": None}))
    assert cont.choices[0].text == "x" and cont.usage.completion_tokens == 0 and cont.usage.total_tokens == 17
    # a legacy completions chunk (text_completion) carries `text`
    legacy = parse_chunk({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
                          "choices": [{"index": 0, "text": "abc", "logprobs": None, "finish_reason": "stop",
                                       "stop_reason": 106}]})
    assert legacy.choices[0].text == "abc" and legacy.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body, message, code", [
    ({"error": {"message": "max_tokens is too large", "type": "BadRequestError", "param": "max_tokens",
                "code": 400}}, "max_tokens is too large", 400),
    ({"object": "error", "message": "The model `x` does not exist.", "type": "NotFoundError", "param": None,
      "code": 404}, "The model `x` does not exist.", 404),
    ({"detail": "Not Found"}, "Not Found", None),
    ({"error": {"message": "missing or wrong API token", "type": "authentication_error", "param": None,
                "code": "invalid_api_key"}}, "missing or wrong API token", "invalid_api_key"),
])
def test_error_shapes(body, message, code) -> None:
    assert error_message(body)[:2] == (message, code)


def _vllm(events=VLLM_STREAM, models=VLLM_MODELS):
    def handler(method: str, path: str, body) -> Reply:
        if path == "/v1/models":
            return Reply(body=models)
        if path == "/v1/chat/completions":
            return Reply(events=list(events))
        return Reply(404, {"detail": "Not Found"})
    return FakeServer(handler)


def test_remote_engine_on_a_vllm_server_streams_text_only() -> None:
    with _vllm() as server, RemoteEngine.connect(server.url, retries=0) as engine:
        assert not engine.is_dgchat and engine.text_only and engine.n_ctx_max == 32768 and engine.path.name == "diffusiongemma-26B-A4B-it"
        prompt = engine.chat_prompt([{"role": "user", "content": "Who goes there?"}])
        assert prompt.size == 0 and prompt.messages[0]["content"] == "Who goes there?"
        events = list(engine.generate(prompt, DiffusionParams(temperature=0.5, seed=3, max_tokens=4)))
        steps = [e for e in events if isinstance(e, StepEvent)]
        final = events[-1]
        assert isinstance(final, FinalEvent) and final.text == "Halt, traveller."
        assert final.stop_reason == "max_tokens" and final.stats.prompt_tokens == 17 and final.stats.tokens == 4
        # text-only progress: one step per delta, the text behind synthetic ids
        assert len(steps) == 2 and steps[-1].canvas_length == 0
        assert all(int(t) >= SYNTHETIC_BASE for t in steps[-1].answer_tokens)
        assert engine.detokenize(steps[0].answer_tokens) == "Halt, "
        assert engine.detokenize(steps[-1].answer_tokens) == "Halt, traveller."
        # the request: OpenAI's fields only, no dgchat extension, vLLM's top_k extension not sent at 0
        _m, path, body, headers = server.requests[-1]
        assert body["messages"] == prompt.messages and body["stream"] is True and "dgchat" not in body
        assert (body["seed"], body["temperature"], body["max_tokens"]) == (3, 0.5, 4)
        assert body["stream_options"] == {"include_usage": True} and "authorization" not in {k.lower() for k in headers}
        # diffusion settings cannot reach a server that has none
        assert engine.unsupported(DiffusionParams(steps=8, seed=1)) == ["steps"]
        with pytest.raises(Exception, match="not a dgchat server.*--steps"):
            list(engine.generate(prompt, DiffusionParams(steps=8)))
        # resolve leaves them out (settings meant for any model, as the config's), keeping the rest
        resolved = engine.resolve(DiffusionParams(steps=8, gen_length=64, temperature=0.5, max_tokens=4))
        assert (resolved.steps, resolved.gen_length, resolved.temperature, resolved.max_tokens) == (None, None, 0.5, 4)
        assert engine.unsupported(resolved) == []
        assert engine.precise is None  # exact mode is the server's choice
        with pytest.raises(NoInfillEndpoint, match=r"has no infill endpoint \(POST /v1/infill answered 404\)"):
            engine.infill({"template": "Halt, {___}!"})
        with pytest.raises(Exception, match="template"):
            list(engine.generate(prompt, None, template=object()))
        assert np.asarray(engine.encode("plain text")).size == 0


def test_an_error_event_mid_stream_is_reported() -> None:
    events = [_chunk(None, role=True), _chunk("Halt"),
              {"error": {"message": "the engine died", "type": "InternalServerError", "param": None, "code": 500}},
              "[DONE]"]
    with _vllm(events) as server, RemoteEngine.connect(server.url, retries=0) as engine:
        with pytest.raises(RemoteApiError, match="reported an error mid-answer: the engine died") as info:
            list(engine.generate(engine.chat_prompt([{"role": "user", "content": "hi"}])))
        assert info.value.status == 500 and info.value.retryable


def test_a_key_is_sent_and_a_401_is_explained() -> None:
    def handler(method, path, body):
        return Reply(401, {"error": {"message": "Unauthorized", "type": "Unauthorized", "param": None, "code": 401}})

    with FakeServer(handler) as server:
        with pytest.raises(AuthRejected, match=r"^the server rejected the API key \(401\) at http://127\.0\.0\.1:\d+: "
                                               r"check --api-key"):
            RemoteEngine.connect(server.url, api_key="sk-wrong", retries=2)
        assert len(server.requests) == 1  # a 4xx is not retried
        assert server.requests[0][3]["Authorization"] == "Bearer sk-wrong"
        with pytest.raises(AuthRejected, match="no key was sent"):
            RemoteEngine.connect(server.url, retries=0)
