"""The chat screen: saved chats on the left, the conversation, the prompt box, the status line.

This module composes the widgets and wires them to the screen's areas, one module each under
app/chat/ (see app/chat/__init__.py): the transcript and its message actions, the composer,
generation control, model switching, the status line, the saved chats, export and replay. The
widgets' messages, the session's JobDone and the key bindings arrive here and go to the area that
handles them; the areas reach each other through the screen.
"""

from __future__ import annotations

from dgchat.app.breakpoints import WIDTH_BREAKPOINTS
from dgchat.app.chat.answering import AnswerControl
from dgchat.app.chat.composer import Composer
from dgchat.app.chat.export_replay import ExportReplay
from dgchat.app.chat.model_switching import ModelSwitching
from dgchat.app.chat.saved_chats import SavedChats
from dgchat.app.chat.status_line import StatusLine
from dgchat.app.chat.transcript import Transcript
from dgchat.app.generation import ChatAnswer, ContextCountJob
from dgchat.app.model_source import ModelSource
from dgchat.app.session import Engine, JobDone, ModelSession
from dgchat.app.settings_modal import ChatSettings
from dgchat.app.store import Chat, Store
from dgchat.app.widgets.canvas import LiveCanvas
from dgchat.app.widgets.chat_list import ChatList
from dgchat.app.widgets.conversation import Conversation
from dgchat.app.widgets.fitting_footer import FittingFooter
from dgchat.app.widgets.message import MessageView
from dgchat.app.widgets.prompt_input import PromptInput
from dgchat.app.widgets.replay import ReplayView
from dgchat.app.widgets.status_bar import StatusBar
from dgchat.model_backend.param_resolution import ResolvedParams
from dgchat.model_backend.params import DiffusionParams
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Header, Label


class ChatScreen(Screen):
    """The chat: its widgets, the open chat, the key bindings, and the areas that do the work."""

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
        self.chat: Chat | None = None  # the open chat; None for a new one not yet saved
        self._open_at_start = open_chat
        self.transcript = Transcript(self)
        self.composer = Composer(self)
        self.answers = AnswerControl(self)
        self.models = ModelSwitching(self)
        self.status_line = StatusLine(self)
        self.chats = SavedChats(self)
        self.exports = ExportReplay(self)

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

    def on_mount(self) -> None:
        self.answers.mount()
        self.session.watch(self, self.models.changed)
        self.composer.load_history()
        self.chats.reopen_last(self._open_at_start)
        self.update_status()
        self.composer.focus()

    def on_unmount(self) -> None:
        # the app is going away without Ctrl+Q (e.g. a signal): still end the answer; the worker
        # saves it as stopped
        if self.answers.generation is not None:
            self.answers.generation.stop()

    # -- what every area shares -----------------------------------------------------------------
    @property
    def store(self) -> Store:
        return self.app.store

    @property
    def session(self) -> ModelSession:
        return self.app.session

    @property
    def generating(self) -> bool:
        return self.answers.running

    @property
    def generation(self) -> ChatAnswer | None:
        """The answer being generated (generation control's)."""
        return self.answers.generation

    @property
    def canvas(self) -> LiveCanvas | None:
        """The live canvas of the answer being generated."""
        return self.answers.canvas

    @property
    def last_canvas(self) -> LiveCanvas | None:
        """The last answer's canvas, kept after it ended (the benchmarks count its repaints)."""
        return self.answers.last_canvas

    def refuse_while_answering(self) -> bool:
        """True, with a notice, while an answer is being generated: what would change the
        conversation under it waits."""
        if self.generating:
            self.notify("An answer is being generated — press Esc to stop it first.", severity="warning")
            return True
        return False

    def model_path_for(self, chat: Chat | None) -> ModelSource | None:
        return self.models.model_path_for(chat)

    def resolved_params(self, engine: Engine, *, with_chat: bool = True) -> ResolvedParams:
        return self.models.resolved_params(engine, with_chat=with_chat)

    def effective_params(self, engine: Engine) -> DiffusionParams:
        return self.models.effective_params(engine)

    def apply_settings(self, settings: ChatSettings, *, quiet: bool = False) -> None:
        self.models.apply_settings(settings, quiet=quiet)

    def use_model(self, path: ModelSource) -> None:
        self.models.use_model(path)

    def update_status(self) -> None:
        self.status_line.update()

    def recount(self, *, fresh: bool = False) -> None:
        self.status_line.recount(fresh=fresh)

    def refresh_sidebar(self) -> None:
        self.chats.refresh()

    def open_chat(self, chat_id: int, focus_message: int | None = None) -> None:
        self.chats.open(chat_id, focus_message)

    def view_for(self, message_id: int) -> MessageView | None:
        return self.transcript.view_for(message_id)

    def start_generation(self) -> None:
        self.answers.start()

    # -- messages from the widgets and the session ----------------------------------------------
    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        event.stop()
        self.composer.send(event.text)

    def on_message_view_action(self, event: MessageView.Action) -> None:
        event.stop()
        message = self.store.get_message(event.view.message.id) or event.view.message
        if event.action == "copy":
            self.transcript.copy_message(message)
        elif event.action == "edit":
            self.transcript.edit_message(message)
        elif event.action == "regenerate":
            self.transcript.regenerate_message(message)
        elif event.action == "replay":
            self.exports.replay(event.view)
        elif event.action == "export_recording":
            self.exports.export_cast(message)
        elif event.action == "older_version":
            self.transcript.flip_version(message, -1)
        elif event.action == "newer_version":
            self.transcript.flip_version(message, +1)

    def on_replay_view_export(self, event: ReplayView.Export) -> None:
        event.stop()
        view = event.view.parent
        if isinstance(view, MessageView):
            self.exports.export_cast(view.message, event.view.history, seconds_per_step=event.seconds_per_step)

    def on_chat_list_request(self, event: ChatList.Request) -> None:
        event.stop()
        self.chats.list_request(event)

    def on_job_done(self, message: JobDone) -> None:
        if isinstance(message.job, ContextCountJob):
            self.status_line.counted(message.job)
            return
        self.answers.job_done(message.job)

    @on(events.ScreenResume)
    def _count_when_back(self) -> None:
        self.status_line.recount_if_wanted()

    # -- actions: the key bindings above and the Ctrl+P commands (app/commands.py) ---------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.generating
        return True

    def action_stop(self) -> None:
        self.answers.stop()

    def action_regenerate(self) -> None:
        self.answers.regenerate()

    def action_edit_last(self) -> None:
        self.transcript.edit_last()

    def action_copy_last(self) -> None:
        self.transcript.copy_last()

    def action_focus_prompt(self) -> None:
        self.composer.focus()

    def action_new_chat(self) -> None:
        self.chats.new_chat()

    def action_rename_chat(self, chat_id: int | None = None) -> None:
        self.chats.rename(chat_id)

    def action_delete_chat(self, chat_id: int | None = None) -> None:
        self.chats.delete(chat_id)

    def action_search(self) -> None:
        self.chats.search()

    def action_toggle_sidebar(self) -> None:
        self.chats.toggle_sidebar()

    def action_export(self) -> None:
        self.exports.export_markdown()

    def action_settings(self) -> None:
        self.models.open_settings()

    def action_reset_settings(self) -> None:
        self.models.reset_settings()

    def action_open_model(self) -> None:
        self.models.open_model()

    def action_reload_model(self) -> None:
        self.models.reload_model()

    def action_toggle_precise(self) -> None:
        self.models.toggle_precise()

    def action_model_info(self) -> None:
        self.models.model_info()
