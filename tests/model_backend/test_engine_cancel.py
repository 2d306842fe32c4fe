"""A generation's cancel flag never outlives it: the engine's watcher thread forwards `cancel` into
llama.cpp's abort flag, and a watcher still running when its generation ends must not raise that
flag for the next one (seen as a spurious 499 from `dgchat serve` after a request that stopped
itself at a stop string, under load)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.params import DiffusionParams

PARAMS = DiffusionParams(seed=1, gen_length=16, steps=4, max_tokens=16)


class LateCancel(threading.Event):
    """A cancel flag whose set state is read only once `released` is set (or after 2 s): holds the
    engine's watcher between seeing the flag and acting on it, the window the race needs."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()
        self.seen = threading.Event()

    def is_set(self) -> bool:
        value = super().is_set()
        if value:
            self.seen.set()
            self.released.wait(2.0)
        return value


def _answer(engine: DiffusionEngine, prompt, **kw) -> FinalEvent:
    return [e for e in engine.generate(prompt, PARAMS, **kw) if isinstance(e, FinalEvent)][0]


def test_a_late_watcher_does_not_cancel_the_next_generation(llada_gguf: Path) -> None:
    with load_engine(llada_gguf, n_threads=1) as engine:
        prompt = engine.chat_prompt([{"role": "user", "content": "Who goes there?"}])
        first = _answer(engine, prompt)
        cancel = LateCancel()

        def events():
            yield from ()  # the generation's work is done; it asks to stop, as a stop string does
            cancel.set()
            assert cancel.seen.wait(2.0)  # the watcher is between seeing the flag and raising it
            yield "last"

        assert list(engine._with_cancel(events(), cancel)) == ["last"]
        cancel.released.set()
        time.sleep(0.1)  # room for a watcher that outlived its generation to raise the flag
        assert not engine._ctx.cancel_event.is_set()
        again = _answer(engine, prompt, cancel=threading.Event())
        assert again.stop_reason == first.stop_reason and again.tokens.tolist() == first.tokens.tolist()
