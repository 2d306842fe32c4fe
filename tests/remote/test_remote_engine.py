"""A real `dgchat serve` on loopback as the remote engine: the live canvas over the wire, the same
answer as a local run, infill, auth, the command line, and the official client still reading it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures.fake_openai import SilentServer, free_port

from dgchat.model_backend.canvas_view import shown_cells
from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.params import DiffusionParams
from dgchat.remote import AuthRejected, RemoteEngine
from dgchat.server.app import ServeConfig, ServerThread

MESSAGES = [{"role": "system", "content": "You are a guard."}, {"role": "user", "content": "Who goes there?"}]
TOKEN = "remote-test-token"


def _local(engine: DiffusionEngine, params: DiffusionParams) -> tuple[list[StepEvent], FinalEvent]:
    events = list(engine.generate(engine.chat_prompt(MESSAGES), engine.resolve(params)))
    return events[:-1], events[-1]


@pytest.mark.parametrize("params", [
    DiffusionParams(seed=5),  # the model's defaults: greedy, one 128-token canvas in blocks of 32
    DiffusionParams(seed=3, temperature=0.8, gen_length=16, steps=8, max_tokens=40),  # sampled, three canvases
])
def test_the_live_canvas_crosses_the_wire(engine, server, params) -> None:
    local_steps, local_final = _local(engine, params)
    with RemoteEngine.connect(server.url, retries=0) as remote:
        assert remote.is_dgchat and remote.info.mask_token == engine.info.mask_token
        assert remote.n_ctx_max == engine.n_ctx_max and remote.resolve(params) == engine.resolve(params)
        events = list(remote.generate(remote.chat_prompt(MESSAGES), params))
    steps, final = events[:-1], events[-1]
    assert all(isinstance(e, StepEvent) for e in steps) and isinstance(final, FinalEvent)
    # every denoising step arrives, and each is the local step: canvas, states, earlier canvases
    assert len(steps) == len(local_steps) > 1
    for mine, theirs in zip(steps, local_steps):
        assert (mine.step, mine.canvas_index, mine.canvas_step, mine.total_steps) == (
            theirs.step, theirs.canvas_index, theirs.canvas_step, theirs.total_steps)
        assert np.array_equal(mine.canvas.tokens, theirs.canvas.tokens)
        assert np.array_equal(mine.canvas.state, theirs.canvas.state)
        assert np.array_equal(mine.answer_tokens, theirs.answer_tokens)
    # so a live canvas draws the same thing from the remote engine's pieces as from the model's
    for mine, theirs in zip(steps[::7], local_steps[::7]):
        assert shown_cells(mine, remote) == shown_cells(theirs, engine)
        assert [remote.piece(t) for t, _ in shown_cells(mine, remote) if t >= 0] == [
            engine.piece(t) for t, _ in shown_cells(theirs, engine) if t >= 0]
    assert final.text == local_final.text and np.array_equal(final.tokens, local_final.tokens)
    assert final.stop_reason == local_final.stop_reason and final.stats.steps == local_final.stats.steps
    assert final.stats.prompt_tokens == engine.chat_prompt(MESSAGES).size
    assert final.extra["settings"]["gen_length"] == engine.resolve(params).gen_length  # what the server ran
    if params.max_tokens == 40:
        assert local_final.stats.canvases == 3 and final.stats.canvases == 3


def test_n_answers_in_one_request(engine, server) -> None:
    params = engine.resolve(DiffusionParams(seed=11, temperature=0.9, gen_length=24, steps=12, max_tokens=24))
    prompt = engine.chat_prompt(MESSAGES)
    local = {i: e for i, e in engine.generate_batch([prompt] * 3, [params.updated(seed=11 + i) for i in range(3)])
             if isinstance(e, FinalEvent)}
    with RemoteEngine.connect(server.url, retries=0) as remote:
        p = remote.chat_prompt(MESSAGES)
        finals = {i: e for i, e in remote.generate_batch([p] * 3, [params.updated(seed=11 + i) for i in range(3)])
                  if isinstance(e, FinalEvent)}
    assert [finals[i].text for i in range(3)] == [local[i].text for i in range(3)]
    assert len({finals[i].text for i in range(3)}) > 1  # the seeds really differ


def test_infill_and_free_lines(server) -> None:
    with RemoteEngine.connect(server.url, retries=0) as remote:
        answer = remote.infill({"template": "Halt, {player}! None may pass the {___:2} after dark.",
                                "variables": {"player": "Aria"}, "character": {"name": "Captain Brann"},
                                "n": 2, "seed": 5})
        for i, choice in enumerate(answer["choices"]):
            assert choice["seed"] == 5 + i and choice["holes"][0]["tokens"] == 2
            assert choice["text"] == f"Halt, Aria! None may pass the {choice['holes'][0]['text']} after dark."
        assert answer["dgchat"]["model"]["file"] == "tiny-llada.gguf"
        free = remote.infill({"length": "bark", "character": {"name": "Captain Brann"}, "seed": 1})
        assert free["choices"][0]["holes"] == [] and free["choices"][0]["tokens"]
        with pytest.raises(Exception, match="not both"):
            remote.infill({"length": "bark", "template": "a {___}"})


def test_the_api_key(engine) -> None:
    with ServerThread(engine, ServeConfig(port=0, quiet=True, token=TOKEN)) as st:
        with pytest.raises(AuthRejected, match=r"^the server rejected the API key \(401\)"):
            RemoteEngine.connect(st.url, api_key="not-the-token", retries=0)
        with pytest.raises(AuthRejected, match="no key was sent"):
            RemoteEngine.connect(st.url, retries=0)
        with RemoteEngine.connect(st.url, api_key=TOKEN, retries=0) as remote:
            final = list(remote.generate(remote.chat_prompt(MESSAGES), DiffusionParams(steps=4, gen_length=8)))[-1]
            assert final.stop_reason in ("eos", "max_tokens") and final.stats.steps >= 1


def test_the_official_client_reads_the_canvas_stream(server) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    kw = dict(model="x", messages=MESSAGES, max_tokens=16, seed=2)
    text = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True, extra_body={"dgchat": {"canvas": True}}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    frames = [c.model_extra["dgchat"] for c in chunks if "canvas" in (c.model_extra or {}).get("dgchat", {})]
    assert len(frames) > 1 and all(len(f["tokens"]) == len(f["state"]) == len(f["canvas"]) for f in frames)
    finals = [c.model_extra["dgchat"] for c in chunks if (c.model_extra or {}).get("dgchat", {}).get("final")]
    assert len(finals) == 1 and finals[0]["stop_reason"] in ("eos", "max_tokens")
    plain = list(client.chat.completions.create(**kw, stream=True))  # no extension asked: none sent
    assert "".join(c.choices[0].delta.content or "" for c in plain if c.choices) == text
    assert not any("canvas" in (c.model_extra or {}).get("dgchat", {}) for c in plain)


def _dgchat(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgchat", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_generate_on_a_server_from_the_command_line(server, llada_gguf: Path, tmp_path: Path) -> None:
    args = ["-p", "Who goes there?", "--seed", "4", "--temperature", "0.7", "--max-tokens", "24", "--json"]
    local = _dgchat("generate", "-m", str(llada_gguf), "--threads", "1", *args)
    remote = _dgchat("generate", "--server", server.url + "/v1", "--retries", "0", *args)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    mine, theirs = json.loads(remote.stdout), json.loads(local.stdout)
    assert (mine["text"], mine["tokens"], mine["stop_reason"]) == (theirs["text"], theirs["tokens"], theirs["stop_reason"])
    assert mine["server"] == server.url and mine["model"] == "tiny-llada"
    # the config's [server] url is used when no model is named
    config = tmp_path / "config" / "dgchat"
    config.mkdir(parents=True)
    (config / "config.toml").write_text(f'[server]\nurl = "{server.url}"\n')
    configured = _dgchat("generate", *args, env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert configured.returncode == 0, configured.stderr
    assert json.loads(configured.stdout)["server"] == server.url
    # --visual without a terminal: ignored, said on stderr (issue 43, item 17); the answer alone
    visual = _dgchat("generate", "--server", server.url, "-p", "hi", "--steps", "6", "--gen-length", "12",
                     "--visual", env={"FORCE_COLOR": "", "TTY_COMPATIBLE": ""})  # empty: rich asks the pipe
    assert visual.returncode == 0, visual.stderr
    assert "--visual ignored: the output is not a terminal" in visual.stderr and "step " not in visual.stdout
    # --record: the server streams each step's canvas, recorded as a local run would be
    cast = tmp_path / "remote.cast"
    recorded = _dgchat("generate", "--server", server.url, "-p", "hi", "--steps", "6", "--gen-length", "12",
                       "--record", str(cast), "--record-pace", "0.1")
    assert recorded.returncode == 0, recorded.stderr
    frames = [json.loads(line) for line in cast.read_text(encoding="utf-8").splitlines()[1:]]
    assert [round(f[0], 3) for f in frames if "step " in f[2]] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]


def test_clear_errors_on_the_command_line(engine) -> None:
    port = free_port()
    down = _dgchat("generate", "--server", f"http://127.0.0.1:{port}", "--retries", "0", "-p", "hi")
    assert down.returncode == 2
    assert down.stderr.strip() == f"dgchat: error: cannot reach http://127.0.0.1:{port}: connection refused"
    with ServerThread(engine, ServeConfig(port=0, quiet=True, token=TOKEN)) as st:
        wrong = _dgchat("generate", "--server", st.url, "-p", "hi", env={"DGCHAT_API_KEY": "wrong-key-123"})
        assert wrong.returncode == 2 and "dgchat: error: the server rejected the API key (401)" in wrong.stderr
        local_only = _dgchat("generate", "--server", st.url, "-p", "hi", "--ar", "--no-early-stop",
                             env={"DGCHAT_API_KEY": TOKEN})
        assert local_only.returncode == 2
        assert f"dgchat serve at {st.url} takes no --no-early-stop, --ar" in local_only.stderr
    with SilentServer() as silent:
        hung = _dgchat("generate", "--server", silent.url, "--timeout", "0.5", "-p", "hi")
    assert hung.returncode == 2
    assert hung.stderr.strip() == f"dgchat: error: {silent.url} did not answer /v1/models within 0.5 s (--timeout)"
    # the chat app takes --server too (tests/app/test_remote_chat.py); a URL it cannot use fails before it opens
    app = _dgchat("--server", "ftp://127.0.0.1:1")
    assert app.returncode == 2 and "--server takes a URL such as http://127.0.0.1:8765" in app.stderr
    both = _dgchat("--server", "http://127.0.0.1:1", "--model", "x.gguf")
    assert both.returncode == 2 and "give --model or --server, not both" in both.stderr


def test_the_app_s_engine_protocol_and_chat_job(server) -> None:
    """RemoteEngine has every member of the app's Engine Protocol, and the chat's job runs on it
    unchanged: steps recorded for the live view, the answer as its result (app/session.py lends
    the engine; here the test does)."""
    from dgchat.model_backend.engine_protocol import Engine
    from dgchat.app.generation import ChatAnswer

    members = {n for n in vars(Engine) if not n.startswith("_")} | set(Engine.__annotations__)
    with RemoteEngine.connect(server.url, retries=0) as remote:
        assert members and all(hasattr(remote, n) for n in members), members - set(dir(remote))
        job = ChatAnswer(MESSAGES, remote.resolve(DiffusionParams(seed=2, gen_length=16, steps=8)))
        job.engine = remote
        job.execute()
    assert job.error is None and isinstance(job.result, FinalEvent) and job.result.text
    assert job.steps_seen == 8 and job.event is not None
    assert job.partial_text() == job.result.text  # the last step's decided text is the answer


def test_different_prompts_run_concurrently_and_cancel_stops_the_server(server) -> None:
    import threading
    import time

    params = DiffusionParams(seed=1, gen_length=16, steps=8)
    with RemoteEngine.connect(server.url, retries=0) as remote:
        prompts = [remote.chat_prompt([{"role": "user", "content": text}]) for text in ("Halt!", "Who goes?", "Hi")]
        alone = [list(remote.generate(p, params))[-1].text for p in prompts]
        together = {i: e.text for i, e in remote.generate_batch(prompts, [params] * 3) if isinstance(e, FinalEvent)}
        assert [together[i] for i in range(3)] == alone
        # a cancel closes the stream: the answer ends "cancelled" and the server stops generating
        cancel = threading.Event()
        steps = 0
        for event in remote.generate(prompts[0], DiffusionParams(seed=1), cancel=cancel):
            if isinstance(event, StepEvent):
                steps += 1
                if steps == 3:
                    cancel.set()
            else:
                final = event
        assert final.stop_reason == "cancelled" and steps < 128
        deadline = time.monotonic() + 5
        while remote.client.get_json("/health")["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert remote.client.get_json("/health")["running"] == 0


def test_diffusion_gemma_over_the_wire() -> None:
    """Uniform-state diffusion (the bundled DiffusionGemma model): every step's canvas of drafts and
    accepted tokens crosses the wire, and the answer's text is the text of its tokens. (The sampler
    revises positions it had accepted until a canvas is done, so the server streams text only from
    finished canvases; before, it streamed accepted positions and its answer could differ from the
    text of its own tokens.)"""
    from dgchat.assets import bundled_model_path

    path = bundled_model_path()
    if path is None:
        pytest.skip("no bundled model in this installation")
    params = DiffusionParams(seed=2, max_tokens=48)
    messages = [{"role": "user", "content": "Write a line for a guard."}]  # an answer whose accepted words change
    with load_engine(path, n_threads=1) as engine:
        assert engine.info.uniform_state
        local = list(engine.generate(engine.chat_prompt(messages), engine.resolve(params)))
        with ServerThread(engine, ServeConfig(port=0, quiet=True)) as st, RemoteEngine.connect(st.url) as remote:
            assert remote.resolve(params) == engine.resolve(params)  # DiffusionGemma's own resolution rules
            events = list(remote.generate(remote.chat_prompt(messages), params))
            plain = remote.client.post_json("/v1/chat/completions", {"messages": messages, "seed": 2,
                                                                      "max_tokens": 48})
        assert len(events) == len(local) and all(e.uniform_state for e in events[:-1])
        for mine, theirs in zip(events[:-1], local[:-1]):
            assert np.array_equal(mine.canvas.tokens, theirs.canvas.tokens)
            assert np.array_equal(mine.canvas.state, theirs.canvas.state)
            assert shown_cells(mine, remote) == shown_cells(theirs, engine)  # drafts drawn with their text
        assert np.array_equal(events[-1].tokens, local[-1].tokens)
        assert events[-1].text == local[-1].text == engine.detokenize(local[-1].tokens)
        assert plain["choices"][0]["message"]["content"] == local[-1].text
