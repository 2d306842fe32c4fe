"""A chat answer being generated, decoupled from the screen that shows it.

`ChatAnswer` is an EngineJob (app/session.py): its worker iterates the engine's events and only
*stores the latest* StepEvent (no message per step, no waiting on the UI); the screen's LiveView
picks it up at the frame rate, so the generation never waits on rendering. The worker also keeps
the denoising history (dgchat.recording: what each step changed, a few microseconds a step), so
every step can be replayed later even when the screen drew only some of them. When the answer ends
(or fails) the worker writes the result and its recording to the store itself.

`ContextCountJob` counts a conversation's tokens the same way (the model's chat template and
tokenizer, on a worker thread) when no answer just did: another model, another branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from dgchat.app.model_source import ModelSource
from dgchat.app.session import Engine, EngineJob
from dgchat.app.store import Store
from dgchat.model_backend.errors import error_text
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.param_resolution import uses_seed
from dgchat.model_backend.params import DiffusionParams
from dgchat.recording.history import HistoryRecorder


def status_for(stop_reason: str) -> str:
    return "stopped" if stop_reason == "cancelled" else "done"


def decided_tokens(engine: Engine, event: StepEvent) -> np.ndarray:
    """The answer so far as it would be kept if stopped now: earlier canvases + decided prefix,
    up to the first end token."""
    tokens = np.concatenate([event.answer_tokens, event.canvas.decided_prefix()]).astype(np.int32)
    for i, token in enumerate(tokens):
        if engine.is_end(int(token)):
            return tokens[:i]
    return tokens


def final_meta(final: FinalEvent, params: DiffusionParams, model_name: str, *,
               block_size: int | None = None, seeded: bool = False) -> dict[str, Any]:
    """What the store keeps with an answer; `block_size`: it was written block after block (block
    diffusion), so its canvases are blocks of that size (the answer's line counts them so);
    `seeded`: the seed changed the answer (param_resolution.uses_seed), so the answer's line shows
    it: the same seed and settings give this version again."""
    stats = final.stats
    meta: dict[str, Any] = {
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
    if block_size and not params.autoregressive:
        meta["block_size"] = int(block_size)
    if seeded:
        meta["seed"] = int(params.seed)
    return meta


class ChatAnswer(EngineJob):
    """One answer to a conversation, as a job on the session's engine.

    The conversation's prompt is rendered here, on the worker thread: the model's chat template is
    untrusted code (bounded in time and memory by model_backend.chat_template) and never runs on
    the UI thread. With a store, the worker itself saves the result (finished, stopped or failed),
    so an answer is kept even if the UI is shutting down at that moment."""

    def __init__(self, messages: list[dict[str, Any]], params: DiffusionParams, *, store: Store | None = None,
                 message_id: int | None = None, model_name: str = "", owner: str = "the chat") -> None:
        super().__init__("answer", owner=owner)
        self.messages = messages
        self.params = params  # resolved
        self.store = store
        self.message_id = message_id
        self.model_name = model_name
        self.final: FinalEvent | None = None
        self.prompt_tokens = 0
        self.steps_seen = 0
        self.recorder: HistoryRecorder | None = None

    def work(self) -> FinalEvent | None:
        engine = self.engine
        assert engine is not None
        prompt = engine.chat_prompt(self.messages)
        self.prompt_tokens = int(prompt.size)
        engine.check_fits(self.prompt_tokens, self.params)
        self.recorder = recorder = HistoryRecorder(engine)
        for event in engine.generate(prompt, self.params, cancel=self.cancel):
            if isinstance(event, StepEvent):
                self.steps_seen += 1
                recorder.add(event)
                self.record(0, event)
            else:
                self.final = event
        return self.final

    def finished(self) -> None:
        if self.error is None:
            self._save()
        else:
            self._save_failure()

    @property
    def context_tokens(self) -> int | None:
        """The conversation with this answer, in tokens (its prompt + the answer), once finished."""
        if self.final is None:
            return None
        # a remote engine cannot count the prompt itself (its prompt array is empty): the server's count
        prompt = self.prompt_tokens or int(self.final.stats.prompt_tokens or 0)
        if not prompt:
            return None
        return prompt + int(self.final.stats.tokens)

    def partial_text(self) -> str:
        event = self.event
        if event is None or self.engine is None:
            return ""
        return self.engine.detokenize(decided_tokens(self.engine, event))

    def recording(self) -> bytes | None:
        """The denoising history, packed for the store (None when no step was recorded)."""
        if self.recorder is None or not self.recorder.steps:
            return None
        return self.recorder.history().to_bytes()

    def _save(self) -> None:
        if self.store is None or self.message_id is None or self.final is None:
            return
        meta = final_meta(self.final, self.params, self.model_name,
                          block_size=self.recorder.block_size if self.recorder is not None else None,
                          seeded=uses_seed(self.params, getattr(self.engine, "info", None)))
        self.store.finish_answer(self.message_id, self.final.text, status_for(self.final.stop_reason), meta,
                                 recording=self.recording())

    def _save_failure(self) -> None:
        if self.store is None or self.message_id is None or self.error is None:
            return
        try:
            text = self.partial_text()
        except Exception:  # noqa: BLE001
            text = ""
        message = error_text(self.error)
        try:
            if text:
                self.store.finish_answer(self.message_id, text, "error", {"error": message, "model": self.model_name},
                                         recording=self.recording())
            else:
                self.store.delete_message(self.message_id)
        except Exception:  # noqa: BLE001 - the store itself may be closing
            pass


@dataclass(frozen=True)
class ContextCount:
    """How many tokens a chat's conversation takes in `model`'s context, as of its message
    `last_id` (the count belongs to that conversation and that tokenizer only)."""

    chat_id: int
    last_id: int | None
    model: ModelSource
    tokens: int


class ContextCountJob(EngineJob):
    """Counts a conversation as the model reads it: its chat template (untrusted, so on the
    worker thread, never the UI thread), its tokenizer. Takes milliseconds; the result is a
    ContextCount."""

    def __init__(self, messages: list[dict[str, Any]], *, chat_id: int, last_id: int | None, model: ModelSource,
                 answer_pending: bool) -> None:
        super().__init__("token count", owner="the chat's token count")
        self.messages = messages
        self.chat_id = chat_id
        self.last_id = last_id
        self.model = model
        self.answer_pending = answer_pending  # the conversation ends with a prompt: count its answer's header too

    def work(self) -> ContextCount | None:
        engine = self.engine
        assert engine is not None
        if not engine.counts_tokens:
            return None  # no tokenizer here (a server's model): the next answer brings the server's count
        tokens = engine.chat_prompt(self.messages, add_generation_prompt=self.answer_pending)
        return ContextCount(self.chat_id, self.last_id, self.model, int(tokens.size))
