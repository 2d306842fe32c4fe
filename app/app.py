"""DgchatApp: config, store, the loaded model, themes, key map, help; the chat screen does the rest.

Models load in a thread worker (llama.cpp's progress callback feeds a progress bar); a model that
fails to load is reported in a dialog and the app keeps running. One engine is loaded at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dgchat import assets
from dgchat.app import terminal_guard
from dgchat.app.chat_screen import ChatScreen
from dgchat.app.commands import PROVIDERS
from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.drafting_screen import DraftingScreen, open_drafting
from dgchat.app.edit_modal import EditModal
from dgchat.app.error_modal import ErrorModal as _Error
from dgchat.app.model_picker import ModelPicker
from dgchat.app.models_screen import ModelsScreen
from dgchat.app.npc_card_modal import CardModal
from dgchat.app.npc_screen import NpcScreen, open_workshop
from dgchat.app.prompt_modal import PromptModal
from dgchat.app.search_modal import SearchModal
from dgchat.app.settings_modal import SettingsModal
from dgchat.app.widgets.chat_list import ChatList
from dgchat.app.widgets.message import MessageView
from dgchat.app.widgets.npc import CardList, VariantView
from dgchat.app.widgets.prompt_input import PromptInput
from dgchat.app.wizard.screen import WizardScreen
from dgchat.config import Config, validate_for_app
from dgchat.app.help_modal import HelpModal, HelpRows, remap_hint
from dgchat.app.model_source import ModelSource
from dgchat.app.no_model_screen import NoModelScreen
from dgchat.app.paths import short_path
from dgchat.app.session import ModelSession, SessionCall
from dgchat.app.store import Store
from dgchat.app.tool_commands import TOOL_PROVIDERS
from dgchat.app.tool_screen import tool_screens
from dgchat.model_backend import rpc
from dgchat.terminal_text import safe_document, safe_message
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

DARK, LIGHT = "textual-dark", "textual-light"
NOTICE_LIMIT = 1000  # characters of a notice's message (a server's error body can be 100 KB)


class DgchatApp(App[int]):
    CSS_PATH = "dgchat.tcss"
    TITLE = "dgchat"
    COMMANDS = App.COMMANDS | set(PROVIDERS) | set(TOOL_PROVIDERS)
    COMMAND_PALETTE_DISPLAY = "^p"
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True, id="app.quit"),
        Binding("ctrl+p", "command_palette", "Commands", show=False, priority=True, id="app.command_palette"),
        Binding("f1,question_mark", "help", "Keys", id="app.help"),
        Binding("ctrl+t", "toggle_dark", "Theme", show=False, id="app.toggle_dark"),
        Binding("f4", "models", "Models", show=False, id="app.models"),
        Binding("f3", "npc_workshop", "NPC workshop", show=False, id="app.npc_workshop"),
        Binding("f5", "drafting", "Drafting", show=False, id="app.drafting"),
    ]

    def __init__(
        self,
        *,
        config: Config,
        store: Store,
        model_path: ModelSource | None = None,
        open_chat: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        terminal_guard.install()  # no control character of any widget's text reaches the terminal
        self.config = config
        self.store = store
        self.session = ModelSession(self, config, model_path or None)
        self.open_chat_id = open_chat
        validate_for_app(config, themes=set(self.available_themes), binding_ids=set(all_binding_ids()))
        if config.keys:
            self.set_keymap(config.keys)

    def notify(self, message: str, *, title: str = "", severity: Any = "information", timeout: float | None = None,
               markup: bool = True) -> None:
        """Every notice (the screens' and widgets' notify() end here) quotes outside text as text:
        server errors and model names are shown by dgchat.terminal_text's rule, bounded, and never
        read as Textual markup (a `[link=...]` in a server's error would otherwise become a link).
        dgchat writes no notice with markup."""
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        super().notify(safe_message(message, NOTICE_LIMIT), title=safe_document(title), severity=severity,
                       markup=False, **kwargs)

    # -- startup --------------------------------------------------------------------------------
    @property
    def chat_screen(self):  # -> ChatScreen
        for screen in reversed(self.screen_stack):
            if isinstance(screen, ChatScreen):
                return screen
        raise LookupError("no chat screen")

    def on_mount(self) -> None:
        theme = self.config.theme or self.store.get_setting("theme") or DARK
        self.theme = theme if theme in self.available_themes else DARK
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        self.push_screen(ChatScreen(open_chat=self.open_chat_id))
        first = self.first_run_screen()
        # the wizard loads the model the user picks; loading the fallback meanwhile would be wasted
        if self.session.default_path is not None and not _is_wizard(first):
            self.session.load(self.session.default_path)
        if first is not None:
            self.push_screen(first, self._after_first_run)

        for warning in rpc.notices():  # --rpc to a non-private address: say it where the user looks
            self.notify(warning, title="llama.cpp RPC", severity="warning", timeout=30)

    def first_run_screen(self) -> Screen | None:
        """The hook for the first-run wizard: a screen to push over the chat at start, or None.

        No config file yet and no model named (--model, $DGCHAT_MODEL): the first-run wizard
        (app/wizard/), which writes the config. Otherwise, when there is no model to use,
        a screen saying so and how to give one; a result of "open" from it opens the model picker."""
        if not self.config.exists and not self._model_given():
            return WizardScreen()
        if self.session.default_path is None:
            return NoModelScreen(short_path(self.config.path))
        return None

    def _model_given(self) -> bool:
        """A model named on the command line or in $DGCHAT_MODEL (not the bundled fallback)."""
        default = self.session.default_path
        return default is not None and default != assets.bundled_model_path()

    def _after_first_run(self, result: str | None) -> None:
        if result == "open":
            self.chat_screen.action_open_model()

    def _remember_theme(self, theme: Any) -> None:
        name = getattr(theme, "name", str(theme))
        try:
            self.store.set_setting("theme", name)
        except Exception:  # noqa: BLE001 - the store may be closed while the app exits
            pass

    # -- the model ----------------------------------------------------------------------------------
    def on_session_call(self, message: SessionCall) -> None:
        message.fn(*message.args)

    # -- actions --------------------------------------------------------------------------------
    def action_toggle_dark(self) -> None:
        self.theme = LIGHT if self.current_theme.dark else DARK

    def action_models(self) -> None:
        """The Models screen: list, pull, remove, import, verify and switch models."""
        if any(isinstance(s, (ModelsScreen, WizardScreen)) for s in self.screen_stack):
            return
        def used(path: Path | None) -> None:
            if path is not None:
                self.chat_screen.use_model(path)

        self.push_screen(ModelsScreen(), used)

    def action_setup(self, start: str = "welcome") -> None:
        """The first-run setup again (palette: setup: …); start="hardware" opens it at the machine
        step, to correct the detected values (kept in hardware.toml). Not while the model works:
        the setup's test would have to stop it."""
        if any(isinstance(s, WizardScreen) for s in self.screen_stack):
            return
        if any(isinstance(s, ModelsScreen) for s in self.screen_stack):
            self.notify("Close the Models screen (Esc) first; then setup can run.", severity="warning")
            return
        if self.session.busy:
            self.notify(f"{self.session.busy_text()} Then setup can run.", severity="warning")
            return
        self.push_screen(WizardScreen(rerun=True, start=start))

    def action_npc_workshop(self) -> None:
        open_workshop(self)

    def action_drafting(self) -> None:
        open_drafting(self)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpModal):
            return
        hint = remap_hint(short_path(self.config.path))
        self.push_screen(HelpModal(self.help_rows(), hint))

    def help_rows(self) -> HelpRows:
        rows: HelpRows = []
        keymap = getattr(self, "_keymap", {})
        for group, classes in binding_sources():
            entries = []
            for binding in _bindings(classes):
                assert binding.id is not None
                keys = keymap.get(binding.id, binding.key)
                shown = ", ".join(self.get_key_display(binding.with_key(k.strip())) for k in keys.split(","))
                entries.append((binding.id, shown, binding.description or binding.action))
            if entries:
                rows.append((group, entries))
        return rows

    async def action_quit(self) -> None:
        await self.shutdown()
        self.exit(0)

    async def shutdown(self) -> None:
        """Stop whatever runs on the model (the chat saves its answer as stopped, the tools their
        work) and release the model."""
        self.session.closing.set()
        await self.session.stop_all(timeout=5.0)
        for screen in tool_screens(self):
            screen.before_exit()

    def on_unmount(self) -> None:
        self.session.close()


def binding_sources() -> list[tuple[str, list[type]]]:
    """Every class with remappable bindings, grouped for the help panel; also validates [keys]."""
    return [
        ("App", [DgchatApp]),
        ("Chat", [ChatScreen]),
        ("Prompt box", [PromptInput]),
        # the message keys act on a focused message: say how to get there
        ("Focused message (Shift+Tab from the prompt box, or click it)", [MessageView]),
        ("Sidebar (chat list)", [ChatList]),
        ("Search", [SearchModal]),
        ("Settings", [SettingsModal]),
        ("Model picker", [ModelPicker]),
        ("Edit prompt", [EditModal]),
        ("Dialogs", [ConfirmModal, PromptModal, _Error, NoModelScreen, HelpModal]),
        ("Models", [ModelsScreen]),
        ("NPC workshop", [NpcScreen]),
        ("Characters (workshop list)", [CardList]),
        ("Focused variant", [VariantView]),
        ("Character card", [CardModal]),
        ("Drafting", [DraftingScreen]),
    ]


def _is_wizard(screen: Screen | None) -> bool:
    return isinstance(screen, WizardScreen)


def _bindings(classes: list[type]) -> list[Binding]:
    seen: set[str] = set()
    out: list[Binding] = []
    for cls in classes:
        for binding in cls.BINDINGS:
            if isinstance(binding, Binding) and binding.id and binding.id not in seen:
                seen.add(binding.id)
                out.append(binding)
    return out


def all_binding_ids() -> list[str]:
    return [b.id for _group, classes in binding_sources() for b in _bindings(classes) if b.id]
