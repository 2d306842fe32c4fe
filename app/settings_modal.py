"""Per-chat settings: model, system prompt / persona, sampler settings with the model's defaults.

Every field shows the value the chat runs with; "default: …" beside it is the model's recommended
value (over the config file's [sampler] table). Saving stores only values that differ from the
defaults, so a chat keeps following the model where the user did not choose otherwise. "Reset"
puts every field back to its default.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.params import ALGORITHMS, CACHE_MODES, DiffusionParams
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, TextArea

# field -> (label, kind, help); kind: int | float | choice list
FIELDS: dict[str, tuple[str, Any, str]] = {
    "steps": ("Steps", int, "per canvas"),
    "gen_length": ("Canvas length", int, "tokens denoised at once"),
    "block_length": ("Block length", int, "= canvas length: one block"),
    "algorithm": ("Algorithm", ALGORITHMS, "which positions go first"),
    "threshold": ("Threshold", float, "commit all this sure"),
    "temperature": ("Temperature", float, "0 = greedy"),
    "cache": ("Cache mode", CACHE_MODES, "KV reuse across steps"),
    "max_tokens": ("Max tokens", int, "longest answer"),
    "seed": ("Seed", int, "random seed"),
}


@dataclass(frozen=True)
class ChatSettings:
    model: str | None
    system_prompt: str
    params: dict[str, Any]  # overrides only


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _flags_to_names(message: str) -> str:
    return re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), message)


class SettingsModal(ModalScreen[ChatSettings | None]):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="dialog.cancel"),
        Binding("ctrl+s", "save", "Save", priority=True, id="settings.save"),
    ]

    def __init__(
        self,
        *,
        chat_title: str,
        model: str | None,
        default_model_name: str,
        system_prompt: str,
        overrides: dict[str, Any],
        defaults: DiffusionParams,
        resolve: Callable[[DiffusionParams], DiffusionParams],
        check_model: Callable[[str], str | None],
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.chat_title = chat_title
        self.model = model
        self.default_model_name = default_model_name
        self.system_prompt = system_prompt
        self.overrides = dict(overrides)
        self.defaults = defaults
        self.resolve = resolve
        self.check_model = check_model

    def compose(self) -> ComposeResult:
        effective = self.defaults.updated(**{k: v for k, v in self.overrides.items() if k in FIELDS})
        with Vertical(classes="dialog -wide -tall", id="settings"):
            yield Label(f"Chat settings — {self.chat_title}", classes="dialog--title", markup=False)
            with VerticalScroll(id="settings-scroll"):
                yield Label("Model (blank: the default model)", classes="settings--label")
                yield Input(self.model or "", placeholder=f"default: {self.default_model_name}", id="field-model",
                            compact=True)
                yield Label("System prompt / persona", classes="settings--label")
                yield TextArea(self.system_prompt, id="field-system", soft_wrap=True, tab_behavior="focus",
                               compact=True)
                with Grid(id="settings-grid"):
                    for name, (label, kind, help_text) in FIELDS.items():
                        yield Label(label, classes="settings--label")
                        value = getattr(effective, name)
                        if isinstance(kind, tuple):
                            yield Select([(c, c) for c in kind], value=value if value in kind else Select.BLANK,
                                         allow_blank=False, id=f"field-{name}", compact=True)
                        else:
                            yield Input(_fmt(value), id=f"field-{name}", type="number" if kind is float else "integer",
                                        compact=True)
                        default = _fmt(getattr(self.defaults, name)) or "off"
                        yield Label(f"default: {default} · {help_text}", classes="settings--default", markup=False)
            yield Label("", id="settings-error", classes="dialog--error", markup=False)
            with Horizontal(classes="dialog--buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Reset to model defaults", id="reset")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        if self.app.is_headless:
            self.query_one("#field-system", TextArea).cursor_blink = False
        self.query_one("#field-steps", Input).focus()

    # -- reading the form -----------------------------------------------------------------------
    def _values(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, (label, kind, _help) in FIELDS.items():
            if isinstance(kind, tuple):
                values[name] = self.query_one(f"#field-{name}", Select).value
                continue
            raw = self.query_one(f"#field-{name}", Input).value.strip()
            if not raw:
                values[name] = None
                continue
            try:
                values[name] = int(raw) if kind is int else float(raw)
            except ValueError:
                noun = "a whole number" if kind is int else "a number"
                raise DgchatError(f"{label}: {raw!r} is not {noun}") from None
        return values

    def collect(self) -> ChatSettings:
        """The form as settings, validated; raises DgchatError naming the bad field."""
        values = self._values()
        model = self.query_one("#field-model", Input).value.strip() or None
        if model is not None:
            problem = self.check_model(model)
            if problem:
                raise DgchatError(f"Model: {problem}")
        overrides = {k: v for k, v in values.items() if v is not None and v != getattr(self.defaults, k)}
        try:
            self.resolve(self.defaults.updated(**overrides).with_defaults(values))
        except DgchatError as exc:
            raise DgchatError(_flags_to_names(str(exc))) from None
        system = self.query_one("#field-system", TextArea).text
        return ChatSettings(model=model, system_prompt=system, params=overrides)

    # -- actions --------------------------------------------------------------------------------
    def action_save(self) -> None:
        try:
            settings = self.collect()
        except DgchatError as exc:
            self.query_one("#settings-error", Label).update(str(exc))
            return
        self.dismiss(settings)

    def action_reset(self) -> None:
        for name, (_label, kind, _help) in FIELDS.items():
            value = getattr(self.defaults, name)
            if isinstance(kind, tuple):
                if value in kind:
                    self.query_one(f"#field-{name}", Select).value = value
            else:
                self.query_one(f"#field-{name}", Input).value = _fmt(value)
        self.query_one("#settings-error", Label).update("")

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        {"save": self.action_save, "reset": self.action_reset, "cancel": self.action_cancel}[event.button.id or "cancel"]()

