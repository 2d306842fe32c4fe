"""The chat screen's status line (#status, app/widgets/status_bar.py): the model, how it runs, and
the conversation's size in the model's context.

The size ("1,234 / 4,096 tokens") is taken from each answer's own prompt count, or counted by a
short ContextCountJob when the model or the branch changed.

Block diffusion (SDAR, BD3LM) reads "4 steps/block · max 512 tokens" (the engine's label names the
variant and the block size).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgchat.app.chat.part import ChatPart
from dgchat.app.generation import ContextCount, ContextCountJob
from dgchat.app.model_source import ModelSource
from dgchat.app.sampler_text import temperature_text
from dgchat.app.session import Engine
from dgchat.app.store import Message
from dgchat.app.widgets.status_bar import StatusBar
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.params import DiffusionParams
from dgchat.recording.blocks import block_size_of

if TYPE_CHECKING:  # the screen imports every area: only the type checker may look back
    from dgchat.app.chat_screen import ChatScreen


def answer_context_tokens(message: Message, model: ModelSource) -> int | None:
    """The conversation's size that an answer by `model` counted for itself (its prompt + its
    tokens), or None when another model (tokenizer) wrote it or it has no count."""
    if message.role != "assistant" or message.meta.get("model_path") != str(model):
        return None
    stats = message.meta.get("stats")
    if not isinstance(stats, dict):
        return None
    prompt, tokens = stats.get("prompt_tokens"), stats.get("tokens")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (prompt, tokens)) or not prompt:
        return None
    return prompt + tokens


def answer_room(engine: Engine, p: DiffusionParams | None) -> int:
    """Context the next answer takes: its canvas, or for a block answer its length and a block."""
    if p is None:
        return 0
    block = block_size_of(engine)
    if block:
        return int(p.max_tokens or 0) + block
    return int(p.gen_length or 0)


class StatusLine(ChatPart):
    """What the status line says, and the token count it ends with."""

    def __init__(self, screen: ChatScreen) -> None:
        super().__init__(screen)
        self.context_count: ContextCount | None = None  # the conversation's size, for the status line
        self.count_job: ContextCountJob | None = None
        self._count_wanted = False  # a count waits for the engine to be free, or for this screen
        self._count_fresh = False  # ... and must not reuse an earlier count (see recount)

    def update(self) -> None:
        screen = self.screen
        try:
            bar = screen.query_one(StatusBar)
        except Exception:  # noqa: BLE001 - not composed yet
            return
        session = self.session
        wanted = screen.model_path_for(screen.chat)
        engine = session.loaded(wanted)
        bar.set_loading(session.load_fraction if session.loading_path is not None else None)
        if engine is None or session.loading_path is not None:
            bar.set_parts(session.status_parts(wanted, when="it loads when you send"))
            bar.set_context(None)
            return
        try:
            p = screen.effective_params(engine)
            name = session.model_name(wanted)
            temperature = f"T {temperature_text(p, engine.info.uniform_state)}"
            threshold = [(f"threshold {p.threshold:g}", 3)] if p.threshold is not None else []
            # ranks: what a narrow line leaves out first (status_bar.fit_parts): the engine's label
            # (also in model: info), then the algorithm, then the sizes; the temperature stays longest
            # (it says whether answers are sampled)
            if block_size_of(engine) and not p.autoregressive:
                # the label says "block diffusion (SDAR, blocks of 4)": the canvas is one block
                # the label names the variant and its block size: it goes after the sizes
                bar.set_parts([(name, 0), (engine.label, 2), (f"{p.steps} steps/block", 2),
                               (f"max {p.max_tokens} tokens", 3), (temperature, 1), *threshold])
            elif not engine.text_only:
                blocks = [(f"block {p.block_length}", 3)] if p.block_length else []
                bar.set_parts([(name, 0), (engine.label, 4), (f"steps {p.steps}", 2), (f"canvas {p.gen_length}", 2),
                               *blocks, (p.algorithm, 3), *threshold, (temperature, 1)])
            else:  # not a dgchat server: it samples with its own settings and sends text only
                bar.set_parts([(name, 0), (engine.label, 4), ("text only", 1), (f"max tokens {p.max_tokens}", 2)])
        except DgchatError as exc:
            bar.set_text(f"{session.model_name(wanted)} · settings problem: {exc}")
            p = None
        context = self.context_count
        if context is not None and screen.chat is not None and context.chat_id == screen.chat.id \
                and context.model == wanted:
            bar.set_context(context.tokens, engine.n_ctx_max, answer_room(engine, p))
        else:
            bar.set_context(None)

    # -- the conversation's size in the model's context -----------------------------------------
    def recount(self, *, fresh: bool = False) -> None:
        """Bring the status line's token count up to date for the conversation shown: from its
        last answer when this model wrote it (the answer counted its own prompt), else counted by
        a short job on the engine, now or as soon as the engine is free. `fresh`: the system
        prompt changed, so an earlier count or an answer's own count no longer holds."""
        screen = self.screen
        fresh = fresh or self._count_fresh
        self._count_wanted = self._count_fresh = False
        chat = screen.chat
        wanted = screen.model_path_for(chat)
        if chat is None or wanted is None:
            self.context_count = None
            self.update()
            return
        conversation = self.store.messages(chat.id)
        last = conversation[-1] if conversation else None
        last_id = last.id if last is not None else None
        known = self.context_count
        if (not fresh and known is not None and known.chat_id == chat.id and known.model == wanted
                and known.last_id == last_id):
            self.update()
            return
        self.context_count = None
        own = None if fresh or last is None else answer_context_tokens(last, wanted)
        if own is not None:
            self.context_count = ContextCount(chat.id, last_id, wanted, own)
        elif last is not None and self.session.loaded(wanted) is not None and self.session.loading_path is None:
            if screen.generating or self.session.busy or not screen.is_current:
                # counted on the "idle" change, or when this screen is back: never take the engine
                # from under a tool screen (NPC workshop, drafting) about to use it
                self._count_wanted, self._count_fresh = True, fresh
            else:
                job = ContextCountJob(screen.answers.history_for_model(conversation), chat_id=chat.id,
                                      last_id=last_id, model=wanted, answer_pending=last.role == "user")
                if self.session.start(job, screen):
                    self.count_job = job
        self.update()

    def recount_if_wanted(self) -> None:
        """The engine is free or the screen is back: a count that waited for it runs now."""
        if self._count_wanted:
            self.recount()

    def answered(self, count: ContextCount | None) -> None:
        """An answer ended: its own count (prompt + tokens), or None to count once the engine is free."""
        if count is not None:
            self.context_count = count
        else:
            self._count_wanted = True

    def counted(self, job: ContextCountJob) -> None:
        """The session's JobDone for a count."""
        screen = self.screen
        if job is self.count_job:
            self.count_job = None
        result = job.result
        # a template that fails to render shows no count: the next answer says what is wrong
        if job.error is None and isinstance(result, ContextCount) and screen.chat is not None \
                and result.chat_id == screen.chat.id:
            conversation = self.store.messages(screen.chat.id)
            if (conversation[-1].id if conversation else None) == result.last_id:
                self.context_count = result
            else:
                self._count_wanted = True  # the conversation moved on meanwhile
        self.update()
