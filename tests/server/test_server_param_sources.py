"""`dgchat serve` reports each setting of an answer with its source in the `dgchat` extension
(model_backend/param_resolution): the request's own, the model's, derived by the server."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgchat.model_backend.loader import load_engine
from dgchat.server.app import ServeConfig, ServerThread


@pytest.fixture(scope="module")
def url(llada_gguf: Path) -> Iterator[str]:
    with load_engine(llada_gguf, n_threads=1, precise=True) as engine:
        with ServerThread(engine, ServeConfig(port=0, quiet=True)) as st:
            yield st.url


def _post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as res:
        return json.loads(res.read())


def test_the_extension_names_each_settings_source(url: str) -> None:
    reply = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Who goes there?"}],
                                                 "max_tokens": 8, "temperature": 0.5, "seed": 3,
                                                 "dgchat": {"steps": 4}})
    table = reply["dgchat"]["params"]
    assert table["temperature"] == {"value": 0.5, "source": "request"}
    assert table["steps"] == {"value": 4, "source": "request"}
    assert table["max_tokens"] == {"value": 8, "source": "request"}
    assert table["algorithm"]["source"] in ("family default", "model file")
    assert table["precise"] == {"value": True, "source": "server"}
    assert "seed" not in table and "logit_bias" not in table  # per choice, as from `settings`
    settings = reply["dgchat"]["settings"]
    assert all(settings[k] == row["value"] for k, row in table.items() if k != "precise")
    # a canvas fitted to max_tokens: the server's decision
    plain = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    assert plain["dgchat"]["params"]["gen_length"] == {"value": 8, "source": "derived"}
