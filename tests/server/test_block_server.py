"""`dgchat serve` with a block-diffusion model (SDAR, BD3LM; docs/BLOCK_DIFFUSION.md), over real HTTP
on loopback: chat and completions (streamed and not) with one canvas frame per block step, settings
and their sources (no canvas to fit: steps are per block), the model details a remote client needs,
and infill (a completion's `suffix`, a line template) refused with a 400 that says why.

The model is the tiny random-weight conversion of fixtures.block_tiny: its text is gibberish, every
flow runs."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from fixtures.block_tiny import converted

from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.params import DiffusionParams
from dgchat.server import openai_api
from dgchat.server.app import ServeConfig, ServerThread, block_details

MESSAGES = [{"role": "system", "content": "You are a guard."}, {"role": "user", "content": "Who goes there?"}]
BLOCK = {"sdar": 4, "bd3lm": 32}
STEPS = {"sdar": 4, "bd3lm": 32}  # the file's steps per block (dgchat.steps)


@pytest.fixture(scope="module", params=["sdar", "bd3lm"])
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine(base: Path, variant: str) -> Iterator[DiffusionEngine]:
    # precise: n choices in one batch equal single runs; 1 thread: no spin-waits on a busy box
    with load_engine(converted(base, variant), precise=True, n_threads=1) as e:
        yield e


@pytest.fixture(scope="module")
def server(engine: DiffusionEngine) -> Iterator[ServerThread]:
    with ServerThread(engine, ServeConfig(port=0, quiet=True)) as st:
        yield st


def _request(st: ServerThread, path: str, body: object = None, method: str = "POST") -> tuple[int, bytes]:
    host, port = st.server.address
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        conn.request(method, path, json.dumps(body).encode() if body is not None else None,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _json(st: ServerThread, path: str, body: object = None, method: str = "POST") -> tuple[int, dict]:
    status, data = _request(st, path, body, method)
    return status, json.loads(data)


def _stream(st: ServerThread, path: str, body: dict) -> list[dict]:
    status, data = _request(st, path, {**body, "stream": True})
    assert status == 200, data
    events = [block[len("data: "):] for block in data.decode("utf-8").split("\n\n") if block.strip()]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _local(engine: DiffusionEngine, params: DiffusionParams) -> FinalEvent:
    final = list(engine.generate(engine.chat_prompt(MESSAGES), engine.resolve(params)))[-1]
    assert isinstance(final, FinalEvent)
    return final


def test_the_model_details_carry_the_block_and_the_variant(server, engine, variant: str) -> None:
    status, listing = _json(server, "/v1/models", method="GET")
    assert status == 200
    details = listing["data"][0]["dgchat"]
    assert details["family"] == "block_diffusion" and details["uniform_state"] is False
    assert details["attention_block"] == BLOCK[variant] == engine.info.attention_block
    assert details["variant"] == variant == engine.info.preset
    assert details["engine"] == engine.label
    # what a client resolves settings from: the model's own, and the server's resolved defaults
    assert details["model_defaults"]["steps"] == STEPS[variant]
    assert details["defaults"]["gen_length"] == details["defaults"]["block_length"] == BLOCK[variant]
    assert details["defaults"]["max_tokens"] == 512 and details["defaults"]["eps"] is None


def test_other_families_say_no_block() -> None:
    """A masked-diffusion model (LLaDA): the keys are there, null."""
    from dgchat.model_backend.model_info import ModelInfo

    info = ModelInfo(architecture="llada", family="masked", preset="llada", has_kv_memory=False, mask_token=1,
                     shift_logits=False, chat_template=None, name="tiny llada", context_length=2048)
    masked = SimpleNamespace(info=info)
    assert block_details(masked) == {"attention_block": None, "variant": None}


def test_a_short_answer_keeps_the_model_s_steps_per_block(server, engine, variant: str) -> None:
    """max_tokens below the block: no canvas is fitted (a masked model's would shrink, and its steps
    with it); the block and the steps per block stay the model's, the answer ends at max_tokens."""
    status, reply = _json(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "seed": 4})
    assert status == 200, reply
    table = reply["dgchat"]["params"]
    assert table["steps"] == {"value": STEPS[variant], "source": "model file"}
    assert table["gen_length"] == {"value": BLOCK[variant], "source": "model file"}
    assert table["block_length"] == {"value": BLOCK[variant], "source": "model file"}
    assert table["max_tokens"] == {"value": 2, "source": "request"}
    assert table["temperature"] == {"value": 0.0, "source": "model file"}
    assert table["cache"] == {"value": "none", "source": "derived"}
    assert "eps" not in table
    if variant == "sdar":
        assert table["threshold"] == {"value": 0.85, "source": "model file"}
    settings = reply["dgchat"]["settings"]
    assert all(settings[k] == row["value"] for k, row in table.items() if k != "precise")
    assert reply["usage"]["completion_tokens"] <= 2
    local = _local(engine, DiffusionParams(seed=4, max_tokens=2))
    assert reply["choices"][0]["message"]["content"] == local.text
    assert reply["choices"][0]["finish_reason"] == ("length" if local.stop_reason == "max_tokens" else "stop")


def test_without_max_tokens_a_chat_gets_the_model_s_answer_length(server, variant: str) -> None:
    """Not one block (a masked model's default is its canvas): the file's max_tokens, 512."""
    status, reply = _json(server, "/v1/chat/completions", {"messages": MESSAGES, "seed": 1, "stop": ["\n\n\n"]})
    assert status == 200, reply
    assert reply["dgchat"]["params"]["max_tokens"] == {"value": 512, "source": "model file"}
    assert reply["usage"]["completion_tokens"] <= 512
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_default_answer_length_fits_the_context() -> None:
    """A long prompt: the default max_tokens is cut to what fits after it (the padding and a block's
    overrun included), so the request is answered instead of refused."""
    info = SimpleNamespace(family="block_diffusion", block_diffusion=True)
    resolved = DiffusionParams(gen_length=32, max_tokens=512)
    stub = SimpleNamespace(info=info, n_ctx_max=600, resolve=lambda p: resolved)
    assert openai_api.default_max_tokens(stub, DiffusionParams(), 10) == 512
    assert openai_api.default_max_tokens(stub, DiffusionParams(), 400) == 600 - 400 - 64
    assert openai_api.default_max_tokens(stub, DiffusionParams(), 590) == 1  # the fit check then says why


def test_the_stream_sends_one_canvas_frame_per_block_step(server, engine, variant: str) -> None:
    body = {"messages": MESSAGES, "max_tokens": 40, "seed": 7, "temperature": 0.8, "dgchat": {"canvas": True}}
    chunks = _stream(server, "/v1/chat/completions", body)
    frames = [c["dgchat"] for c in chunks if "dgchat" in c and "canvas" in c["dgchat"]]
    final = next(c["dgchat"] for c in chunks if c.get("dgchat", {}).get("final"))
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    local_events = list(engine.generate(engine.chat_prompt(MESSAGES),
                                        engine.resolve(DiffusionParams(seed=7, temperature=0.8, max_tokens=40))))
    local_steps, local_final = local_events[:-1], local_events[-1]
    assert len(frames) == len(local_steps) > 1
    for frame, step in zip(frames, local_steps):
        assert frame["canvas_index"] == step.canvas_index and frame["canvas_step"] == step.canvas_step
        assert frame["total_steps"] == STEPS[variant]  # steps per block
        assert frame["tokens"] == step.canvas.tokens.tolist() and frame["state"] == step.canvas.state.tolist()
        assert len(frame["tokens"]) <= BLOCK[variant]  # a canvas is one block (SDAR's first: less the prompt's)
        assert frame["answer_length"] == step.answer_tokens.size  # the finished blocks
        if frame["canvas_step"] == 1:
            assert frame["answer_tokens"] == step.answer_tokens.tolist()
    blocks = {f["canvas_index"] for f in frames}
    assert blocks == set(range(len(blocks))) and len(blocks) == local_final.stats.canvases
    if variant == "sdar":
        assert len(blocks) >= 40 // BLOCK[variant]  # the answer went on block after block
    assert final["tokens"] == local_final.tokens.tolist() and final["stop_reason"] == local_final.stop_reason
    assert text == local_final.text
    assert final["stats"]["canvases"] == local_final.stats.canvases


def test_plain_streams_and_completions(server, engine) -> None:
    chunks = _stream(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12, "seed": 2})
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == _local(engine, DiffusionParams(seed=2, max_tokens=12)).text
    assert not any("canvas" in c.get("dgchat", {}) for c in chunks)
    status, reply = _json(server, "/v1/completions", {"prompt": "Halt! Who goes", "max_tokens": 6, "seed": 1})
    assert status == 200 and reply["object"] == "text_completion", reply
    assert reply["usage"]["completion_tokens"] <= 6
    chunks = _stream(server, "/v1/completions", {"prompt": "Halt! Who goes", "max_tokens": 6, "seed": 1})
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == reply["choices"][0]["text"]


def test_n_choices_sample_apart(server, engine) -> None:
    status, reply = _json(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12, "seed": 11, "n": 3,
                                                           "temperature": 1.0})
    assert status == 200, reply
    texts = [c["message"]["content"] for c in reply["choices"]]
    assert len(set(texts)) > 1
    assert texts[1] == _local(engine, DiffusionParams(seed=12, max_tokens=12, temperature=1.0)).text


def test_the_block_settings_a_request_may_and_may_not_give(server, variant: str) -> None:
    # a canvas of another size is replaced by the block (the block size is the model's)
    status, reply = _json(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4,
                                                           "dgchat": {"gen_length": 8, "steps": 2, "threshold": 0.5}})
    assert status == 200, reply
    table = reply["dgchat"]["params"]
    assert table["gen_length"]["value"] == BLOCK[variant]
    assert table["steps"] == {"value": 2, "source": "request"}
    assert table["threshold"] == {"value": 0.5, "source": "request"}
    # masked-diffusion settings: a 400 naming the setting, never a 500
    for ext, name in (({"eps": 0.01}, "--eps"), ({"cfg_scale": 1.0}, "--cfg-scale"), ({"factor": 1.0}, "--factor"),
                      ({"algorithm": "entropy"}, "--algorithm"), ({"cache": "prefix"}, "--cache")):
        status, err = _json(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "dgchat": ext})
        assert status == 400 and err["error"]["code"] == "invalid_parameter", err
        assert name in err["error"]["message"]


def test_a_completion_with_a_suffix_is_refused_with_the_reason(server) -> None:
    body = {"prompt": "Halt! Who", "suffix": " after dark.", "max_tokens": 4}
    for stream in (False, True):
        status, err = _json(server, "/v1/completions", {**body, "stream": stream})
        assert status == 400, err
        assert err["error"]["param"] == "suffix" and err["error"]["code"] == "unsupported_parameter"
        assert "cannot see text to the right" in err["error"]["message"]


def test_line_templates_are_refused_and_free_lines_written(server, variant: str) -> None:
    status, err = _json(server, "/v1/infill", {"template": "Halt, {___:2}! None may pass.", "n": 2})
    assert status == 400, err
    assert err["error"]["param"] == "template" and err["error"]["code"] == "unsupported_parameter"
    assert "cannot see the text after a hole" in err["error"]["message"] and "`length`" in err["error"]["message"]
    status, reply = _json(server, "/v1/infill", {"length": "bark", "n": 3, "seed": 5})
    assert status == 200, reply
    choices = reply["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2] and [c["seed"] for c in choices] == [5, 6, 7]
    assert all(c["holes"] == [] and len(c["tokens"]) <= 12 for c in choices)
    assert len({tuple(c["tokens"]) for c in choices}) > 1  # the NPC layer samples: variants differ
    settings = choices[0]["settings"]
    assert settings["temperature"] == 0.8 and settings["steps"] == STEPS[variant]
    assert settings["block_length"] == BLOCK[variant] and settings["eps"] is None
    assert reply["dgchat"]["settings"] == {"length": "bark", "canvas_tokens": BLOCK[variant], "max_tokens": 12}
    # a card's own temperature wins: greedy, so every variant is the same line
    status, reply = _json(server, "/v1/infill", {"length": "bark", "n": 2, "seed": 5, "temperature": 0.0})
    assert status == 200, reply
    assert reply["choices"][0]["tokens"] == reply["choices"][1]["tokens"]
    assert reply["choices"][0]["settings"]["temperature"] == 0.0


def test_finished_blocks_are_final_text(server, engine) -> None:
    """Streamed text is the answer's decided prefix: a delta never has to be taken back, and the
    streamed text equals the final answer's (the tokens of the finished blocks come first)."""
    body = {"messages": MESSAGES, "max_tokens": 24, "seed": 3, "temperature": 0.9, "dgchat": {"canvas": True}}
    chunks = _stream(server, "/v1/chat/completions", body)
    final = next(c["dgchat"] for c in chunks if c.get("dgchat", {}).get("final"))
    answers = [c["dgchat"]["answer_tokens"] for c in chunks if "answer_tokens" in c.get("dgchat", {})]
    for earlier, later in zip(answers, answers[1:]):
        assert later[: len(earlier)] == earlier  # finished blocks never change
    n = min(len(answers[-1]), len(final["tokens"]))
    assert final["tokens"][:n] == answers[-1][:n]
