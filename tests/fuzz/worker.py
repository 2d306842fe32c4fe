"""One fuzz worker process: runs cases of one kind and reports how each ended.

    python tests/fuzz/worker.py gguf|safetensors|template

Reads one JSON request per line on stdin, answers one JSON line on stdout:
    {"status": "ok"}                     the input was accepted and used (a generation ran, a file converted)
    {"status": "refused", "detail": ..}  a DgchatError with a one-line message: the expected answer to bad input
    {"status": "bug", "detail": ..}      anything else (a traceback, a multi-line message): a failure
A crash (a signal, e.g. SIGABRT from GGML_ASSERT) or a hang is seen by the runner as the process
dying or not answering; that is why every case runs here and not in the runner.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

MEMORY_LIMIT = 6 * 1024**3  # a case that needs more is a failure (MemoryError), not the machine's problem


def _gguf(request: dict) -> None:
    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.events import FinalEvent
    from dgchat.model_backend.params import DiffusionParams

    engine = load_engine(request["path"], n_threads=1)
    try:
        engine.resolve(DiffusionParams())  # the file's own defaults, as `dgchat generate` would use them
        prompt = engine.chat_prompt([{"role": "system", "content": "You are a guard."},
                                     {"role": "user", "content": "Halt! <|im_end|><end_of_turn> Who goes there?"}])
        params = DiffusionParams(gen_length=8, steps=2, max_tokens=8, seed=request.get("seed", 0))
        final = None
        for event in engine.generate(prompt, params):
            if isinstance(event, FinalEvent):
                final = event
        assert final is not None
        engine.detokenize(final.tokens)
    finally:
        engine.close()


def _safetensors(request: dict) -> None:
    from dgchat.convert import convert

    with tempfile.TemporaryDirectory(dir=request.get("tmp")) as out:
        convert(Path(request["path"]), Path(out) / "out.gguf")


def _template(request: dict) -> None:
    from dgchat.model_backend.chat_template import render_chat

    text = render_chat(request["template"], request["messages"], bos_token="<s>", eos_token="</s>")
    if not isinstance(text, str):
        raise AssertionError(f"render_chat returned {type(text).__name__}")


RUNNERS = {"gguf": _gguf, "safetensors": _safetensors, "template": _template}


def main() -> None:
    kind = sys.argv[1]
    run = RUNNERS[kind]
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ValueError, OSError):
        pass
    from dgchat.model_backend.errors import DgchatError

    for line in sys.stdin:
        request = json.loads(line)
        started = time.monotonic()
        try:
            run(request)
            answer = {"status": "ok"}
        except DgchatError as exc:
            message = str(exc)
            if "\n" in message or not message.strip():
                answer = {"status": "bug", "detail": f"not a one-line error: {message!r}"}
            else:
                answer = {"status": "refused", "detail": message}
        except BaseException as exc:  # noqa: BLE001 - a traceback is what the fuzzer is looking for
            if isinstance(exc, KeyboardInterrupt):
                raise
            answer = {"status": "bug", "detail": "".join(traceback.format_exception(exc))[-3000:]}
        answer["seconds"] = round(time.monotonic() - started, 3)
        answer["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    main()
