"""`import dgchat.hub` loads neither llama.cpp nor huggingface_hub (docs/MODELS.md): `dgchat --help`
imports it, and the hub's measurements load llama.cpp when they run (hub/util.llamacpp_module)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_importing_the_hub_loads_no_engine_and_no_hub_client() -> None:
    code = "import json, sys\nimport dgchat.hub\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    modules = set(json.loads(done.stdout))
    assert not modules & {"llama_cpp", "huggingface_hub", "textual", "dgchat.model_backend.llamacpp", "dgchat.npc"}
