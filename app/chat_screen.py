"""The chat screen: saved chats on the left, the conversation, the prompt box, the status line.

Sending stores the user message (committed) before anything else, then asks the model session
(app/session.py) to run the answer as a job. While it runs, a LiveView picks up the latest
StepEvent at most `refresh_hz` times a second and repaints the live canvas; the generation loop
never waits for it.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from dgchat.app.clipboard import copy_text
from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.edit_modal import EditModal
from dgchat.app.error_modal import ErrorModal
from dgchat.app.export import default_export_path, export_chat
from dgchat.app.generation import ChatAnswer
from dgchat.app.live_view import LiveView
from dgchat.app.paths import display_name, short_path
from dgchat.app.prompt_modal import PromptModal
from dgchat.app.search_modal import SearchModal
from dgchat.app.session import Engine, JobDone, ModelChange, ModelSession
from dgchat.app.settings_modal import ChatSettings, SettingsModal
from dgchat.app.store import Chat, Message
from dgchat.app.widgets.canvas import LiveCanvas
from dgchat.app.widgets.chat_list import ChatList
from dgchat.app.widgets.message import MessageView
from dgchat.app.widgets.prompt_input import PromptInput
from dgchat.app.widgets.status_bar import StatusBar
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.params import DiffusionParams
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Label


def check_model_file(path: str) -> str | None:
    """Why `path` is not a usable model, from its header alone, or None."""
    from dgchat.model_backend.gguf_file import read_gguf_header
    from dgchat.model_backend.model_info import inspect_header

    try:
        inspect_header(read_gguf_header(Path(path).expanduser()))
    except DgchatError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    return None


class ChatScreen(Screen):
    BINDINGS = [
        Binding("escape", "stop", "Stop", id="chat.stop"),
        Binding("ctrl+n", "new_chat", "New chat", id="chat.new"),
        Binding("ctrl+r", "regenerate", "Regenerate", id="chat.regenerate"),
        Binding("ctrl+g", "edit_last", "Edit prompt", show=False, id="chat.edit_last"),
        Binding("alt+c", "copy_last", "Copy answer", show=False, id="chat.copy_last"),
        Binding("ctrl+s", "export", "Export", show=False, id="chat.export"),
        Binding("ctrl+f", "search", "Search", id="chat.search"),
        Binding("ctrl+o", "settings", "Settings", id="chat.settings"),
        Binding("f2", "rename_chat", "Rename", show=False, id="chat.rename"),
        Binding("ctrl+b", "toggle_sidebar", "Sidebar", show=False, id="chat.toggle_sidebar"),
        Binding("ctrl+l", "focus_prompt", "Prompt", show=False, id="chat.focus_prompt"),
    ]

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
        self._reseed = False
        self._settings_after_load = False

    # -- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        with Horizontal(id="main"):
            with Vertical(id="sidebar"):
                yield Label("Chats", id="sidebar-title")
                yield ChatList(id="chat-list")
            with Vertical(id="chat-pane"):
                yield VerticalScroll(id="conversation")
                yield PromptInput(id="prompt", placeholder="Message the model — Enter sends, Shift+Enter newline")
                yield StatusBar(id="status")
        yield Footer()

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
            self.refresh_sidebar()
            self._render_conversation()
        else:
            self.open_chat(chat_id)
        self.update_status()
        self.query_one(PromptInput).focus()

    # -- model state ----------------------------------------------------------------------------
    def model_path_for(self, chat: Chat | None) -> Path | None:
        if chat is not None and chat.model:
            return Path(chat.model).expanduser()
        return self.session.default_path

    def _model_changed(self, change: ModelChange) -> None:
        if change.kind == "loaded":
            self.model_ready()
        elif change.kind == "failed":
            self.model_failed()
        else:
            self.update_status()

    def model_ready(self) -> None:
        self.update_status()
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
            bar.set_text(session.status_text(wanted, when="it loads when you send"))
            return
        try:
            p = self.effective_params(engine)
            blocks = f" · block {p.block_length}" if p.block_length else ""
            thr = f" · threshold {p.threshold:g}" if p.threshold is not None else ""
            bar.set_text(
                f"{display_name(wanted)} · {engine.label} · steps {p.steps} · canvas {p.gen_length}{blocks}"
                f" · {p.algorithm}{thr} · T {p.temperature:g}"
            )
        except DgchatError as exc:
            bar.set_text(f"{display_name(wanted)} · settings problem: {exc}")

    # -- parameters -----------------------------------------------------------------------------
    def base_params(self) -> DiffusionParams:
        """Config [sampler] defaults (unset fields stay None for the model's defaults)."""
        return self.app.config.sampler_params()

    def loaded_engine(self) -> Engine | None:
        """The engine for this chat's model when it is loaded, else None."""
        return self.session.loaded(self.model_path_for(self.chat))

    def default_params(self, engine: Engine) -> DiffusionParams:
        """The model's recommended settings over the config's [sampler] table."""
        return engine.resolve(self.base_params())

    def effective_params(self, engine: Engine) -> DiffusionParams:
        overrides = dict(self.chat.params) if self.chat else {}
        return engine.resolve(self.base_params().updated(**overrides))

    # -- chats ----------------------------------------------------------------------------------
    def refresh_sidebar(self) -> None:
        self.query_one(ChatList).set_chats(self.store.list_chats(), self.chat.id if self.chat else None)
        self.sub_title = self.chat.title if self.chat else "New chat"

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
        self.refresh_sidebar()
        self._render_conversation(focus_message)
        wanted = self.model_path_for(chat)
        if wanted is not None and self.session.loaded(wanted) is None and self.session.loading_path is None:
            self.session.load(wanted)
        self.update_status()

    def _new_chat_row(self) -> Chat:
        return self.store.create_chat(system_prompt=self.app.config.system_prompt)

    def ensure_chat(self) -> Chat:
        if self.chat is None:
            self.chat = self._new_chat_row()
        return self.chat

    def _render_conversation(self, focus_message: int | None = None) -> None:
        conversation = self.query_one("#conversation", VerticalScroll)
        for child in conversation.children:
            child.add_class("-removed")
        conversation.remove_children()
        self.canvas = None
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
                self.call_after_refresh(self._focus_view, target)
                return
        self.call_after_refresh(conversation.scroll_end, animate=False)

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
        conversation = self.query_one("#conversation", VerticalScroll)
        conversation.query(".conversation--hint").remove()
        conversation.mount(MessageView(message))
        conversation.scroll_end(animate=False)
        # start once the prompt is on screen: that layout then does not compete with the first steps
        self.call_after_refresh(self.start_generation)

    def _history_for_model(self) -> list[dict[str, str]]:
        assert self.chat is not None
        messages: list[dict[str, str]] = []
        if self.chat.system_prompt.strip():
            messages.append({"role": "system", "content": self.chat.system_prompt})
        for m in self.store.messages(self.chat.id):
            if m.role == "assistant" and not m.content.strip():
                continue
            messages.append({"role": m.role, "content": m.content})
        return messages

    def start_generation(self) -> None:
        """Answer the chat's last prompt with the chat's model and settings."""
        session = self.session
        if self.chat is None or self.generating:
            return
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
            self.notify(f"Your message is saved. {session.busy_text()}", severity="warning")
            return
        try:
            params = self.effective_params(engine)
            if self._reseed and (params.temperature or 0) > 0:
                params = params.updated(seed=random.randrange(1 << 31))
            messages = self._history_for_model()
        except DgchatError as exc:
            self.app.push_screen(ErrorModal("Cannot generate", str(exc)))
            return
        finally:
            self._reseed = False
        answer = self.store.begin_answer(self.chat.id, {"model": display_name(wanted)})
        generation = ChatAnswer(messages, params, store=self.store, message_id=answer.id,
                                model_name=display_name(wanted))
        if not session.start(generation, self):
            self.store.delete_message(answer.id)
            self.notify("The model is not ready; your message is saved (Ctrl+R answers it).", severity="warning")
            return
        self.generation = generation
        self._last_checkpoint = time.monotonic()
        self.canvas = LiveCanvas(engine, id="live-canvas", classes="message -assistant -live")
        self.last_canvas = self.canvas  # kept after the answer ends (repaint counts for the benchmark)
        conversation = self.query_one("#conversation", VerticalScroll)
        conversation.mount(self.canvas)
        conversation.scroll_end(animate=False)
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
            conversation = self.query_one("#conversation", VerticalScroll)
            follow = conversation.scroll_y >= conversation.max_scroll_y - 1  # the user did not scroll up
            grew = self.canvas.show(event)
            if follow and grew:  # scrolling repaints the whole screen: only when the canvas got taller
                conversation.call_after_refresh(conversation.scroll_end, animate=False, immediate=True)
        now = time.monotonic()
        if event is not None and generation.running and now - self._last_checkpoint >= 1.0:
            self._last_checkpoint = now
            try:  # a crash from here on still leaves the decided text in the database
                self.store.checkpoint_answer(generation.message_id, generation.partial_text())
            except Exception:  # noqa: BLE001
                pass

    def on_job_done(self, message: JobDone) -> None:
        generation = message.job
        if generation is not self.generation or not isinstance(generation, ChatAnswer):
            return
        if self.live is not None:
            self.live.stop()
        self.generation = None
        if self.canvas is not None:
            self.canvas.remove()
            self.canvas = None
        self.refresh_bindings()
        saved = self.store.get_message(generation.message_id) if generation.message_id else None
        conversation = self.query_one("#conversation", VerticalScroll)
        if saved is not None and (self.chat is None or saved.chat_id == self.chat.id):
            conversation.mount(MessageView(saved))
            conversation.scroll_end(animate=False)
        if generation.error is not None:
            self.app.push_screen(ErrorModal("Generation failed", generation.error_text()))
        elif generation.final is not None and generation.final.stop_reason == "cancelled":
            self.notify("Stopped; the partial answer is kept.")
        self.chat = self.store.get_chat(self.chat.id) if self.chat else None
        self.refresh_sidebar()
        self.update_status()

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
        self.update_status()
        self.query_one(PromptInput).focus()

    def action_focus_prompt(self) -> None:
        self.query_one(PromptInput).focus()

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one("#sidebar")
        sidebar.display = not sidebar.display

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
        last = messages[-1]
        if last.role == "assistant":
            self.store.delete_message(last.id)
            view = self.view_for(last.id)
            if view is not None:
                view.add_class("-removed")
                view.remove()
        self._reseed = True
        self.start_generation()

    def edit_message(self, message: Message) -> None:
        if self._busy() or self.chat is None:
            return
        later = sum(1 for m in self.store.messages(self.chat.id) if m.id > message.id)

        def done(text: str | None) -> None:
            if text is None or self.chat is None:
                return
            self.store.update_message(message.id, text)
            self.store.delete_after(self.chat.id, message.id)
            self._render_conversation()
            self.query_one(PromptInput).set_history(self.store.prompt_history())
            self.start_generation()

        self.app.push_screen(EditModal(message.content, later), done)

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

    def action_export(self) -> None:
        if self.chat is None:
            self.notify("Nothing to export yet.")
            return
        chat = self.chat

        def done(path: str | None) -> None:
            if not path:
                return
            try:
                written = export_chat(chat, self.store.messages(chat.id), path)
            except OSError as exc:
                self.app.push_screen(ErrorModal("Export failed", f"{path}: {exc.strerror or exc}"))
                return
            self.notify(f"Exported to {short_path(written)}")

        self.app.push_screen(
            PromptModal("Export chat to Markdown", str(default_export_path(chat)), ok_label="Export",
                        help_text="File to write (replaced atomically if it exists):"),
            done,
        )

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
        self.update_status()
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

        def done(path: str | None) -> None:
            if not path:
                return
            full = str(Path(path).expanduser().resolve())
            if self.chat is None:
                # no chat yet: this becomes the session's default model
                self.session.use_default(Path(full))
                self.session.load(Path(full))
            else:
                self.apply_settings(ChatSettings(full, self.chat.system_prompt, self.chat.params))
            self.update_status()

        current = self.model_path_for(self.chat)
        self.app.push_screen(
            PromptModal("Open model", str(current) if current else "", placeholder="/path/to/model.gguf",
                        ok_label="Open", check=lambda p: check_model_file(p) if p else "enter the path of a GGUF file",
                        help_text="A GGUF text-diffusion model (LLaDA, Dream, RND1, DiffusionGemma):"),
            done,
        )

    def use_model(self, path: Path) -> None:
        """Models → Use: the open chat switches to `path` (it is the default for new chats now too)."""
        name = display_name(path)
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

    def action_model_info(self) -> None:
        engine = self.session.engine
        if engine is None:
            self.notify("No model is loaded.")
            return
        info = engine.info
        defaults = ", ".join(f"{k}={v}" for k, v in sorted(info.defaults.items()))
        text = (
            f"{info.name}\n{short_path(engine.path)}\n\narchitecture: {info.architecture} ({info.family})\n"
            f"runs as: {engine.label}\ncontext: {engine.n_ctx_max} tokens\n"
            f"recommended sampler: {defaults}"
        )
        self.app.push_screen(ErrorModal("Model", text))
