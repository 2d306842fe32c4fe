"""Write the cache-capable fixture README's fast-decoding table was measured on.

    python tests/bench/make_bench_fixture.py /tmp/wide-llama.gguf
    dgchat bench -m /tmp/wide-llama.gguf --lengths 256 --prompt-tokens 256 --concurrency 1,4

A masked-diffusion model in the `llama` layout (non-causal attention, a mask token, KV memory):
hidden 256, 6 layers, 8 heads (4 KV), FFN 768, random weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.gguf_models import TinySpec, write_tiny_gguf  # noqa: E402

SPEC = TinySpec(arch="llama", n_embd=256, n_layer=6, n_head=8, n_head_kv=4, n_ff=768, n_ctx=4096)

if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "wide-llama.gguf")
    print(write_tiny_gguf(out, SPEC))
