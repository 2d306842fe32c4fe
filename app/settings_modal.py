"""Per-chat settings: model, system prompt / persona, sampler settings with the model's defaults.

Every field shows the value the chat runs with; "default: …" beside it is the model's recommended
value (over the config file's [sampler] table). Saving stores only values that differ from the
defaults, so a chat keeps following the model where the user did not choose otherwise. "Reset"
puts every field back to its default.

The temperature rows follow the model's family: a masked-diffusion model samples at `temperature`;
a DiffusionGemma (uniform-state, the bundled model too) never reads it while it denoises, its
temperature anneals from t_max to t_min over each canvas's steps, so for it the form shows those two
("Temp. start", "Temp. end") and what runs ("runs 0.8 → 0.4"), as the status line does.

A block-diffusion model (SDAR, BD3LM) writes its answer block after block: its canvas and block
length are the model's block size, fixed by its training, so those fields (and the algorithm and
cache mode, which have one value there) are shown disabled with a note (block_notes); its steps are
per block, its threshold SDAR's dynamic rule, and Max tokens is the answer's length.

Fields are checked as they are typed: a field that is not a number, or that the engine's
`resolve` refuses, says why in place of its "default: …" note, and Save refuses with the same
message. The model is a path (typed, → completes) or chosen from the model picker (Choose…).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgchat.app.model_picker import ModelPicker
from dgchat.app.models_screen import ModelsScreen
from dgchat.app.paths import display_name
from dgchat.app.sampler_text import annealed
from dgchat.app.widgets.path_suggester import PathSuggester
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.model_info import VARIANT_NAMES
from dgchat.model_backend.params import DiffusionParams, ParamField
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, TextArea

# The sampler fields a form can show, with the form's words for each: its label and the note beside
# it. Which temperature fields a form shows depends on the model (fields_for).
_LABELS: dict[str, tuple[str, str]] = {
    "steps": ("Steps", "per canvas"),
    "gen_length": ("Canvas length", "tokens denoised at once"),
    "block_length": ("Block length", "= canvas length: one block"),
    "algorithm": ("Algorithm", "which positions go first"),
    # Fast-dLLM parallel decoding: every position whose top token has at least this probability is
    # committed in the same step
    "threshold": ("Threshold", "commit every token at least this sure"),
    "temperature": ("Temperature", "0 = greedy"),
    "t_max": ("Temp. start", "the first step's temperature"),
    "t_min": ("Temp. end", ""),  # the hint says the schedule the fields make (_default_hint)
    "cache": ("Cache mode", "KV reuse across steps"),
    "max_tokens": ("Max tokens", "longest answer"),
    "seed": ("Seed", "the same seed repeats an answer"),
}


def _kind(spec: ParamField) -> Any:
    """What a field's widget takes: its choices (a select), else int or float (a number input)."""
    return spec.choices or spec.kind


# field -> (label, kind, help); kind: int | float | choice list, from the field's row of
# DiffusionParams.FIELDS (the type and range every reader of settings checks)
FIELDS: dict[str, tuple[str, Any, str]] = {
    name: (label, _kind(DiffusionParams.FIELDS[name]), note) for name, (label, note) in _LABELS.items()
}


def _range_words(spec: ParamField) -> str:
    """A number field's range as the form says it: "a whole number, 1–8192", "a number above 0,
    at most 1". A bound of ten digits or more (a seed's 2^64 - 1) is no help to read: "or more"."""
    if spec.kind is int:
        top = f"–{spec.highest}" if spec.highest is not None and spec.highest < 10**9 else " or more"
        return f"a whole number, {spec.lo}{top}"
    if spec.lo_open:
        return f"a number above {spec.lowest:g}, at most {spec.highest:g}"
    return f"a number, {spec.lowest:g}–{spec.highest:g}"


# what blank or 0 means in a field, where it means something
_TAKES_NOTES = {"block_length": " (blank: the default)", "threshold": " (blank: the default)",
                "temperature": " (0 = greedy)"}
# what a number field takes, for the message when the text is not a number at all (the rules between
# fields are the engine's, from `resolve`)
TAKES: dict[str, str] = {
    name: _range_words(DiffusionParams.FIELDS[name]) + _TAKES_NOTES.get(name, "")
    for name, (_label, kind, _help) in FIELDS.items() if kind in (int, float)
}


ANNEALED_FIELDS = ("t_max", "t_min")


def fields_for(annealed: bool) -> tuple[str, ...]:
    """The sampler fields a form shows: with an annealed temperature (DiffusionGemma) t_max and
    t_min in place of `temperature`, which such a model does not read while it denoises."""
    shown: list[str] = []
    for name in FIELDS:
        if name in ANNEALED_FIELDS:
            continue
        if name == "temperature" and annealed:
            shown.extend(ANNEALED_FIELDS)
        else:
            shown.append(name)
    return tuple(shown)


# block diffusion: fields that have one value for such a model (the engine refuses or replaces others)
BLOCK_FIXED = ("gen_length", "block_length", "algorithm", "cache")


def block_notes(block_size: int, variant: str = "") -> dict[str, str]:
    """The help beside each field for a block-diffusion model (SDAR, BD3LM) with blocks of
    `block_size` tokens: what the field means there, and which fields are fixed (one line in the
    form's third column at 80 columns, "default: … · " included)."""
    name = VARIANT_NAMES.get(variant, variant.upper() or "the model")
    return {
        "steps": f"per block (blocks of {block_size} tokens)",
        "gen_length": "fixed: one block (Max tokens: the answer)",
        "block_length": f"fixed: the model's blocks of {block_size}",
        "algorithm": "fixed: the most confident positions first",
        # SDAR's low_confidence_dynamic (JetAstra/SDAR generate.py), not Fast-dLLM's threshold
        "threshold": "SDAR's dynamic threshold" if variant != "bd3lm" else f"{name}'s schedule; a value: SDAR's",
        "cache": "fixed: finished blocks are cached exactly",
        "max_tokens": "the whole answer's length",
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


def fields_named(message: str) -> list[str]:
    """The fields a parameter message is about ("canvas length 64 is not divisible by block length
    24" -> gen_length, block_length), so each can show it."""
    lowered = message.lower()
    named = []
    for name, (label, _kind, _help) in FIELDS.items():
        if any(re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", lowered) for word in (name, label.lower())):
            named.append(name)
    return named


def server_refuses(names: list[str]) -> str:
    """The message for a chat whose own settings a server cannot take (dgchat.remote.RemoteEngine
    .unsupported), naming the Settings fields, not the command line's flags."""
    labels = ", ".join(FIELDS[n][0] if n in FIELDS else n.replace("_", " ") for n in names)
    return f"this server takes no {labels}; reset {'it' if len(names) == 1 else 'them'} in Settings (Ctrl+O)"


def parse_number(name: str, raw: str) -> int | float:
    """The text of a number field as its value; raises ValueError."""
    kind = FIELDS[name][1]
    if kind is int:
        return int(raw)
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


class SettingsModal(ModalScreen[ChatSettings | None]):
    DEFAULT_CSS = """
    SettingsModal { align: center middle; }
    SettingsModal #settings {
        width: 92;
        max-width: 100%;
        height: 32;  /* everything without scrolling */
        max-height: 90%;
        padding: 1 2;
        border: thick $primary 70%;
        background: $surface;
    }
    SettingsModal.-narrow #settings { width: 100%; padding: 0 1; }
    SettingsModal.-short #settings { height: 100%; max-height: 100%; padding: 0 1; }
    SettingsModal .settings--title { text-style: bold; width: 100%; margin-bottom: 1; }
    SettingsModal.-short .settings--title { margin-bottom: 0; }
    SettingsModal #settings-scroll { height: 1fr; }
    SettingsModal .settings--label { color: $text-muted; }
    SettingsModal .settings--label.-active { color: $accent; text-style: bold; }
    SettingsModal #model-row { height: auto; }
    SettingsModal #field-model { width: 1fr; }
    SettingsModal #choose-model { min-width: 12; margin-left: 1; }
    SettingsModal #field-system { height: 6; }
    SettingsModal.-short #field-system { height: 4; }
    SettingsModal Input:focus, SettingsModal TextArea:focus { border: tall $accent; }
    SettingsModal .settings--hint { color: $text-muted; width: 100%; height: auto; }
    SettingsModal .settings--hint.-invalid { color: $error; }
    SettingsModal #settings-grid {
        grid-size: 3;
        grid-columns: 15 14 1fr;
        grid-rows: auto;
        grid-gutter: 0 1;
        height: auto;
        margin-top: 1;
    }
    SettingsModal.-narrow #settings-grid { grid-columns: 13 14 1fr; }
    SettingsModal #settings-grid Input { background: $boost; }
    SettingsModal #settings-grid Input:focus { background: $accent 35%; text-style: bold; }
    SettingsModal #settings-grid Input.-invalid { background: $error 25%; }
    SettingsModal #settings-grid Select:focus > SelectCurrent { background: $accent 35%; text-style: bold; }
    SettingsModal #settings-error { color: $error; height: auto; }
    SettingsModal #settings-buttons { height: auto; align-horizontal: right; margin-top: 1; }
    SettingsModal.-short #settings-buttons { margin-top: 0; }
    SettingsModal #settings-buttons Button { min-width: 10; margin-left: 1; }
    SettingsModal Button:focus { text-style: bold reverse; }
    """

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (70, "-roomy")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-high")]

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
        default_model: Path | None = None,
        annealed: bool = False,
        block_size: int | None = None,
        variant: str = "",
        random_seed: bool = False,
    ) -> None:
        """`annealed`: the model's temperature runs t_max → t_min (DiffusionGemma), see fields_for.
        `block_size`: a block-diffusion model (`variant` "sdar" / "bd3lm"), see block_notes.
        `random_seed`: no one fixed a seed above the chat (the config), so an empty Seed field draws
        a new one for every answer, and any number typed there, 0 included, is the chat's choice."""
        super().__init__(classes="dialog-screen")
        self.fields = fields_for(annealed)
        self.block_size = block_size or None
        self.notes = block_notes(block_size, variant) if block_size else {}
        # shown (the model's value) but not editable; the chat's own values for them are kept as they
        # are, unless Reset: they apply again to a model of another family
        self.fixed = frozenset(BLOCK_FIXED) if block_size else frozenset()
        self._drop_fixed = False
        self.chat_title = chat_title
        self.model = model
        self.default_model_name = default_model_name
        self.default_model = default_model
        self.system_prompt = system_prompt
        self.overrides = dict(overrides)
        self.defaults = defaults
        self.resolve = resolve
        self.check_model = check_model
        self._error_about = ""
        self._error_model: str | None = None
        self.random_seed = random_seed

    def compose(self) -> ComposeResult:
        effective = self.defaults.updated(**{k: v for k, v in self.overrides.items() if k in self.fields})
        with Vertical(id="settings"):
            yield Label(f"Chat settings — {self.chat_title}", classes="settings--title", markup=False)
            with VerticalScroll(id="settings-scroll"):
                yield Label("Model", id="label-model", classes="settings--label")
                with Horizontal(id="model-row"):
                    yield Input(self.model or "", placeholder=f"default: {self.default_model_name}", id="field-model",
                                suggester=PathSuggester((".gguf",)))
                    yield Button("Choose…", id="choose-model")
                yield Label(self._model_hint(self.model or ""), id="hint-model", classes="settings--hint", markup=False)
                yield Label("System prompt / persona", id="label-system", classes="settings--label")
                yield TextArea(self.system_prompt, id="field-system", soft_wrap=True, tab_behavior="focus")
                with Grid(id="settings-grid"):
                    for name in self.fields:
                        label, kind, _help = FIELDS[name]
                        yield Label(label, id=f"label-{name}", classes="settings--label")
                        fixed = name in self.fixed
                        value = getattr(self.defaults if fixed else effective, name)
                        if isinstance(kind, tuple):
                            # blank only where the model has no value (a server that samples its own way)
                            yield Select([(c, c) for c in kind], value=value if value in kind else Select.NULL,
                                         allow_blank=value not in kind, id=f"field-{name}", compact=True,
                                         disabled=fixed)
                        elif name == "seed" and self.random_seed:
                            yield Input(_fmt(self.overrides.get("seed")), placeholder="random", id="field-seed",
                                        compact=True)
                        else:
                            # plain text, not type="integer": a letter typed by mistake shows, and is named
                            yield Input(_fmt(value), id=f"field-{name}", compact=True, disabled=fixed)
                        yield Label(self._default_hint(name), id=f"hint-{name}", classes="settings--hint",
                                    markup=False)
            yield Label("", id="settings-error", markup=False)
            with Horizontal(id="settings-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Reset to model defaults", id="reset")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        steady_cursors_when_headless(self)
        self.query_one("#settings-error", Label).display = False
        self.query_one("#field-model", Input).focus()

    # -- hints ----------------------------------------------------------------------------------
    def _default_hint(self, name: str, values: dict[str, Any] | None = None) -> str:
        """"default: … · what the field does"; `values`: the form's values (None: not read yet)."""
        default = _fmt(getattr(self.defaults, name)) or "off"
        if name == "t_min":
            return f"default: {default} · runs {self._schedule(values)} over a canvas"
        if name in self.fixed:
            return self.notes[name]
        if name == "seed" and self.random_seed:
            return "default: new for each answer · a number repeats one"
        return f"default: {default} · {self.notes.get(name) or FIELDS[name][2]}"

    def _schedule(self, values: dict[str, Any] | None) -> str:
        """The annealed temperature the form's values give, as the status line writes it."""
        values = values or {}
        t_max = values.get("t_max") if values.get("t_max") is not None else self.defaults.t_max
        t_min = values.get("t_min") if values.get("t_min") is not None else self.defaults.t_min
        if t_max is None or t_min is None:
            return "the model's schedule"
        return annealed(t_max, t_min)

    @staticmethod
    def _model_hint(value: str) -> str:
        if not value.strip():
            return "Blank: the default model. Choose… lists the installed ones; → completes a typed path."
        return f"This chat: {display_name(value.strip())}. Blank: the default model; Choose… lists the installed ones."

    def _show_problems(self, problems: dict[str, str], values: dict[str, Any] | None = None) -> None:
        for name in self.fields:
            hint = self.query_one(f"#hint-{name}", Label)
            problem = problems.get(name)
            hint.update(f"✗ {problem}" if problem else self._default_hint(name, values))
            hint.set_class(problem is not None, "-invalid")
            field = self.query_one(f"#field-{name}")
            field.set_class(problem is not None, "-invalid")
        if "model" in problems:
            self._show_model_problem(problems["model"])

    def _set_error(self, text: str, about: str = "") -> None:
        """The line above the buttons: why Save refused; `about` says which part ("model", "sampler")
        so that fixing that part clears it (and fixing another part does not)."""
        self._error_about = about if text else ""
        self._error_model = self.query_one("#field-model", Input).value if about == "model" else None
        error = self.query_one("#settings-error", Label)
        error.update(text)
        error.display = bool(text)

    # -- reading the form -----------------------------------------------------------------------
    def _read(self) -> tuple[dict[str, Any], dict[str, str], str]:
        """(values, problem per field, the first problem as one line naming its field)."""
        values: dict[str, Any] = {}
        problems: dict[str, str] = {}
        first = ""
        for name in self.fields:
            label, kind, _help = FIELDS[name]
            if name in self.fixed:
                continue  # the model's value: nothing the chat chooses
            if isinstance(kind, tuple):
                chosen = self.query_one(f"#field-{name}", Select).value
                values[name] = None if chosen is Select.NULL else chosen
                continue
            raw = self.query_one(f"#field-{name}", Input).value.strip()
            if not raw:
                values[name] = None
                continue
            try:
                values[name] = parse_number(name, raw)
            except ValueError:
                problems[name] = f"“{raw}” is not {TAKES[name]}"
                first = first or f"{label}: {problems[name]}"
        if not problems:
            try:
                self.resolve(self.defaults.updated(**self._overrides(values)).with_defaults(values))
            except DgchatError as exc:
                message = _flags_to_names(str(exc))
                for name in fields_named(message):
                    problems[name] = message
                first = message
        return values, problems, first

    def _overrides(self, values: dict[str, Any]) -> dict[str, Any]:
        """The values that differ from the defaults as shown: a model file's float32 default (t_min
        0.4000000059604645) reads "0.4" in its field, and leaving it there is no choice to save."""
        return {k: v for k, v in values.items()
                if v is not None and (k == "seed" and self.random_seed  # no default: any seed is a choice
                                      or v != getattr(self.defaults, k) and _fmt(v) != _fmt(getattr(self.defaults, k)))}

    def collect(self) -> ChatSettings:
        """The form as settings, validated; raises DgchatError naming the bad field."""
        values, problems, first = self._read()
        self._show_problems(problems, values)
        if first:
            raise DgchatError(first)
        model = self.query_one("#field-model", Input).value.strip() or None
        if model is not None:
            problem = self.check_model(model)
            if problem:
                self._show_problems({"model": problem})
                raise DgchatError(f"Model: {problem}")
        system = self.query_one("#field-system", TextArea).text
        params = self._overrides(values)
        if not self._drop_fixed:  # the chat's own values of fields this model fixes: for other models
            params.update({k: v for k, v in self.overrides.items() if k in self.fixed and v is not None})
        return ChatSettings(model=model, system_prompt=system, params=params)

    def _first_invalid(self) -> None:
        for name in ("model", *self.fields):
            if self.query_one(f"#hint-{name}", Label).has_class("-invalid"):
                self.query_one(f"#field-{name}").focus()
                return

    # -- events ---------------------------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if event.input.id == "field-model":
            if event.value != self._error_model:  # not the Changed of the value Save just refused
                self._show_model_problem(None)
                if self._error_about == "model":
                    self._set_error("")
            return
        values, problems, first = self._read()
        self._show_problems(problems, values)
        if not first and self._error_about == "sampler":
            self._set_error("")

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if not self.is_mounted:
            return
        values, problems, _first = self._read()
        self._show_problems(problems, values)

    def _show_model_problem(self, problem: str | None) -> None:
        hint = self.query_one("#hint-model", Label)
        hint.update(f"✗ {problem}" if problem else self._model_hint(self.query_one("#field-model", Input).value))
        hint.set_class(problem is not None, "-invalid")

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        # the focused field's label lights up too: focus is visible even where a field is one line
        field_id = event.widget.id or ""
        name = "model" if field_id == "choose-model" else field_id.removeprefix("field-")
        for label in self.query(".settings--label"):
            label.set_class(label.id == f"label-{name}", "-active")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        {"save": self.action_save, "reset": self.action_reset, "cancel": self.action_cancel,
         "choose-model": self.action_choose_model}[event.button.id or "cancel"]()

    # -- actions --------------------------------------------------------------------------------
    def action_save(self) -> None:
        try:
            settings = self.collect()
        except DgchatError as exc:
            self._set_error(str(exc), "model" if str(exc).startswith("Model: ") else "sampler")
            self._first_invalid()
            return
        self.dismiss(settings)

    def action_reset(self) -> None:
        self._drop_fixed = True
        for name in self.fields:
            kind = FIELDS[name][1]
            value = getattr(self.defaults, name)
            if isinstance(kind, tuple):
                if value in kind:
                    self.query_one(f"#field-{name}", Select).value = value
            else:
                self.query_one(f"#field-{name}", Input).value = "" if name == "seed" and self.random_seed else _fmt(value)
        self._set_error("")

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_choose_model(self) -> None:
        typed = self.query_one("#field-model", Input).value.strip()
        current = Path(typed).expanduser() if typed else self.default_model
        self.app.push_screen(
            ModelPicker(current=current, check=self.check_model, open_models=self._open_models,
                        title="Choose this chat's model"),
            self._model_chosen,
        )

    def _model_chosen(self, path: Path | None) -> None:
        field = self.query_one("#field-model", Input)
        if path is not None:
            field.value = str(path)
            field.cursor_position = len(field.value)
        field.focus()

    def _open_models(self) -> None:
        """The Models screen over these settings; the model it is told to Use fills the Model field."""
        if any(isinstance(s, ModelsScreen) for s in self.app.screen_stack):
            return
        self.app.push_screen(ModelsScreen(), self._model_chosen)
