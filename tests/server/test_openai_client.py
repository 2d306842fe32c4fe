"""`dgchat serve` driven by the official `openai` client library (skipped when it is not installed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dgchat.model_backend.loader import load_engine
from dgchat.server.app import ServeConfig, ServerThread

openai = pytest.importorskip("openai")

TOKEN = "test-token-123"
MESSAGES = [{"role": "system", "content": "You are a guard."}, {"role": "user", "content": "Who goes there?"}]


@pytest.fixture(scope="module")
def client(llama_nc_gguf: Path) -> Iterator:
    with load_engine(llama_nc_gguf, n_threads=1) as engine:
        with ServerThread(engine, ServeConfig(port=0, quiet=True, token=TOKEN, max_queue=2)) as st:
            yield openai.OpenAI(base_url=st.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)


def test_models(client) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-llama-noncausal"]
    assert client.models.retrieve("tiny-llama-noncausal").owned_by == "dgchat"


def test_chat_completions(client) -> None:
    kw = dict(model="anything", messages=MESSAGES, max_tokens=20, seed=7, temperature=0.5)
    reply = client.chat.completions.create(**kw)
    assert reply.object == "chat.completion" and reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0 and 0 < reply.usage.completion_tokens <= 20
    text = reply.choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    # diffusion settings ride in the dgchat extension object
    fast = client.chat.completions.create(**kw, extra_body={"dgchat": {"steps": 5}})
    assert fast.model_extra["dgchat"]["settings"]["steps"] == 5


def test_completions(client) -> None:
    reply = client.completions.create(model="x", prompt="Halt, traveller!", max_tokens=6, seed=2)
    assert reply.object == "text_completion" and reply.choices[0].finish_reason in ("stop", "length")
    streamed = client.completions.create(model="x", prompt="Halt, traveller!", max_tokens=6, seed=2, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == reply.choices[0].text
    infill = client.completions.create(model="x", prompt="None may pass the", suffix=" after dark.", max_tokens=3,
                                       seed=2)
    assert infill.usage.completion_tokens == 3


def test_errors_map_to_the_clients_exceptions(client) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="x", messages=MESSAGES, temperature=9)
    assert info.value.status_code == 400 and "temperature" in info.value.message
    with pytest.raises(openai.AuthenticationError):
        client.with_options(api_key="wrong-token").models.list()
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
