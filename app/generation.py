"""One answer being generated, decoupled from the screen that shows it.

The worker thread runs `LiveGeneration.run()`: it iterates the engine's events and only *stores the
latest* StepEvent (one attribute assignment, no message per step, no waiting on the UI). The UI
polls `latest` from a timer at the configured refresh rate, so the generation never waits on
rendering and the screen never falls behind by more than one frame.

When the answer ends (or fails) the worker writes the result to the store itself, so a finished
or stopped answer is saved even if the UI is shutting down at that moment.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dgchat.app.store import Store
from dgchat.model_backend.canvas import Cell
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.params import DiffusionParams


def status_for(stop_reason: str) -> str:
    return "stopped" if stop_reason == "cancelled" else "done"


def decided_tokens(engine: Any, event: StepEvent) -> np.ndarray:
    """The answer so far as it would be kept if stopped now: earlier canvases + decided prefix."""
    state = event.canvas.state
    undecided = np.flatnonzero(state == Cell.MASKED)
    prefix = event.canvas.tokens[: int(undecided[0]) if undecided.size else state.size]
    tokens = np.concatenate([event.answer_tokens, prefix]).astype(np.int32)
    for i, token in enumerate(tokens):
        if engine.is_end(int(token)):
            return tokens[:i]
    return tokens


def final_meta(final: FinalEvent, params: DiffusionParams, model_name: str) -> dict[str, Any]:
    stats = final.stats
    return {
        "model": model_name,
        "engine": final.engine_label,
        "stop_reason": final.stop_reason,
        "stats": {
            "tokens": stats.tokens,
            "steps": stats.steps,
            "canvases": stats.canvases,
            "elapsed_s": round(stats.elapsed_s, 4),
            "tokens_per_s": round(stats.tokens_per_s, 3),
            "prompt_tokens": stats.prompt_tokens,
        },
        "params": {k: v for k, v in params.as_dict().items() if v is not None},
    }


@dataclass
class LiveGeneration:
    engine: Any  # DiffusionEngine
    prompt: np.ndarray | None  # None: rendered from `messages` in the worker thread
    params: DiffusionParams  # resolved
    store: Store | None = None
    message_id: int | None = None
    model_name: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)
    latest: StepEvent | None = None
    final: FinalEvent | None = None
    error: BaseException | None = None
    steps_seen: int = 0
    started_at: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    # the conversation, when `prompt` is None: the model's chat template is untrusted code, so it
    # renders here, on the worker thread (bounded in time and memory by model_backend.chat_template),
    # never on the UI thread
    messages: list[dict[str, Any]] | None = None

    def run(self) -> FinalEvent | None:
        """Drive the engine to the end (call from a worker thread)."""
        self.started_at = time.perf_counter()
        try:
            if self.prompt is None:
                self.prompt = self.engine.chat_prompt(self.messages or [])
                self.engine.check_fits(int(self.prompt.size), self.params)
            for event in self.engine.generate(self.prompt, self.params, cancel=self.cancel):
                if isinstance(event, StepEvent):
                    self.latest = event
                    self.steps_seen += 1
                else:
                    self.final = event
            self._save()
        except BaseException as exc:  # noqa: BLE001 - reported to the UI, never lost in a thread
            self.error = exc
            self._save_failure()
        finally:
            self.done.set()
        return self.final

    def stop(self) -> None:
        self.cancel.set()

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    def partial_text(self) -> str:
        event = self.latest
        if event is None:
            return ""
        return self.engine.detokenize(decided_tokens(self.engine, event))

    def _save(self) -> None:
        if self.store is None or self.message_id is None or self.final is None:
            return
        meta = final_meta(self.final, self.params, self.model_name)
        self.store.finish_answer(self.message_id, self.final.text, status_for(self.final.stop_reason), meta)

    def _save_failure(self) -> None:
        if self.store is None or self.message_id is None:
            return
        try:
            text = self.partial_text()
        except Exception:  # noqa: BLE001
            text = ""
        message = str(self.error) if isinstance(self.error, DgchatError) else f"{type(self.error).__name__}: {self.error}"
        try:
            if text:
                self.store.finish_answer(self.message_id, text, "error", {"error": message, "model": self.model_name})
            else:
                self.store.delete_message(self.message_id)
        except Exception:  # noqa: BLE001 - the store itself may be closing
            pass
