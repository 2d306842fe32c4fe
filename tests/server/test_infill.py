"""/v1/infill's numerics: every infill request runs without a numpy floating-point warning (they are
turned into errors here, in the server's worker threads too), and a temperature so small that its
reciprocal overflows float32 (the sampler multiplies the logits by 1/T) is refused up front instead
of turning the logits into inf and NaN (numpy's "overflow encountered in cast", "invalid value
encountered in multiply/subtract"; on the engine's head, silently, holes filled with garbage)."""

from __future__ import annotations

import http.client
import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from dgchat.assets import bundled_model_path
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.params import MIN_TEMPERATURE, DiffusionParams
from dgchat.server.app import ServeConfig, ServerThread

TEMPLATE = {"template": "Halt, {player}! None may pass the {___} after dark.", "variables": {"player": "Aria"},
            "n": 2, "seed": 5}


@pytest.fixture(scope="module")
def server(llada_gguf: Path) -> Iterator[ServerThread]:
    with load_engine(llada_gguf, n_threads=1) as engine:
        with ServerThread(engine, ServeConfig(port=0, quiet=True)) as st:
            yield st


def post(st: ServerThread, body: dict) -> tuple[int, dict]:
    host, port = st.server.address
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("POST", "/v1/infill", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize("extra", [{}, {"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.9},
                                   {"template": "{___:2} and {___:1-3}!"}, {"template": None, "length": "bark"}])
def test_infill_runs_without_numpy_warnings(server, extra) -> None:
    body = {k: v for k, v in {**TEMPLATE, **extra}.items() if v is not None}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning in the worker thread fails the request (500)
        status, answer = post(server, body)
    assert status == 200, answer
    assert len(answer["choices"]) == 2 and all(c["text"] for c in answer["choices"])


@pytest.mark.parametrize("extra, setting", [
    ({"temperature": 1e-40}, "temperature"),  # 1/T overflows float32: the logits become inf
    ({"temperature": 1e-320}, "temperature"),  # 1/T is inf even in double
    ({"dgchat": {"t_min": 0.0, "t_max": 1e-320}}, "t-max"),  # DiffusionGemma's schedule ends at t_max / steps
])
def test_a_temperature_whose_reciprocal_overflows_is_refused(server, extra, setting) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        status, answer = post(server, {**TEMPLATE, **extra})
    assert status == 400, answer
    assert f"--{setting} must be" in answer["error"]["message"]


def test_tiny_temperatures_are_refused_everywhere() -> None:
    for params in (DiffusionParams(temperature=MIN_TEMPERATURE / 10), DiffusionParams(temperature=1e-320),
                   DiffusionParams(t_min=0.0, t_max=MIN_TEMPERATURE / 10), DiffusionParams(t_min=1e-40, t_max=0.8)):
        with pytest.raises(InvalidParameterError, match="at least"):
            params.validate()
    for ok in (DiffusionParams(temperature=0.0), DiffusionParams(temperature=MIN_TEMPERATURE),
               DiffusionParams(t_min=0.0, t_max=MIN_TEMPERATURE)):
        ok.validate()


@pytest.mark.skipif(bundled_model_path() is None, reason="this installation has no bundled model")
@pytest.mark.parametrize("place", ["host", "backend"])
def test_bundled_model_infill_without_numpy_warnings(place) -> None:
    """The uniform-state path (DiffusionGemma: self-conditioning, entropy-bound sampler, causal
    scoring of hole lengths) on the host and on the engine's head."""
    from dgchat.model_backend import llamacpp
    from dgchat.npc.cards import parse_card
    from dgchat.npc.generator import LineSpec, NpcGenerator

    if place == "backend" and not llamacpp.engine_info().backend_sampler:
        pytest.skip("this llama-cpp-python has no diffusion head")
    with load_engine(bundled_model_path(), n_threads=2) as engine, warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = LineSpec(card=parse_card({"name": "Captain Brann"}), template=TEMPLATE["template"],
                        variables={"player": "Aria"}, count=2, seed=5, params=DiffusionParams(sampler_on=place))
        batch = NpcGenerator(engine).generate(spec)
    assert all(v.text.startswith("Halt, Aria! None may pass the ") for v in batch.variants)
