"""The chat's model and its settings: which model a chat uses, loading it, the settings dialog,
Models → Use, precise mode, model: info, and the settings each answer runs with.

A chat with its own model file keeps it; other chats use the session's default model (a file or a
server). Every setting is resolved by model_backend/param_resolution: the model's (family, file) <
the config's [sampler] < the chat's own settings, each value with its source.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dgchat.app.chat.part import ChatPart
from dgchat.app.error_modal import ErrorModal
from dgchat.app.model_picker import ModelPicker
from dgchat.app.model_source import ModelSource, ServerSource
from dgchat.app.paths import display_name, short_path
from dgchat.app.sampler_text import defaults_text, sources_text
from dgchat.app.session import Engine, ModelChange
from dgchat.app.settings_modal import ChatSettings, SettingsModal
from dgchat.app.store import Chat
from dgchat.config import save_precise
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.model_info import inspect_header
from dgchat.model_backend.param_resolution import (
    CHAT,
    CONFIG,
    DEFAULT,
    Layer,
    ResolvedParams,
    resolved_for,
    seed_chosen,
)
from dgchat.model_backend.params import DiffusionParams
from dgchat.recording.blocks import block_size_of

if TYPE_CHECKING:  # the screen imports every area: only the type checker may look back
    from dgchat.app.chat_screen import ChatScreen


def check_model_file(path: str) -> str | None:
    """Why `path` is not a usable model, from its header alone, or None."""
    try:
        inspect_header(read_gguf_header(Path(path).expanduser()))
    except DgchatError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    return None


class ModelSwitching(ChatPart):
    """The model a chat runs on and the settings it runs with."""

    def __init__(self, screen: ChatScreen) -> None:
        super().__init__(screen)
        self._settings_after_load = False  # the settings dialog opens once the model has loaded

    # -- which model ----------------------------------------------------------------------------
    def model_path_for(self, chat: Chat | None) -> ModelSource | None:
        if chat is not None and chat.model:
            return Path(chat.model).expanduser()
        return self.session.default_path

    def local_model(self) -> Path | None:
        """The chat's model when it is a file (not a server)."""
        wanted = self.model_path_for(self.screen.chat)
        return wanted if isinstance(wanted, Path) else None

    def loaded_engine(self) -> Engine | None:
        """The engine for this chat's model when it is loaded, else None."""
        return self.session.loaded(self.model_path_for(self.screen.chat))

    # -- the session's model changes ------------------------------------------------------------
    def changed(self, change: ModelChange) -> None:
        """The session's watcher: a model loaded or failed, the engine is free again, or progress."""
        screen = self.screen
        if change.kind == "loaded":
            self.ready()
        elif change.kind == "failed":
            self.failed()
        elif change.kind == "idle":
            screen.update_status()
            if screen.answers.pending and self.session.loading_path is None:
                screen.answers.pending = False  # the engine was counting tokens when the prompt came
                screen.start_generation()
            else:
                screen.status_line.recount_if_wanted()
        else:
            screen.update_status()

    def ready(self) -> None:
        screen = self.screen
        screen.update_status()
        if not screen.answers.pending:
            screen.recount()  # another tokenizer, another context
        if self._settings_after_load:
            self._settings_after_load = False
            self.open_settings()
        elif screen.answers.pending:
            screen.answers.pending = False
            screen.start_generation()

    def failed(self) -> None:
        screen = self.screen
        self._settings_after_load = False
        if screen.answers.pending:
            screen.answers.pending = False
            screen.notify("Your message is saved; it will be answered once a model loads (Ctrl+R).")
        screen.update_status()

    # -- parameters -----------------------------------------------------------------------------
    def default_params(self, engine: Engine) -> DiffusionParams:
        """The model's recommended settings over the config's [sampler] table."""
        return self.resolved_params(engine, with_chat=False).params

    def effective_params(self, engine: Engine) -> DiffusionParams:
        """This chat's settings (resolved_params without where each came from)."""
        return self.resolved_params(engine).params

    def resolved_params(self, engine: Engine, *, with_chat: bool = True) -> ResolvedParams:
        """This chat's settings and where each came from (model_backend/param_resolution): the
        model's (family, file) < the config's [sampler] < the chat's own settings."""
        # the config's [sampler] table as written (`seed = 0`, `cfg_scale = 0` are choices too); what a
        # server cannot take of it (vLLM takes no diffusion settings) its engine's resolve leaves out:
        # the config is for every model. A chat's own settings are refused instead (answering.py).
        layers = [Layer.of(CONFIG, self.app.config.sampler)]
        chat = self.screen.chat
        if with_chat and chat:
            layers.append(Layer.of(CHAT, dict(chat.params)))
        engine_precise = engine.precise
        if engine_precise is None:  # the server's model: what no layer set, the server decided
            return resolved_for(engine, layers, remote=True)
        config_precise = self.app.config.precise
        precise = (engine_precise, CONFIG if config_precise is not None else DEFAULT)
        return resolved_for(engine, layers, precise=precise)

    # -- the settings dialog --------------------------------------------------------------------
    def open_settings(self) -> None:
        screen = self.screen
        if screen.refuse_while_answering():
            return
        chat = screen.chat
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
                screen.notify(f"Loading {display_name(wanted)}; the settings open when it is ready.")
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
        screen = self.screen
        chat = screen.chats.ensure()
        self.store.update_chat_settings(chat.id, model=settings.model, system_prompt=settings.system_prompt,
                                        params=settings.params)
        screen.chat = self.store.get_chat(chat.id)
        screen.refresh_sidebar()
        wanted = self.model_path_for(screen.chat)
        if wanted is not None and self.session.loaded(wanted) is None:
            self.session.load(wanted)
        screen.recount(fresh=True)  # the system prompt or the model may have changed
        if not quiet:
            screen.notify("Chat settings saved.")

    def reset_settings(self) -> None:
        screen = self.screen
        chat = screen.chat
        if chat is None:
            return
        self.store.update_chat_settings(chat.id, model=chat.model, system_prompt=chat.system_prompt, params={})
        screen.chat = self.store.get_chat(chat.id)
        screen.update_status()
        screen.notify("Sampler settings back to the model's defaults.")

    # -- switching ------------------------------------------------------------------------------
    def open_model(self) -> None:
        screen = self.screen
        if screen.refuse_while_answering():
            return

        def done(path: Path | None) -> None:
            if path is None:
                return
            full = str(Path(path).expanduser().resolve())
            if screen.chat is None:
                # no chat yet: this becomes the session's default model
                self.session.use_default(Path(full))
                self.session.load(Path(full))
            else:
                self.apply_settings(ChatSettings(full, screen.chat.system_prompt, screen.chat.params))
            screen.update_status()

        self.app.push_screen(
            ModelPicker(current=self.local_model(), check=check_model_file,
                        open_models=self.app.action_models, title="Open model"),
            done,
        )

    def use_model(self, path: ModelSource) -> None:
        """Models → Use: the open chat switches to `path` (it is the default for new chats now too).
        A server is never a chat's own model: a chat with its own file keeps it."""
        screen = self.screen
        chat = screen.chat
        name = display_name(path)
        if isinstance(path, ServerSource):
            if chat is not None and chat.model:
                screen.notify(f"{name} is the default for new chats; this chat keeps its own model "
                              f"({display_name(chat.model)}; Ctrl+O changes it).")
            else:
                self.session.load(path)
                screen.notify(f"{name} is the model now (also for new chats).")
            screen.update_status()
            return
        if chat is not None and chat.model and Path(chat.model).expanduser() != path:
            self.apply_settings(ChatSettings(str(path), chat.system_prompt, chat.params), quiet=True)
            screen.notify(f"{name}: this chat's model, and the default for new chats.")
            return
        self.session.load(path)
        screen.update_status()
        screen.notify(f"{name} is the model now (also for new chats).")

    def reload_model(self) -> None:
        wanted = self.model_path_for(self.screen.chat)
        if wanted is None:
            self.screen.notify("No model configured.")
            return
        self.session.load(wanted, force=True)

    def toggle_precise(self) -> None:
        """Exact mode on or off (config.toml's [engine] precise), then the model again with it."""
        screen = self.screen
        config = self.app.config
        precise = not bool(config.precise)
        try:
            save_precise(config.path, precise)
        except DgchatError as exc:
            screen.notify(str(exc), severity="error")
            return
        config.precise = precise
        engine = self.session.engine
        servers_choice = engine is not None and engine.precise is None  # a server's model: not ours to set
        screen.notify(("Precise mode on: f32 KV cache, no flash attention." if precise else
                       "Precise mode off: f16 KV cache, flash attention on auto.")
                      + (" A server's model runs as the server says (dgchat serve --precise)." if servers_choice
                         else ""))
        if not servers_choice and not screen.refuse_while_answering():
            self.reload_model()

    def model_info(self) -> None:
        engine = self.session.engine
        if engine is None:
            self.screen.notify("No model is loaded.")
            return
        info = engine.info
        temperature, defaults = defaults_text(info.defaults, info.uniform_state)
        block = block_size_of(engine)
        writes = ""
        if block:  # the label names the variant
            writes = (f"writes: left to right, block after block ({block} tokens a block, fixed by the model; "
                      "steps are per block; no infill)\n")
        placed = f"placement: {engine.placement.summary()}\n" if engine.placement is not None else ""
        text = (
            f"{info.name}\n{short_path(engine.path)}\n\narchitecture: {info.architecture} ({info.family})\n"
            f"runs as: {engine.label}\n{placed}{writes}context: {engine.n_ctx_max:,} tokens\n"
            f"temperature: {temperature}\nrecommended sampler: {defaults}"
        )
        try:  # this chat's settings and where each came from (as `dgchat generate --json` reports them)
            table = self.resolved_params(engine).table()
            text += f"\n\nthis chat runs with:\n{sources_text(table, info.uniform_state, block_size=block)}"
        except DgchatError as exc:  # a chat setting the model refuses: the status line says so too
            text += f"\n\nthis chat's settings: {exc}"
        self.app.push_screen(ErrorModal("Model", text))
