"""The chat screen: saved chats on the left, the conversation, the prompt box, the status line.

Sending stores the user message (committed) before anything else, then asks the model session
(app/session.py) to run the answer as a job. While it runs, a LiveView picks up the latest
StepEvent at most `refresh_hz` times a second and repaints the live canvas; the generation loop
never waits for it.

Versions: regenerating keeps the earlier answers and editing a prompt keeps the earlier prompt
with what followed it (app/store.py keeps each turn's versions). A turn with several versions
shows "‹ 2/3 ›"; [ / ] on the focused message flip between them. The version shown is the
conversation: it is what the model reads for the next prompt and what export writes.

Replay: `p` on an answer loads its recording (the denoising history the answer's worker kept, see
app/generation.py) and shows it in place of the answer's text (app/widgets/replay.py); `x` writes
it as an asciicast (.cast) into the export folder.

The status line ends with the conversation's size in the model's context ("1,234 / 4,096
tokens"), taken from each answer's own prompt count, or counted by a short ContextCountJob when
the model or the branch changed.

Block diffusion (SDAR, BD3LM) writes an answer block after block: the live canvas shows the answer
so far with the current block filling in ("block 12 · step 3/4 · 47 tokens"), and the status line
reads "4 steps/block · max 512 tokens" (the engine's label names the variant and the block
size); the canvas and block lengths are the model's, fixed (app/settings_modal.py says so).
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path
from typing import Any

from dgchat.app.breakpoints import NARROW_BELOW, WIDTH_BREAKPOINTS
from dgchat.app.clipboard import copy_text
from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.edit_modal import EditModal
from dgchat.model_backend.engine_protocol import served
from dgchat.app.error_modal import ErrorModal
from dgchat.app.export import (
    default_export_path,
    default_recording_path,
    export_chat,
    export_dir,
    export_error_text,
    export_problem,
    export_recording,
    export_target,
)
from dgchat.app.generation import ChatAnswer, ContextCount, ContextCountJob
from dgchat.app.live_view import LiveView
from dgchat.app.model_picker import ModelPicker
from dgchat.app.model_ops import save_precise
from dgchat.app.model_source import ModelSource, ServerSource
from dgchat.app.paths import display_name, short_path
from dgchat.app.prompt_modal import PromptModal
from dgchat.app.sampler_text import defaults_text, sources_text, temperature_text
from dgchat.app.search_modal import SearchModal
from dgchat.app.session import Engine, JobDone, ModelChange, ModelSession
from dgchat.app.settings_modal import ChatSettings, SettingsModal, server_refuses
from dgchat.app.store import MAX_RECORDINGS_BYTES_PER_CHAT, Chat, Message
from dgchat.app.widgets.canvas import LiveCanvas
from dgchat.app.widgets.chat_list import ChatList
from dgchat.app.widgets.conversation import Conversation
from dgchat.app.widgets.fitting_footer import FittingFooter
from dgchat.app.widgets.message import MessageView
from dgchat.app.widgets.path_suggester import PathSuggester
from dgchat.app.widgets.prompt_input import PromptInput
from dgchat.app.widgets.replay import DEFAULT_PACE, ReplayView
from dgchat.app.widgets.status_bar import StatusBar
from dgchat.model_backend.errors import DgchatError, InvalidParameterError
from dgchat.model_backend.param_resolution import (CHAT, CONFIG, DEFAULT, Layer, ResolvedParams, resolved_for,
                                                   seed_chosen, uses_seed, with_fresh_seed)
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.model_info import inspect_header
from dgchat.model_backend.params import DiffusionParams
from dgchat.recording.blocks import block_size_of
from dgchat.recording.history import DenoisingHistory, HistoryError
from dgchat.terminal_text import one_line
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Header, Label


def check_model_file(path: str) -> str | None:
    """Why `path` is not a usable model, from its header alone, or None."""
    try:
        inspect_header(read_gguf_header(Path(path).expanduser()))
    except DgchatError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    return None


def _answer_context_tokens(message: Message, model: Path) -> int | None:
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



MAX_DEFERRED_STARTS = 100  # 2 s of waiting for the last canvas to go (start_generation)


class ChatScreen(Screen):
    BINDINGS = [
        Binding("escape", "stop", "Stop", id="chat.stop"),
        Binding("ctrl+n", "new_chat", "New chat", id="chat.new"),
        Binding("ctrl+r", "regenerate", "Regenerate", id="chat.regenerate"),
        Binding("ctrl+g", "edit_last", "Edit prompt", show=False, id="chat.edit_last"),
        # F8 too: some terminals and tmux setups keep Alt for themselves
        Binding("alt+c,f8", "copy_last", "Copy answer", show=False, id="chat.copy_last"),
        Binding("ctrl+s", "export", "Export", show=False, id="chat.export"),
        Binding("ctrl+f", "search", "Search", id="chat.search"),
        Binding("ctrl+o", "settings", "Settings", id="chat.settings"),
        Binding("f2", "rename_chat", "Rename", show=False, id="chat.rename"),
        Binding("ctrl+b", "toggle_sidebar", "Sidebar", show=False, id="chat.toggle_sidebar"),
        Binding("ctrl+l", "focus_prompt", "Prompt", show=False, id="chat.focus_prompt"),
    ]
    # what a short footer leaves out first (app/widgets/fitting_footer.py); F1 and Ctrl+P list them
    FOOTER_DROP_FIRST = ("search", "new_chat")
    # -narrow / -medium / -wide by terminal width (app/breakpoints.py): dgchat.tcss hides the sidebar on
    # narrow terminals; Ctrl+B sets an inline display that wins over that rule, so the user's choice holds
    HORIZONTAL_BREAKPOINTS = WIDTH_BREAKPOINTS
    def __init__(self, open_chat: int | None = None) -> None:
        super().__init__(id="chat-screen")
        self.chat: Chat | None = None
        self._open_at_start = open_chat
        self.generation: ChatAnswer | None = None
        self.canvas: LiveCanvas | None = None
        self.last_canvas: LiveCanvas | None = None
        self.live: LiveView | None = None
        self._last_checkpoint = 0.0
        self._pending = False  # a prompt waits for the model to finish loading
        self._focus_new_answer = False  # the regenerated answer had the focus: its new version gets it
        self._deferred_starts = 0
        self._settings_after_load = False
        self._context_count: ContextCount | None = None  # the conversation's size, for the status line
        self._count_job: ContextCountJob | None = None
        self._count_wanted = False  # a count waits for the engine to be free, or for this screen
        self._count_fresh = False  # ... and must not reuse an earlier count (see recount)
        self._following = True  # the view follows the live canvas's text (the user has not scrolled up)
        self._followed_to = 0.0  # where following last scrolled to

    # -- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        with Horizontal(id="main"):
            with Vertical(id="sidebar"):
                yield Label("Chats", id="sidebar-title")
                yield ChatList(id="chat-list")
            with Vertical(id="chat-pane"):
                yield Conversation(id="conversation")
                # in a box of their own: Textual repaints a live canvas's rows by asking every widget
                # whose container overlaps them for its lines, and the prompt box (a TextArea, which
                # re-applies its theme on each call) cost more than the canvas itself
                with Vertical(id="input-area"):
                    yield PromptInput(id="prompt", placeholder="Message the model — Enter sends, Shift+Enter newline")
                    yield StatusBar(id="status")
        yield FittingFooter()

    @property
    def store(self):
        return self.app.store

    @property
    def session(self) -> ModelSession:
        return self.app.session

    @property
    def generating(self) -> bool:
        return self.generation is not None and self.generation.running

    def on_mount(self) -> None:
        self.live = LiveView(self, self._draw_frame, self._latest_event, hz=self.app.config.refresh_hz)
        self.session.watch(self, self._model_changed)
        self.query_one(PromptInput).set_history(self.store.prompt_history())
        chat_id = self._open_at_start
        if chat_id is None:
            # no --chat: reopen the chat used last (a deleted one leaves a new chat)
            last = self.store.get_setting("last_chat")
            if isinstance(last, int) and not isinstance(last, bool) and self.store.get_chat(last) is not None:
                chat_id = last
        if chat_id is None:
            self.refresh_sidebar()
            self._render_conversation()
        else:
            self.open_chat(chat_id)
        self.update_status()
        self.query_one(PromptInput).focus()

    # -- model state ----------------------------------------------------------------------------
    def model_path_for(self, chat: Chat | None) -> ModelSource | None:
        if chat is not None and chat.model:
            return Path(chat.model).expanduser()
        return self.session.default_path

    def _local_model(self) -> Path | None:
        """The chat's model when it is a file (not a server)."""
        wanted = self.model_path_for(self.chat)
        return wanted if isinstance(wanted, Path) else None

    def _model_changed(self, change: ModelChange) -> None:
        if change.kind == "loaded":
            self.model_ready()
        elif change.kind == "failed":
            self.model_failed()
        elif change.kind == "idle":
            self.update_status()
            if self._pending and self.session.loading_path is None:
                self._pending = False  # the engine was counting tokens when the prompt came
                self.start_generation()
            elif self._count_wanted:
                self.recount()
        else:
            self.update_status()

    def model_ready(self) -> None:
        self.update_status()
        if not self._pending:
            self.recount()  # another tokenizer, another context
        if self._settings_after_load:
            self._settings_after_load = False
            self.action_settings()
        elif self._pending:
            self._pending = False
            self.start_generation()

    def model_failed(self) -> None:
        self._settings_after_load = False
        if self._pending:
            self._pending = False
            self.notify("Your message is saved; it will be answered once a model loads (Ctrl+R).")
        self.update_status()

    def update_status(self) -> None:
        try:
            bar = self.query_one(StatusBar)
        except Exception:  # noqa: BLE001 - not composed yet
            return
        session = self.session
        wanted = self.model_path_for(self.chat)
        engine = session.loaded(wanted)
        bar.set_loading(session.load_fraction if session.loading_path is not None else None)
        if engine is None or session.loading_path is not None:
            bar.set_parts(session.status_parts(wanted, when="it loads when you send"))
            bar.set_context(None)
            return
        try:
            p = self.effective_params(engine)
            name = session.model_name(wanted)
            temperature = f"T {temperature_text(p, engine.info.uniform_state)}"
            threshold = [(f"threshold {p.threshold:g}", 3)] if p.threshold is not None else []
            server = served(engine)
            # ranks: what a narrow line leaves out first (status_bar.fit_parts): the engine's label
            # (also in model: info), then the algorithm, then the sizes; the temperature stays longest
            # (it says whether answers are sampled)
            if block_size_of(engine) and not p.autoregressive:
                # the label says "block diffusion (SDAR, blocks of 4)": the canvas is one block
                # the label names the variant and its block size: it goes after the sizes
                bar.set_parts([(name, 0), (engine.label, 2), (f"{p.steps} steps/block", 2),
                               (f"max {p.max_tokens} tokens", 3), (temperature, 1), *threshold])
            elif server is None or server.is_dgchat:
                blocks = [(f"block {p.block_length}", 3)] if p.block_length else []
                bar.set_parts([(name, 0), (engine.label, 4), (f"steps {p.steps}", 2), (f"canvas {p.gen_length}", 2),
                               *blocks, (p.algorithm, 3), *threshold, (temperature, 1)])
            else:  # not a dgchat server: it samples with its own settings and sends text only
                bar.set_parts([(name, 0), (engine.label, 4), ("text only", 1), (f"max tokens {p.max_tokens}", 2)])
        except DgchatError as exc:
            bar.set_text(f"{session.model_name(wanted)} · settings problem: {exc}")
            p = None
        context = self._context_count
        if context is not None and self.chat is not None and context.chat_id == self.chat.id and context.model == wanted:
            bar.set_context(context.tokens, engine.n_ctx_max, self._answer_room(engine, p))
        else:
            bar.set_context(None)

    @staticmethod
    def _answer_room(engine: Engine, p: DiffusionParams | None) -> int:
        """Context the next answer takes: its canvas, or for a block answer its length and a block."""
        if p is None:
            return 0
        block = block_size_of(engine)
        if block:
            return int(p.max_tokens or 0) + block
        return int(p.gen_length or 0)

    # -- the conversation's size in the model's context -----------------------------------------
    def recount(self, *, fresh: bool = False) -> None:
        """Bring the status line's token count up to date for the conversation shown: from its
        last answer when this model wrote it (the answer counted its own prompt), else counted by
        a short job on the engine, now or as soon as the engine is free. `fresh`: the system
        prompt changed, so an earlier count or an answer's own count no longer holds."""
        fresh = fresh or self._count_fresh
        self._count_wanted = self._count_fresh = False
        chat = self.chat
        wanted = self.model_path_for(chat)
        if chat is None or wanted is None:
            self._context_count = None
            self.update_status()
            return
        conversation = self.store.messages(chat.id)
        last = conversation[-1] if conversation else None
        last_id = last.id if last is not None else None
        known = self._context_count
        if (not fresh and known is not None and known.chat_id == chat.id and known.model == wanted
                and known.last_id == last_id):
            self.update_status()
            return
        self._context_count = None
        own = None if fresh or last is None else _answer_context_tokens(last, wanted)
        if own is not None:
            self._context_count = ContextCount(chat.id, last_id, wanted, own)
        elif last is not None and self.session.loaded(wanted) is not None and self.session.loading_path is None:
            if self.generating or self.session.busy or not self.is_current:
                # counted on the "idle" change, or when this screen is back: never take the engine
                # from under a tool screen (NPC workshop, drafting) about to use it
                self._count_wanted, self._count_fresh = True, fresh
            else:
                job = ContextCountJob(self._history_for_model(conversation), chat_id=chat.id, last_id=last_id,
                                      model=wanted, answer_pending=last.role == "user")
                if self.session.start(job, self):
                    self._count_job = job
        self.update_status()

    @on(events.ScreenResume)
    def _count_when_back(self) -> None:
        if self._count_wanted:
            self.recount()

    def _counted(self, job: ContextCountJob) -> None:
        if job is self._count_job:
            self._count_job = None
        result = job.result
        # a template that fails to render shows no count: the next answer says what is wrong
        if job.error is None and isinstance(result, ContextCount) and self.chat is not None \
                and result.chat_id == self.chat.id:
            conversation = self.store.messages(self.chat.id)
            if (conversation[-1].id if conversation else None) == result.last_id:
                self._context_count = result
            else:
                self._count_wanted = True  # the conversation moved on meanwhile
        self.update_status()

    # -- parameters -----------------------------------------------------------------------------
    def base_params(self, engine: Engine | None = None) -> DiffusionParams:
        """Config [sampler] defaults (unset fields stay None for the model's defaults). On a server
        that cannot take some of them (vLLM takes no diffusion settings) those stay unset: the
        config is for every model, a chat's own settings are not dropped."""
        params = self.app.config.sampler_params()
        server = served(engine)
        if server is not None:
            plain = DiffusionParams()
            params = dataclasses.replace(params, **{n: getattr(plain, n) for n in server.unsupported(params)})
        return params

    def loaded_engine(self) -> Engine | None:
        """The engine for this chat's model when it is loaded, else None."""
        return self.session.loaded(self.model_path_for(self.chat))

    def default_params(self, engine: Engine) -> DiffusionParams:
        """The model's recommended settings over the config's [sampler] table."""
        return self.resolved_params(engine, with_chat=False).params

    def effective_params(self, engine: Engine) -> DiffusionParams:
        return self.resolved_params(engine).params

    def resolved_params(self, engine: Engine, *, with_chat: bool = True) -> ResolvedParams:
        """This chat's settings and where each came from (model_backend/param_resolution): the
        model's (family, file) < the config's [sampler] < the chat's own settings."""
        base = self.base_params(engine)
        config = Layer.of(CONFIG, base)
        if "seed" in self.app.config.sampler:  # `seed = 0` there is a choice too (Layer.of drops defaults)
            config = Layer(CONFIG, {**config.values, "seed": base.seed})
        layers = [config]
        if with_chat and self.chat:
            layers.append(Layer.of(CHAT, dict(self.chat.params)))
        if served(engine) is not None:  # the server's model: what no layer set, the server decided
            return resolved_for(engine, layers, remote=True)
        config_precise = self.app.config.precise
        precise = (bool(getattr(engine, "precise", False)), CONFIG if config_precise is not None else DEFAULT)
        return resolved_for(engine, layers, precise=precise)

    # -- chats ----------------------------------------------------------------------------------
    def refresh_sidebar(self) -> None:
        self.query_one(ChatList).set_chats(self.store.list_chats(), self.chat.id if self.chat else None)
        self.sub_title = one_line(self.chat.title, 200) if self.chat else "New chat"  # the terminal rule

    def _busy(self) -> bool:
        if self.generating:
            self.notify("An answer is being generated — press Esc to stop it first.", severity="warning")
            return True
        return False

    def open_chat(self, chat_id: int, focus_message: int | None = None) -> None:
        if self.chat is not None and self.chat.id == chat_id and focus_message is None:
            return
        if self._busy():
            return
        chat = self.store.get_chat(chat_id)
        if chat is None:
            self.notify(f"No saved chat with id {chat_id}.", severity="error")
            return
        self.chat = chat
        self._pending = False
        self.store.set_setting("last_chat", chat_id)
        if focus_message is not None and all(m.id != focus_message for m in self.store.messages(chat_id)):
            self.store.show_version(focus_message)  # a search hit in an older version: show that version
        self.refresh_sidebar()
        self._render_conversation(focus_message)
        wanted = self.model_path_for(chat)
        if wanted is not None and self.session.loaded(wanted) is None and self.session.loading_path is None:
            self.session.load(wanted)
        self.recount()

    def _new_chat_row(self) -> Chat:
        return self.store.create_chat(system_prompt=self.app.config.system_prompt)

    def ensure_chat(self) -> Chat:
        if self.chat is None:
            self.chat = self._new_chat_row()
            self.store.set_setting("last_chat", self.chat.id)  # the next start reopens it
        return self.chat

    def _render_conversation(self, focus_message: int | None = None) -> None:
        conversation = self.query_one("#conversation", Conversation)
        for child in conversation.children:
            child.add_class("-removed")
        conversation.remove_children()
        self.canvas = None
        conversation.live = False
        if self.chat is None:
            conversation.mount(Label(
                "New chat — type below and press Enter.  F1 keys · Ctrl+P commands · Ctrl+O settings",
                classes="conversation--hint",
            ))
            return
        views = [MessageView(m) for m in self.store.messages(self.chat.id)]
        if views:
            conversation.mount_all(views)
        else:
            conversation.mount(Label("Empty chat. Type below and press Enter.", classes="conversation--hint"))
        if focus_message is not None:
            target = next((v for v in views if v.message.id == focus_message), None)
            if target is not None:
                conversation.follow(False)  # the view goes to that message, not to the end
                self.call_after_refresh(self._focus_view, target)
                return
        conversation.follow()  # at the latest message, and kept there as the messages lay out

    def view_for(self, message_id: int) -> MessageView | None:
        """The widget showing a message (message ids are not widget ids: re-renders reuse them)."""
        for view in self.query(MessageView):
            if view.message.id == message_id and not view.has_class("-removed"):
                return view
        return None

    def _focus_view(self, view: MessageView) -> None:
        view.focus()
        view.scroll_visible(animate=False, top=True)

    # -- sending --------------------------------------------------------------------------------
    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        event.stop()
        self.send(event.text)

    def send(self, text: str) -> None:
        if self._busy():
            return
        chat = self.ensure_chat()
        message = self.store.add_message(chat.id, "user", text)  # durable before anything runs
        prompt = self.query_one(PromptInput)
        prompt.clear_prompt()
        prompt.set_history(self.store.prompt_history())
        self.chat = self.store.get_chat(chat.id)
        self.refresh_sidebar()
        conversation = self.query_one("#conversation", Conversation)
        conversation.query(".conversation--hint").remove()
        conversation.mount(MessageView(message))
        conversation.follow()  # sending follows the conversation to its end again
        # start once the prompt is on screen: that layout then does not compete with the first steps
        self.call_after_refresh(self.start_generation)

    def _history_for_model(self, conversation: list[Message] | None = None) -> list[dict[str, str]]:
        """The conversation (the shown version of each turn) as the model's chat messages."""
        assert self.chat is not None
        messages: list[dict[str, str]] = []
        if self.chat.system_prompt.strip():
            messages.append({"role": "system", "content": self.chat.system_prompt})
        for m in self.store.messages(self.chat.id) if conversation is None else conversation:
            if m.role == "assistant" and not m.content.strip():
                continue
            messages.append({"role": m.role, "content": m.content})
        return messages

    def start_generation(self) -> None:
        """Answer the chat's last prompt with the chat's model and settings. When the conversation
        already ends with an answer (regenerate), the new answer is another version of it: the
        model reads the conversation up to the prompt, and the earlier answer is kept."""
        session = self.session
        if self.chat is None or self.generating:
            return
        if self.query("#live-canvas") and self._deferred_starts < MAX_DEFERRED_STARTS:
            # the last answer's canvas is still being swapped for its text (a frame or two: a prompt
            # sent the moment the answer ended): its canvas goes first, then this one comes
            self._deferred_starts += 1
            self.set_timer(0.02, self.start_generation)
            return
        self._deferred_starts = 0
        wanted = self.model_path_for(self.chat)
        if wanted is None:
            self.notify("No model configured: your message is saved. Open one with Ctrl+P → model: open…",
                        severity="warning", timeout=8)
            return
        engine = session.loaded(wanted)
        if engine is None or session.loading_path is not None:
            if session.busy:
                self.notify(f"Your message is saved. {session.busy_text()}", severity="warning")
                return
            self._pending = True
            if session.load(wanted):
                self.notify(f"Loading {display_name(wanted)}; your message will be answered when it is ready.")
            return
        if session.busy:
            if self._count_job is not None and session.job is self._count_job:
                self._pending = True  # counting takes milliseconds: answer when it is done ("idle")
                return
            self.notify(f"Your message is saved. {session.busy_text()}", severity="warning")
            return
        try:
            # every answer draws its own seed unless the config or the chat fixed one, so that a
            # regenerate gives another answer; the seed is stored with the answer's params
            params = with_fresh_seed(self.resolved_params(engine)).params
            server = served(engine)
            refused = server.unsupported(params) if server is not None else []
            if refused:  # the chat's own settings (the config's are left out): say which fields
                raise InvalidParameterError(server_refuses(refused))
            conversation = self.store.messages(self.chat.id)
            replacing = conversation.pop() if conversation and conversation[-1].role == "assistant" else None
            messages = self._history_for_model(conversation)
        except DgchatError as exc:
            self.app.push_screen(ErrorModal("Cannot generate", str(exc)))
            return
        if replacing is not None and replacing.content.strip() and not uses_seed(params, getattr(engine, "info", None)):
            self.notify("These settings are greedy (temperature 0): the new version will be the same answer. "
                        "Raise the temperature in the chat's settings for a different one.", timeout=8)
        answer = self.store.begin_answer(
            self.chat.id, {"model": session.model_name(wanted), "model_path": str(wanted)},
            version_of=replacing.id if replacing is not None else None,
        )
        generation = ChatAnswer(messages, params, store=self.store, message_id=answer.id,
                                model_name=session.model_name(wanted))
        if not session.start(generation, self):
            self.store.delete_message(answer.id)  # the replaced answer is the shown version again
            self.notify("The model is not ready; your message is saved (Ctrl+R answers it).", severity="warning")
            return
        self._focus_new_answer = False
        if replacing is not None:
            view = self.view_for(replacing.id)
            if view is not None:
                if self.focused is not None and (self.focused is view or view in self.focused.ancestors):
                    # `r` on the answer: the new version takes its place and its focus, not the
                    # prompt message above it; meanwhile the composer holds the focus
                    self._focus_new_answer = True
                    self.query_one(PromptInput).focus()
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
        self.last_canvas = self.canvas  # kept after the answer ends (repaint counts for the benchmark)
        conversation = self.query_one("#conversation", Conversation)
        conversation.live = True
        conversation.mount(self.canvas)
        conversation.scroll_end(animate=False)
        self._following, self._followed_to = True, 0.0
        self.refresh_bindings()
        assert self.live is not None
        self.live.start()

    def _latest_event(self) -> Any:
        return self.generation.event if self.generation is not None else None

    def _draw_frame(self) -> None:
        generation = self.generation
        if generation is None:
            return
        event = generation.event
        if event is not None and self.canvas is not None:
            conversation = self.canvas.parent
            assert isinstance(conversation, VerticalScroll)
            self._following = conversation.scroll_y >= self._followed_to - 1  # the user did not scroll up
            grew = self.canvas.show(event)
            if self._following:
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

    def on_job_done(self, message: JobDone) -> None:
        if isinstance(message.job, ContextCountJob):
            self._counted(message.job)
            return
        generation = message.job
        if generation is not self.generation or not isinstance(generation, ChatAnswer):
            return
        if self.live is not None:
            self.live.stop()
        self.generation = None
        canvas, self.canvas = self.canvas, None
        self.refresh_bindings()
        saved = self.store.get_message(generation.message_id) if generation.message_id else None
        conversation = self.query_one("#conversation", Conversation)
        if saved is not None and (self.chat is None or saved.chat_id == self.chat.id):
            self.call_later(self._replace_canvas, canvas, MessageView(saved))
        else:
            if canvas is not None:
                canvas.remove()
            conversation.end_live(self._following)
            if saved is None and self.chat is not None:
                self._render_conversation()  # nothing was kept: a replaced answer is shown again
        tokens = generation.context_tokens
        wanted = self.model_path_for(self.chat)
        if self.chat is not None and saved is not None and tokens is not None and wanted is not None:
            # the answer's own prompt count + its tokens: no second pass through the template
            self._context_count = ContextCount(self.chat.id, saved.id, wanted, tokens)
        else:
            self._count_wanted = True  # counted once the engine is free ("idle")
        if generation.error is not None:
            self.app.push_screen(ErrorModal("Generation failed", generation.error_text()))
        elif generation.final is not None and generation.final.stop_reason == "cancelled":
            self.notify("Stopped; the partial answer is kept.")
        self.chat = self.store.get_chat(self.chat.id) if self.chat else None
        self.refresh_sidebar()
        self.update_status()

    async def _replace_canvas(self, canvas: LiveCanvas | None, view: MessageView) -> None:
        """Put the finished answer where its canvas was, in one frame: the answer's view is mounted
        invisible beside the canvas, and only once its Markdown is parsed and laid out (Textual parses
        on a worker thread, tens of milliseconds) do the two swap, in one batch. Removing the canvas
        first would leave the answer off the screen meanwhile.

        The answer may be shorter than its canvas (a canvas keeps room for tokens to come; a
        model's single line breaks are one paragraph in Markdown): a view scrolled down the canvas
        would then show the empty space past the new end for a frame, until the scroll is clamped.
        The answer is laid out before the swap (invisible, not undisplayed) so that the scroll
        position is moved to the new end in the same batch."""
        conversation = self.query_one("#conversation", Conversation)
        if canvas is None or canvas.parent is not conversation:
            if canvas is not None:
                canvas.remove()
            await conversation.mount(view)
            conversation.end_live(True)
            self._focus_regenerated(view)
            return
        view.styles.visibility = "hidden"  # laid out below the canvas (its height known), not drawn
        await conversation.mount(view, after=canvas)
        conversation.call_after_refresh(self._swap_canvas, canvas, view)

    def _swap_canvas(self, canvas: LiveCanvas, view: MessageView) -> None:
        """The second half of _replace_canvas, once the answer is laid out."""
        conversation = self.query_one("#conversation", Conversation)
        follow = self._following
        if canvas.parent is not conversation or view.parent is not conversation:
            conversation.end_live(follow)
            return  # the conversation was redrawn meanwhile (another chat opened)
        with self.app.batch_update():
            # where the view may be once the canvas is gone: at most the new end (the canvas's room
            # and lines leave the conversation's height)
            end = max(0, conversation.virtual_size.height - canvas.outer_size.height
                      - conversation.scrollable_content_region.height)
            if follow or conversation.scroll_y > end:
                conversation.scroll_to(y=end, animate=False, immediate=True)
            canvas.display = False
            view.styles.visibility = "visible"
        canvas.remove()
        conversation.end_live(follow)
        self._focus_regenerated(view)

    def _focus_regenerated(self, view: MessageView) -> None:
        """Give a regenerated answer's focus to its new version, unless the person moved on meanwhile
        (typing in the composer, another message)."""
        focus_it, self._focus_new_answer = self._focus_new_answer, False
        prompt = self.query_one(PromptInput)
        if focus_it and self.focused is prompt and not prompt.text:
            view.focus(scroll_visible=False)

    def on_unmount(self) -> None:
        # the app is going away without Ctrl+Q (e.g. a signal): still end the answer; the worker
        # saves it as stopped
        if self.generation is not None:
            self.generation.stop()

    # -- actions --------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.generating
        return True

    def action_stop(self) -> None:
        if self.generation is not None and self.generation.running:
            self.generation.stop()
            if self.canvas is not None:
                self.canvas.mark_stopping()

    def action_new_chat(self) -> None:
        if self._busy():
            return
        self.chat = None
        self._pending = False
        self.refresh_sidebar()
        self._render_conversation()
        self.recount()
        self.query_one(PromptInput).focus()

    def action_focus_prompt(self) -> None:
        self.query_one(PromptInput).focus()

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one("#sidebar")
        sidebar.display = not sidebar.display
        if sidebar.display and self._narrow:
            self.query_one(ChatList).focus()  # it lies over the chat: shown to pick a chat from

    @property
    def _narrow(self) -> bool:
        """Below NARROW_BELOW columns, where a shown sidebar lies over the chat (dgchat.tcss)."""
        return self.size.width < NARROW_BELOW

    def _last(self, role: str) -> Message | None:
        if self.chat is None:
            return None
        for m in reversed(self.store.messages(self.chat.id)):
            if m.role == role:
                return m
        return None

    def action_regenerate(self) -> None:
        if self._busy() or self.chat is None:
            return
        messages = self.store.messages(self.chat.id)
        if not messages:
            self.notify("Nothing to regenerate yet.")
            return
        # the answer (if the conversation ends with one) is kept: the new one becomes its next version
        self.start_generation()

    def edit_message(self, message: Message) -> None:
        """Edit a prompt and re-run from it: the edited prompt is a new version of that turn; the
        old prompt and everything after it stay as the earlier version ([ on the prompt)."""
        if self._busy() or self.chat is None:
            return
        chat_id = self.chat.id

        def done(text: str | None) -> None:
            if text is None or self.chat is None or self.chat.id != chat_id:
                return
            self.store.add_message(chat_id, "user", text, version_of=message.id)
            self._render_conversation()
            prompt = self.query_one(PromptInput)
            prompt.set_history(self.store.prompt_history())
            self.start_generation()
            # the dialog gave focus back to the message it was opened from, which is gone now
            self.call_after_refresh(prompt.focus)

        # nothing is replaced (the earlier version is kept), so the dialog warns of nothing
        self.app.push_screen(EditModal(message.content), done)

    def flip_version(self, message: Message, step: int) -> None:
        """Show the older (step -1) or newer (+1) version of the message's turn; the conversation
        after it becomes that version's own continuation."""
        if self._busy() or self.chat is None:
            return
        versions = self.store.versions(message.id)
        index = next((i for i, v in enumerate(versions) if v.id == message.id), None)
        if index is None or not 0 <= index + step < len(versions):
            return
        target = versions[index + step]
        self.store.show_version(target.id)
        conversation = self.query_one("#conversation", VerticalScroll)
        views = [v for v in conversation.children if isinstance(v, MessageView) and not v.has_class("-removed")]
        start = next((i for i, v in enumerate(views) if v.message.id == message.id), None)
        path = self.store.messages(self.chat.id)
        at = next((i for i, m in enumerate(path) if m.id == target.id), None)
        if start is None or at is None:
            self._render_conversation(target.id)
        else:
            old = views[start:]  # the old version and what followed it
            for view in old:
                view.add_class("-removed")  # gone for view_for and the key handlers already
            self.call_later(self._swap_versions, old, [MessageView(m) for m in path[at:]])

    async def _swap_versions(self, old: list[MessageView], shown: list[MessageView]) -> None:
        """Put another version (and its continuation) where the old one was in one frame, as
        _replace_canvas does for a finished answer: the new views are mounted invisible after the
        old ones and swapped in once laid out. Removing first showed an empty conversation for a
        frame while the new answer's Markdown was parsed."""
        conversation = self.query_one("#conversation", Conversation)
        following, y = conversation.following, conversation.scroll_y
        conversation.live = True  # no scrolling to the invisible views meanwhile
        for view in shown:
            view.styles.visibility = "hidden"
        anchor = old[-1] if old[-1].parent is conversation else None
        await conversation.mount_all(shown, after=anchor)
        conversation.call_after_refresh(self._show_swapped, old, shown, following, y)

    def _show_swapped(self, old: list[MessageView], shown: list[MessageView], following: bool, y: float) -> None:
        conversation = self.query_one("#conversation", Conversation)
        with self.app.batch_update():
            for view in old:
                view.display = False
            for view in shown:
                view.styles.visibility = "visible"
            conversation.scroll_to(y=y, animate=False, immediate=True)
        for view in old:
            view.remove()
        conversation.end_live(following)
        if shown and shown[0].parent is conversation:
            shown[0].focus()
        self.recount()

    def action_edit_last(self) -> None:
        last = self._last("user")
        if last is None:
            self.notify("No prompt to edit yet.")
            return
        self.edit_message(last)

    def copy_message(self, message: Message) -> None:
        result = copy_text(self.app, message.content, self.app.config.clipboard)
        self.notify(result.notice, timeout=6)

    def action_copy_last(self) -> None:
        last = self._last("assistant")
        if last is None:
            self.notify("No answer to copy yet.")
            return
        self.copy_message(last)

    def on_message_view_action(self, event: MessageView.Action) -> None:
        event.stop()
        message = self.store.get_message(event.view.message.id) or event.view.message
        if event.action == "copy":
            self.copy_message(message)
        elif event.action == "edit":
            self.edit_message(message)
        elif event.action == "regenerate":
            last = self._last("assistant")
            if last is None or last.id != message.id:
                self.notify("Only the last answer can be regenerated; edit its prompt to re-run an earlier one.")
                return
            self.action_regenerate()
        elif event.action == "replay":
            self.replay_message(event.view)
        elif event.action == "export_recording":
            self.export_recording(message)
        elif event.action == "older_version":
            self.flip_version(message, -1)
        elif event.action == "newer_version":
            self.flip_version(message, +1)

    # -- recordings: replay and .cast export ----------------------------------------------------
    def load_recording(self, message: Message) -> DenoisingHistory | None:
        """The answer's denoising history, or None and a notice saying why there is none."""
        stored = self.store.recording(message.id)
        if stored is None:
            self.notify("No recording for this answer: dgchat records answers since version 4 of the chat "
                        "database, and this one is older.", timeout=8)
            return None
        if stored.data is None:
            self.notify("This answer's recording was dropped: a chat keeps its newest recordings "
                        f"({MAX_RECORDINGS_BYTES_PER_CHAT >> 20} MB).", timeout=8)
            return None
        try:
            return DenoisingHistory.from_bytes(stored.data)
        except HistoryError as exc:
            self.notify(f"This answer's recording cannot be read: {exc}.", severity="error", timeout=8)
            return None

    def replay_message(self, view: MessageView) -> None:
        history = self.load_recording(view.message)
        if history is None:
            return
        if not history.steps:
            self.notify("This answer's recording has no steps.")
            return
        self.call_later(view.start_replay, history)

    def on_replay_view_export(self, event: ReplayView.Export) -> None:
        event.stop()
        view = event.view.parent
        if isinstance(view, MessageView):
            self.export_recording(view.message, event.view.history, seconds_per_step=event.seconds_per_step)

    def export_recording(self, message: Message, history: DenoisingHistory | None = None, *,
                         seconds_per_step: float | None = 1.0 / DEFAULT_PACE) -> None:
        """Ask where, then write the answer's denoising as a .cast file (asciinema's format)."""
        chat = self.store.get_chat(message.chat_id)
        history = history if history is not None else self.load_recording(message)
        if history is None or chat is None:
            return
        folder = export_dir(self.app.config.export_dir)
        conversation = self.query_one("#conversation", VerticalScroll)
        width = max(40, conversation.content_size.width - 4)  # the width the answer has here (less its margin)
        pace = "the real pace" if seconds_per_step is None else f"{1 / seconds_per_step:g} steps a second"

        def write(text: str) -> str | None:
            if not text:
                return "enter the file to write"
            target = export_target(text, folder)
            problem = export_problem(target, "answer.cast")
            if problem:
                return problem
            try:
                written = export_recording(history, chat, message, target, seconds_per_step=seconds_per_step,
                                           width=width)
            except OSError as exc:
                return export_error_text(target, exc)
            # the whole path: the command works from any folder
            self.notify(f"Recording exported to {written}\nPlay it: asciinema play {shlex.quote(str(written))}",
                        timeout=10)
            return None

        self.app.push_screen(PromptModal(
            # the file's name in the box (a whole path there showed only its end: the box scrolls to
            # the cursor) and the folder in the line above it; a typed absolute path goes elsewhere
            "Export the denoising as a recording (.cast)", default_recording_path(chat, message, folder).name,
            ok_label="Export", check=write, suggester=PathSuggester((".cast",)),
            help_text=f"An asciicast at {pace}, {width} columns wide, into {folder} (a missing folder is "
                      "created, an existing file replaced):",
        ))

    def action_export(self) -> None:
        if self.chat is None:
            self.notify("Nothing to export yet.")
            return
        chat = self.chat
        folder = export_dir(self.app.config.export_dir)

        def write(text: str) -> str | None:
            # runs on Export: a problem is shown in the dialog, which stays open with the path typed
            if not text:
                return "enter the file to write"
            target = export_target(text, folder)
            problem = export_problem(target)
            if problem:
                return problem
            try:
                written = export_chat(chat, self.store.messages(chat.id), target)
            except OSError as exc:
                return export_error_text(target, exc)
            self.notify(f"Exported to {written}")
            return None

        self.app.push_screen(PromptModal(
            "Export chat to Markdown", default_export_path(chat, folder).name, ok_label="Export", check=write,
            suggester=PathSuggester((".md",)),
            help_text=f"Into {folder} (export_dir in {short_path(self.app.config.path)}; a missing folder is "
                      "created, an existing file replaced):",
        ))

    def action_search(self) -> None:
        def done(result: tuple[int, int | None] | None) -> None:
            if result is None:
                return
            chat_id, message_id = result
            self.open_chat(chat_id, focus_message=message_id)

        self.app.push_screen(SearchModal(self.store), done)

    def action_rename_chat(self, chat_id: int | None = None) -> None:
        chat = self.store.get_chat(chat_id) if chat_id is not None else self.chat
        if chat is None:
            self.notify("This chat has no messages yet; it is named after the first prompt.")
            return

        def done(title: str | None) -> None:
            if title:
                self.store.rename_chat(chat.id, title)
                if self.chat and self.chat.id == chat.id:
                    self.chat = self.store.get_chat(chat.id)
                self.refresh_sidebar()

        self.app.push_screen(PromptModal("Rename chat", chat.title, ok_label="Rename"), done)

    def action_delete_chat(self, chat_id: int | None = None) -> None:
        chat = self.store.get_chat(chat_id) if chat_id is not None else self.chat
        if chat is None:
            return
        if self.generating and self.chat is not None and self.chat.id == chat.id:
            self._busy()
            return

        def done(yes: bool | None) -> None:
            if not yes:
                return
            self.store.delete_chat(chat.id)
            if self.chat is not None and self.chat.id == chat.id:
                self.chat = None
                self._render_conversation()
            self.refresh_sidebar()
            self.update_status()

        self.app.push_screen(ConfirmModal("Delete chat", f"Delete “{chat.title}” and all its messages?"), done)

    def on_chat_list_request(self, event: ChatList.Request) -> None:
        event.stop()
        if event.action == "open" and event.chat_id is not None:
            self.open_chat(event.chat_id)
            if self._narrow:
                # the sidebar lies over the chat there: put it away, back to the prompt. Not a choice
                # to hide it (Ctrl+B's inline display): the width rules decide again, a wide
                # terminal shows it
                sidebar = self.query_one("#sidebar")
                sidebar.styles.clear_rule("display")
                sidebar.refresh(layout=True)
                self.query_one(PromptInput).focus()
        elif event.action == "new":
            self.action_new_chat()
        elif event.action == "rename":
            self.action_rename_chat(event.chat_id)
        elif event.action == "delete":
            self.action_delete_chat(event.chat_id)

    # -- settings and models --------------------------------------------------------------------
    def action_settings(self) -> None:
        if self._busy():
            return
        chat = self.chat
        engine = self.loaded_engine()
        if engine is None:
            # the defaults come from the model (and resolving validates against it): load it first
            wanted = self.model_path_for(chat)
            if wanted is None:
                self.app.push_screen(ErrorModal("Settings need a model", "No model is configured; open one first "
                                                "(Ctrl+P → model: open…)."))
                return
            self._settings_after_load = True
            if self.session.load(wanted):
                self.notify(f"Loading {display_name(wanted)}; the settings open when it is ready.")
            return
        try:
            defaults = self.default_params(engine)
        except DgchatError as exc:
            self.app.push_screen(ErrorModal("Settings problem", str(exc)))
            return

        def done(settings: ChatSettings | None) -> None:
            if settings is not None:
                self.apply_settings(settings)

        self.app.push_screen(
            SettingsModal(
                chat_title=chat.title if chat else "New chat",
                model=chat.model if chat else None,
                default_model_name=display_name(self.session.default_path),
                system_prompt=chat.system_prompt if chat else self.app.config.system_prompt,
                overrides=chat.params if chat else {},
                defaults=defaults,
                resolve=engine.resolve,
                check_model=check_model_file,
                default_model=self.session.default_path if isinstance(self.session.default_path, Path) else None,
                # what the status line's "T 0.8 → 0.4" says: this model anneals t_max → t_min
                annealed=engine.info.uniform_state and not defaults.autoregressive,
                # block diffusion: canvas and block are the model's block, steps are per block
                block_size=block_size_of(engine),
                variant=str(engine.info.preset or ""),
                # the config fixed no seed: the chat's field may be left empty (a new one each answer)
                random_seed=not seed_chosen(self.resolved_params(engine, with_chat=False)),
            ),
            done,
        )

    def apply_settings(self, settings: ChatSettings, *, quiet: bool = False) -> None:
        chat = self.ensure_chat()
        self.store.update_chat_settings(chat.id, model=settings.model, system_prompt=settings.system_prompt,
                                        params=settings.params)
        self.chat = self.store.get_chat(chat.id)
        self.refresh_sidebar()
        wanted = self.model_path_for(self.chat)
        if wanted is not None and self.session.loaded(wanted) is None:
            self.session.load(wanted)
        self.recount(fresh=True)  # the system prompt or the model may have changed
        if not quiet:
            self.notify("Chat settings saved.")

    def action_reset_settings(self) -> None:
        if self.chat is None:
            return
        self.store.update_chat_settings(self.chat.id, model=self.chat.model, system_prompt=self.chat.system_prompt,
                                        params={})
        self.chat = self.store.get_chat(self.chat.id)
        self.update_status()
        self.notify("Sampler settings back to the model's defaults.")

    def action_open_model(self) -> None:
        if self._busy():
            return

        def done(path: Path | None) -> None:
            if path is None:
                return
            full = str(Path(path).expanduser().resolve())
            if self.chat is None:
                # no chat yet: this becomes the session's default model
                self.session.use_default(Path(full))
                self.session.load(Path(full))
            else:
                self.apply_settings(ChatSettings(full, self.chat.system_prompt, self.chat.params))
            self.update_status()

        self.app.push_screen(
            ModelPicker(current=self._local_model(), check=check_model_file,
                        open_models=self.app.action_models, title="Open model"),
            done,
        )

    def use_model(self, path: ModelSource) -> None:
        """Models → Use: the open chat switches to `path` (it is the default for new chats now too).
        A server is never a chat's own model: a chat with its own file keeps it."""
        name = display_name(path)
        if isinstance(path, ServerSource):
            if self.chat is not None and self.chat.model:
                self.notify(f"{name} is the default for new chats; this chat keeps its own model "
                            f"({display_name(self.chat.model)}; Ctrl+O changes it).")
            else:
                self.session.load(path)
                self.notify(f"{name} is the model now (also for new chats).")
            self.update_status()
            return
        if self.chat is not None and self.chat.model and Path(self.chat.model).expanduser() != path:
            self.apply_settings(ChatSettings(str(path), self.chat.system_prompt, self.chat.params), quiet=True)
            self.notify(f"{name}: this chat's model, and the default for new chats.")
            return
        self.session.load(path)
        self.update_status()
        self.notify(f"{name} is the model now (also for new chats).")

    def action_reload_model(self) -> None:
        wanted = self.model_path_for(self.chat)
        if wanted is None:
            self.notify("No model configured.")
            return
        self.session.load(wanted, force=True)

    def action_toggle_precise(self) -> None:
        """Exact mode on or off (config.toml's [engine] precise), then the model again with it."""
        config = self.app.config
        precise = not bool(config.precise)
        try:
            save_precise(config.path, precise)
        except DgchatError as exc:
            self.notify(str(exc), severity="error")
            return
        config.precise = precise
        served_now = served(self.session.engine) is not None
        self.notify(("Precise mode on: f32 KV cache, no flash attention." if precise else
                     "Precise mode off: f16 KV cache, flash attention on auto.")
                    + (" A server's model runs as the server says (dgchat serve --precise)." if served_now else ""))
        if not served_now and not self._busy():
            self.action_reload_model()

    def action_model_info(self) -> None:
        engine = self.session.engine
        if engine is None:
            self.notify("No model is loaded.")
            return
        info = engine.info
        temperature, defaults = defaults_text(info.defaults, info.uniform_state)
        block = block_size_of(engine)
        writes = ""
        if block:  # the label names the variant
            writes = (f"writes: left to right, block after block ({block} tokens a block, fixed by the model; "
                      "steps are per block; no infill)\n")
        text = (
            f"{info.name}\n{short_path(engine.path)}\n\narchitecture: {info.architecture} ({info.family})\n"
            f"runs as: {engine.label}\n{writes}context: {engine.n_ctx_max:,} tokens\n"
            f"temperature: {temperature}\nrecommended sampler: {defaults}"
        )
        try:  # this chat's settings and where each came from (as `dgchat generate --json` reports them)
            table = self.resolved_params(engine).table()
            text += f"\n\nthis chat runs with:\n{sources_text(table, info.uniform_state, block_size=block)}"
        except DgchatError as exc:  # a chat setting the model refuses: the status line says so too
            text += f"\n\nthis chat's settings: {exc}"
        self.app.push_screen(ErrorModal("Model", text))
