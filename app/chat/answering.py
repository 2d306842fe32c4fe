"""Generation control: starting an answer, drawing it live, its end, and Stop.

An answer is a ChatAnswer (app/generation.py) that the model session (app/session.py) runs as a
job on a worker thread. While it runs, a LiveView picks up the latest StepEvent at most
`refresh_hz` times a second and repaints the live canvas; the generation loop never waits for it.
The job's end comes back to the screen as JobDone, and the transcript puts the saved answer where
its canvas was (transcript.py).

Block diffusion (SDAR, BD3LM) writes an answer block after block: the live canvas shows the answer
so far with the current block filling in ("block 12 · step 3/4 · 47 tokens"); the canvas and block
lengths are the model's, fixed (app/settings_modal.py says so).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from dgchat.app.chat.part import ChatPart
from dgchat.app.error_modal import ErrorModal
from dgchat.app.generation import ChatAnswer, ContextCount
from dgchat.app.live_view import LiveView
from dgchat.app.paths import display_name
from dgchat.app.session import EngineJob
from dgchat.app.settings_modal import server_refuses
from dgchat.app.store import Message
from dgchat.app.widgets.canvas import LiveCanvas
from dgchat.app.widgets.conversation import Conversation
from dgchat.app.widgets.message import MessageView
from dgchat.model_backend.errors import DgchatError, InvalidParameterError
from dgchat.model_backend.param_resolution import (
    CHAT,
    Layer,
    merge,
    uses_seed,
    with_fresh_seed,
)
from dgchat.recording.blocks import block_size_of
from textual.containers import VerticalScroll

if TYPE_CHECKING:  # the screen imports every area: only the type checker may look back
    from dgchat.app.chat_screen import ChatScreen

MAX_DEFERRED_STARTS = 100  # 2 s of waiting for the last canvas to go (start)


class AnswerControl(ChatPart):
    """The answer being generated: its job, its live canvas, and where the view follows it."""

    def __init__(self, screen: ChatScreen) -> None:
        super().__init__(screen)
        self.generation: ChatAnswer | None = None
        self.canvas: LiveCanvas | None = None
        self.last_canvas: LiveCanvas | None = None  # kept after the answer ends (the benchmark's repaint counts)
        self.live: LiveView | None = None
        self.pending = False  # a prompt waits for the model to finish loading
        self.following = True  # the view follows the live canvas's text (the user has not scrolled up)
        self._followed_to = 0.0  # where following last scrolled to
        self._last_checkpoint = 0.0
        self._deferred_starts = 0

    @property
    def running(self) -> bool:
        return self.generation is not None and self.generation.running

    def mount(self) -> None:
        """Set up the frame clock; its timers belong to the screen."""
        self.live = LiveView(self.screen, self.draw_frame, self._latest_event, hz=self.app.config.refresh_hz)

    # -- starting -------------------------------------------------------------------------------
    def history_for_model(self, conversation: list[Message] | None = None) -> list[dict[str, str]]:
        """The conversation (the shown version of each turn) as the model's chat messages."""
        chat = self.screen.chat
        assert chat is not None
        messages: list[dict[str, str]] = []
        if chat.system_prompt.strip():
            messages.append({"role": "system", "content": chat.system_prompt})
        for m in self.store.messages(chat.id) if conversation is None else conversation:
            if m.role == "assistant" and not m.content.strip():
                continue
            messages.append({"role": m.role, "content": m.content})
        return messages

    def regenerate(self) -> None:
        screen = self.screen
        if screen.refuse_while_answering() or screen.chat is None:
            return
        messages = self.store.messages(screen.chat.id)
        if not messages:
            screen.notify("Nothing to regenerate yet.")
            return
        # the answer (if the conversation ends with one) is kept: the new one becomes its next version
        self.start()

    def start(self) -> None:
        """Answer the chat's last prompt with the chat's model and settings. When the conversation
        already ends with an answer (regenerate), the new answer is another version of it: the
        model reads the conversation up to the prompt, and the earlier answer is kept."""
        screen = self.screen
        session = self.session
        if screen.chat is None or self.running:
            return
        if screen.query("#live-canvas") and self._deferred_starts < MAX_DEFERRED_STARTS:
            # the last answer's canvas is still being swapped for its text (a frame or two: a prompt
            # sent the moment the answer ended): its canvas goes first, then this one comes
            self._deferred_starts += 1
            screen.set_timer(0.02, screen.start_generation)
            return
        self._deferred_starts = 0
        wanted = screen.model_path_for(screen.chat)
        if wanted is None:
            screen.notify("No model configured: your message is saved. Open one with Ctrl+P → model: open…",
                          severity="warning", timeout=8)
            return
        engine = session.loaded(wanted)
        if engine is None or session.loading_path is not None:
            if session.busy:
                screen.notify(f"Your message is saved. {session.busy_text()}", severity="warning")
                return
            self.pending = True
            if session.load(wanted):
                screen.notify(f"Loading {display_name(wanted)}; your message will be answered when it is ready.")
            return
        if session.busy:
            count_job = screen.status_line.count_job
            if count_job is not None and session.job is count_job:
                self.pending = True  # counting takes milliseconds: answer when it is done ("idle")
                return
            screen.notify(f"Your message is saved. {session.busy_text()}", severity="warning")
            return
        try:
            # every answer draws its own seed unless the config or the chat fixed one, so that a
            # regenerate gives another answer; the seed is stored with the answer's params
            if screen.chat:
                # the chat's own settings, asked before resolving (which leaves out what a server
                # cannot take, as it should the config's): a choice of this chat is refused by name
                own, _sources = merge([Layer.of(CHAT, dict(screen.chat.params))])
                refused = engine.unsupported(own)
                if refused:
                    raise InvalidParameterError(server_refuses(refused))
            params = with_fresh_seed(screen.resolved_params(engine)).params
            conversation = self.store.messages(screen.chat.id)
            replacing = conversation.pop() if conversation and conversation[-1].role == "assistant" else None
            messages = self.history_for_model(conversation)
        except DgchatError as exc:
            self.app.push_screen(ErrorModal("Cannot generate", str(exc)))
            return
        if replacing is not None and replacing.content.strip() and not uses_seed(params, getattr(engine, "info", None)):
            screen.notify("These settings are greedy (temperature 0): the new version will be the same answer. "
                          "Raise the temperature in the chat's settings for a different one.", timeout=8)
        answer = self.store.begin_answer(
            screen.chat.id, {"model": session.model_name(wanted), "model_path": str(wanted)},
            version_of=replacing.id if replacing is not None else None,
        )
        generation = ChatAnswer(messages, params, store=self.store, message_id=answer.id,
                                model_name=session.model_name(wanted))
        if not session.start(generation, screen):
            self.store.delete_message(answer.id)  # the replaced answer is the shown version again
            screen.notify("The model is not ready; your message is saved (Ctrl+R answers it).", severity="warning")
            return
        screen.transcript.focus_new_answer = False
        if replacing is not None:
            view = screen.view_for(replacing.id)
            if view is not None:
                if screen.focused is not None and (screen.focused is view or view in screen.focused.ancestors):
                    # `r` on the answer: the new version takes its place and its focus, not the
                    # prompt message above it; meanwhile the composer holds the focus
                    screen.transcript.focus_new_answer = True
                    screen.composer.focus()
                view.add_class("-removed")
                view.remove()
            if not replacing.content.strip() and replacing.status != "generating":
                self.store.delete_message(replacing.id)  # nothing was decided: not worth a version
        self.generation = generation
        self._last_checkpoint = time.monotonic()
        # a block-diffusion answer is block after block: the canvas counts blocks and keeps room for
        # the tokens to come, up to the answer's length (--ar decodes the same model token by token)
        self.canvas = LiveCanvas(engine, canvas_length=int(params.gen_length or 0),
                                 block_size=0 if params.autoregressive else block_size_of(engine),
                                 answer_limit=int(params.max_tokens or 0) or None, id="live-canvas",
                                 classes="message -assistant -live")
        self.last_canvas = self.canvas
        conversation = screen.query_one("#conversation", Conversation)
        conversation.live = True
        conversation.mount(self.canvas)
        conversation.scroll_end(animate=False)
        self.following, self._followed_to = True, 0.0
        screen.refresh_bindings()
        assert self.live is not None
        self.live.start()

    # -- drawing --------------------------------------------------------------------------------
    def _latest_event(self) -> Any:
        return self.generation.event if self.generation is not None else None

    def draw_frame(self) -> None:
        """One live frame: the latest step on the canvas, the view kept on its text, and once a
        second the decided text saved."""
        generation = self.generation
        if generation is None:
            return
        event = generation.event
        if event is not None and self.canvas is not None:
            conversation = self.canvas.parent
            assert isinstance(conversation, VerticalScroll)
            self.following = conversation.scroll_y >= self._followed_to - 1  # the user did not scroll up
            grew = self.canvas.show(event)
            if self.following:
                if grew:  # the canvas's new place is known once the layout has run
                    conversation.call_after_refresh(self._follow_text)
                else:
                    self._follow_text()
        now = time.monotonic()
        if event is not None and generation.running and now - self._last_checkpoint >= 1.0:
            self._last_checkpoint = now
            try:  # a crash from here on still leaves the decided text in the database
                self.store.checkpoint_answer(generation.message_id, generation.partial_text())
            except Exception:  # noqa: BLE001
                pass

    def _follow_text(self) -> None:
        """Keep the canvas's last line of text in view. Not the end of the conversation: the canvas
        keeps empty room below its text for the tokens still to come, and a canvas taller than the
        view scrolled to its end would show only that room. Scrolling repaints the whole screen, so
        it happens only when the text's end is below the view."""
        canvas = self.canvas
        if canvas is None or not isinstance(canvas.parent, VerticalScroll):
            return
        conversation = canvas.parent
        text_end = canvas.virtual_region.y + canvas.text_lines
        view = conversation.scrollable_content_region.height
        if text_end > conversation.scroll_y + view:
            target = min(conversation.max_scroll_y, text_end - view)
            conversation.scroll_to(y=target, animate=False, immediate=True)
        self._followed_to = conversation.scroll_y

    # -- the end --------------------------------------------------------------------------------
    def job_done(self, generation: EngineJob) -> None:
        """The session's JobDone for an answer: its text in place of the canvas, its notices."""
        screen = self.screen
        if generation is not self.generation or not isinstance(generation, ChatAnswer):
            return
        if self.live is not None:
            self.live.stop()
        self.generation = None
        canvas, self.canvas = self.canvas, None
        screen.refresh_bindings()
        saved = self.store.get_message(generation.message_id) if generation.message_id else None
        conversation = screen.query_one("#conversation", Conversation)
        if saved is not None and (screen.chat is None or saved.chat_id == screen.chat.id):
            screen.call_later(screen.transcript.replace_canvas, canvas, MessageView(saved))
        else:
            if canvas is not None:
                canvas.remove()
            conversation.end_live(self.following)
            if saved is None and screen.chat is not None:
                screen.transcript.render()  # nothing was kept: a replaced answer is shown again
        tokens = generation.context_tokens
        wanted = screen.model_path_for(screen.chat)
        if screen.chat is not None and saved is not None and tokens is not None and wanted is not None:
            # the answer's own prompt count + its tokens: no second pass through the template
            screen.status_line.answered(ContextCount(screen.chat.id, saved.id, wanted, tokens))
        else:
            screen.status_line.answered(None)  # counted once the engine is free ("idle")
        if generation.error is not None:
            self.app.push_screen(ErrorModal("Generation failed", generation.error_text()))
        elif generation.final is not None and generation.final.stop_reason == "cancelled":
            screen.notify("Stopped; the partial answer is kept.")
        screen.chat = self.store.get_chat(screen.chat.id) if screen.chat else None
        screen.refresh_sidebar()
        screen.update_status()

    def stop(self) -> None:
        """Escape: the job's cancel is set, the decode ends at the next step, the partial answer is kept."""
        if self.generation is not None and self.generation.running:
            self.generation.stop()
            if self.canvas is not None:
                self.canvas.mark_stopping()
