"""DgchatApp: config, store, the loaded model, themes, key map, help; the chat screen does the rest.

Models load in a thread worker (llama.cpp's progress callback feeds a progress bar); a model that
fails to load is reported in a dialog and the app keeps running. One engine is loaded at a time.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from dgchat.app.commands import PROVIDERS
from dgchat.app.config import Config, validate_for_app
from dgchat.app.engine_job import stop_tools, tools_busy
from dgchat.app.error_modal import ErrorModal
from dgchat.app.help_modal import HelpModal, HelpRows
from dgchat.app.no_model_screen import NoModelScreen
from dgchat.app.paths import short_path  # noqa: F401 - used here and imported from here
from dgchat.app.store import Store
from dgchat.app.tool_commands import TOOL_PROVIDERS
from dgchat.model_backend.errors import DgchatError

DARK, LIGHT = "textual-dark", "textual-light"




def display_name(path: Path | str | None) -> str:
    return Path(path).name if path else "no model"


class ModelProgress(Message):
    def __init__(self, path: Path, fraction: float) -> None:
        super().__init__()
        self.path = path
        self.fraction = fraction


class ModelLoaded(Message):
    def __init__(self, path: Path, engine: Any) -> None:
        super().__init__()
        self.path = path
        self.engine = engine


class ModelFailed(Message):
    def __init__(self, path: Path, error: str) -> None:
        super().__init__()
        self.path = path
        self.error = error


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
        model_path: Path | None = None,
        open_chat: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.store = store
        self.default_model_path = Path(model_path) if model_path else None
        self.open_chat_id = open_chat
        self.engine: Any = None
        self.engine_path: Path | None = None
        self.loading_path: Path | None = None
        self.load_fraction = 0.0
        self.load_errors: dict[Path, str] = {}  # last failure per model path, for the status line
        self._shutting_down = threading.Event()
        validate_for_app(config, themes=set(self.available_themes), binding_ids=set(all_binding_ids()))
        if config.keys:
            self.set_keymap(config.keys)

    # -- startup --------------------------------------------------------------------------------
    @property
    def chat_screen(self):  # -> ChatScreen
        from dgchat.app.chat_screen import ChatScreen

        for screen in reversed(self.screen_stack):
            if isinstance(screen, ChatScreen):
                return screen
        raise LookupError("no chat screen")

    def on_mount(self) -> None:
        theme = self.config.theme or self.store.get_setting("theme") or DARK
        self.theme = theme if theme in self.available_themes else DARK
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        from dgchat.app.chat_screen import ChatScreen

        self.push_screen(ChatScreen(open_chat=self.open_chat_id))
        first = self.first_run_screen()
        # the wizard loads the model the user picks; loading the fallback meanwhile would be wasted
        if self.default_model_path is not None and not _is_wizard(first):
            self.load_model(self.default_model_path)
        if first is not None:
            self.push_screen(first, self._after_first_run)

    def first_run_screen(self) -> Screen | None:
        """The hook for the first-run wizard: a screen to push over the chat at start, or None.

        No config file yet and no model named (--model, $DGCHAT_MODEL): the first-run wizard
        (app/wizard_screen.py), which writes the config. Otherwise, when there is no model to use,
        a screen saying so and how to give one; a result of "open" from it opens the model picker."""
        if not self.config.exists and not self._model_given():
            from dgchat.app.wizard_screen import WizardScreen

            return WizardScreen()
        if self.default_model_path is None:
            return NoModelScreen(short_path(self.config.path))
        return None

    def _model_given(self) -> bool:
        """A model named on the command line or in $DGCHAT_MODEL (not the bundled fallback)."""
        from dgchat.assets import bundled_model_path

        return self.default_model_path is not None and self.default_model_path != bundled_model_path()

    def _after_first_run(self, result: str | None) -> None:
        if result == "open":
            self.chat_screen.action_open_model()

    def _remember_theme(self, theme: Any) -> None:
        name = getattr(theme, "name", str(theme))
        try:
            self.store.set_setting("theme", name)
        except Exception:  # noqa: BLE001 - the store may be closed while the app exits
            pass

    # -- models ---------------------------------------------------------------------------------
    def load_model(self, path: Path, *, force: bool = False) -> bool:
        """Start loading `path` unless it is loaded or loading; False when it cannot start now."""
        path = Path(path)
        if not force and self.engine is not None and self.engine_path == path:
            return True
        if self.loading_path == path:
            return True
        try:
            if self.chat_screen.generating:
                self.notify("Stop the answer first (Esc), then switch models.", severity="warning")
                return False
        except LookupError:
            pass
        if tools_busy(self):  # the NPC workshop or the drafting screen is using the engine
            self.notify("Stop the generation first (Esc), then switch models.", severity="warning")
            return False
        self.loading_path = path
        self.load_fraction = 0.0
        self.load_errors.pop(path, None)
        self._load_worker(path)
        self._model_state_changed()
        return True

    @work(thread=True, exclusive=True, group="model-load", exit_on_error=False)
    def _load_worker(self, path: Path) -> None:
        from dgchat.model_backend.engine import DiffusionEngine

        last = [0.0, -1.0]

        def progress(fraction: float) -> bool:
            now = time.monotonic()
            if fraction >= 1.0 or fraction - last[1] >= 0.01 and now - last[0] >= 0.05:
                last[0], last[1] = now, fraction
                self.post_message(ModelProgress(path, fraction))
            return not self._shutting_down.is_set()  # False aborts the load when the app quits

        try:
            engine = DiffusionEngine.load(
                path, n_gpu_layers=self.config.n_gpu_layers, n_threads=self.config.n_threads, progress=progress
            )
        except DgchatError as exc:
            self.post_message(ModelFailed(path, str(exc)))
        except Exception as exc:  # noqa: BLE001 - shown to the user, not raised in a thread
            self.post_message(ModelFailed(path, f"{type(exc).__name__}: {exc}"))
        else:
            if self._shutting_down.is_set() or not self.post_message(ModelLoaded(path, engine)):
                engine.close()

    def on_model_progress(self, message: ModelProgress) -> None:
        if message.path == self.loading_path:
            self.load_fraction = message.fraction
            self._model_state_changed()

    def on_model_loaded(self, message: ModelLoaded) -> None:
        if message.path != self.loading_path:
            message.engine.close()  # superseded by a later request
            return
        old = self.engine
        self.engine, self.engine_path = message.engine, message.path
        self.loading_path = None
        if old is not None and old is not message.engine:
            old.close()
        self._model_state_changed()
        self.chat_screen.model_ready()

    def on_model_failed(self, message: ModelFailed) -> None:
        if message.path != self.loading_path:
            return
        self.loading_path = None
        self.load_errors[message.path] = message.error
        self._model_state_changed()
        self.push_screen(ErrorModal("Model failed to load", f"{short_path(message.path)}\n\n{message.error}"))
        self.chat_screen.model_failed()

    def use_engine(self, path: Path, engine: Any) -> None:
        """Make an engine loaded elsewhere (the wizard's test run) the loaded model and the default."""
        path = Path(path)
        old = self.engine
        self.engine, self.engine_path = engine, path
        self.default_model_path = path
        self.loading_path = None  # a load still running is superseded: it closes its own engine
        self.load_errors.pop(path, None)
        if old is not None and old is not engine:
            old.close()
        self._model_state_changed()

    def _model_state_changed(self) -> None:
        try:
            self.chat_screen.update_status()
        except LookupError:
            pass

    # -- actions --------------------------------------------------------------------------------
    def action_toggle_dark(self) -> None:
        self.theme = LIGHT if self.current_theme.dark else DARK

    def action_models(self) -> None:
        """The Models screen: list, pull, remove, import, verify and switch models."""
        from dgchat.app.models_screen import ModelsScreen
        from dgchat.app.wizard_screen import WizardScreen

        if any(isinstance(s, (ModelsScreen, WizardScreen)) for s in self.screen_stack):
            return
        self.push_screen(ModelsScreen())

    def action_npc_workshop(self) -> None:
        from dgchat.app.npc_screen import open_workshop

        open_workshop(self)

    def action_drafting(self) -> None:
        from dgchat.app.drafting_screen import open_drafting

        open_drafting(self)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpModal):
            return
        hint = f"Remap keys in {short_path(self.config.path)}:  [keys]  \"chat.regenerate\" = \"f5\""
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
        """Stop a running answer (it is saved as stopped) and release the model."""
        self._shutting_down.set()
        try:
            screen = self.chat_screen
        except LookupError:
            screen = None
        if screen is not None:
            await screen.stop_and_wait(timeout=5.0)
        await stop_tools(self, timeout=5.0)  # NPC workshop, drafting: stop, save the draft

    def on_unmount(self) -> None:
        self._shutting_down.set()
        if self.engine is not None:
            try:
                screen = self.chat_screen
                busy = screen.generating
            except LookupError:
                busy = False
            if not busy and not tools_busy(self):
                self.engine.close()
            self.engine = None


def binding_sources() -> list[tuple[str, list[type]]]:
    """Every class with remappable bindings, grouped for the help panel; also validates [keys]."""
    from dgchat.app.chat_screen import ChatScreen
    from dgchat.app.confirm_modal import ConfirmModal
    from dgchat.app.edit_modal import EditModal
    from dgchat.app.drafting_screen import DraftingScreen
    from dgchat.app.error_modal import ErrorModal as _Error
    from dgchat.app.models_screen import ModelsScreen
    from dgchat.app.npc_card_modal import CardModal
    from dgchat.app.npc_screen import NpcScreen
    from dgchat.app.prompt_modal import PromptModal
    from dgchat.app.search_modal import SearchModal
    from dgchat.app.settings_modal import SettingsModal
    from dgchat.app.widgets.chat_list import ChatList
    from dgchat.app.widgets.message import MessageView
    from dgchat.app.widgets.npc import CardList, VariantView
    from dgchat.app.widgets.prompt_input import PromptInput

    return [
        ("App", [DgchatApp]),
        ("Chat", [ChatScreen]),
        ("Prompt box", [PromptInput]),
        ("Focused message", [MessageView]),
        ("Sidebar (chat list)", [ChatList]),
        ("Search", [SearchModal]),
        ("Settings", [SettingsModal]),
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
    from dgchat.app.wizard_screen import WizardScreen

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
