"""The NPC workshop's line form: free text or a template with holes, its slots, count, length,
temperature and seed, checked as they are typed, and the LineSpec built from them.

A mixin of NpcScreen (app/npc_screen.py): its methods run on the screen and use its widgets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgchat.app.tool_screen import ToolScreen
from dgchat.model_backend import param_resolution
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.params import DiffusionParams
from dgchat.npc.errors import NpcError, TemplateError
from dgchat.npc.generator import (
    MAX_COUNT,
    LineSpec,
)
from dgchat.npc.templates import parse_template
from dgchat.terminal_text import one_line
from textual.containers import (
    Grid,
)
from textual.widgets import Button, Input, Label, Select

if TYPE_CHECKING:  # the mixin's methods run on the workshop screen: the type checker sees them there
    _ScreenBase = ToolScreen
else:
    _ScreenBase = object


class NpcLineForm(_ScreenBase):
    """The form that says which line to write."""

    def on_input_changed(self, event: Input.Changed) -> None:
        widget_id = event.input.id or ""
        if widget_id == "npc-template":
            self._template_changed(event.value)
        elif widget_id.startswith("npc-var-"):
            self.var_values[widget_id.removeprefix("npc-var-")] = event.value
        if widget_id.startswith("npc-"):
            self._recheck_form()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if (event.input.id or "").startswith("npc-"):
            event.stop()
            self.action_generate()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "npc-generate":
            event.stop()
            self.action_generate()

    def spec_error(self, message: str, *, from_form: bool = False) -> None:
        """Name a problem with the line under the form ("" clears it). `from_form`: the form's own
        problem (build_spec), checked again as the form changes (`_recheck_form`)."""
        label = self.query_one("#npc-spec-error", Label)
        label.update(one_line(message))
        label.set_class(not message, "-empty")
        self._form_problem = from_form and bool(message)

    def _recheck_form(self) -> None:
        """A problem that Ctrl+G found in the form is checked again after a change: it goes once fixed
        (a character created, a variable filled in) or names what is still wrong, instead of staying
        on screen until the next Ctrl+G. Problems of a run (the server, the model) are left alone."""
        if not self._form_problem:
            return
        try:
            self.build_spec(fresh_seed=False)
        except DgchatError as exc:
            self.spec_error(str(exc), from_form=True)
            return
        self.spec_error("")

    def _template_changed(self, source: str) -> None:
        self.query_one("#npc-length", Select).disabled = bool(source.strip())
        if not source.strip():
            self._template_problem("")
            self._set_slots(())
            return
        try:
            template = parse_template(source)
        except TemplateError as exc:
            self._template_problem(str(exc))
            return
        self._template_problem("" if template.holes else "the template has no hole ({___}) for the model to fill")
        self._set_slots(template.slots)

    def _template_problem(self, message: str) -> None:
        # a template without a problem does not clear what Ctrl+G found elsewhere in the form (no
        # character, a variable without a value): _recheck_form decides about that
        if message or not self._form_problem:
            self.spec_error(message)

    def _set_slots(self, slots: tuple[str, ...]) -> None:
        if slots == self._slots:
            return
        self._slots = slots
        grid = self.query_one("#npc-vars-grid", Grid)
        grid.remove_children()
        widgets = []
        for name in slots:
            widgets.append(Label(f"{{{name}}}", classes="npc--var-label", markup=False))
            widgets.append(Input(self.var_values.get(name, ""), placeholder="value", id=f"npc-var-{name}",
                                 compact=True))
        grid.mount_all(widgets)
        grid.display = bool(slots)
        self.query_one("#npc-vars-none").display = not slots

    def _int_field(self, widget_id: str, label: str) -> int:
        raw = self.query_one(f"#{widget_id}", Input).value.strip()
        try:
            return int(raw)
        except ValueError:
            raise NpcError(f"{label}: enter a whole number (got {raw!r})") from None

    @property
    def seed_typed(self) -> bool:
        """Whether the person typed a seed (kept for every batch) rather than leaving the field empty
        (new seeds for each batch)."""
        return bool(self.query_one("#npc-seed", Input).value.strip())

    def build_spec(self, *, fresh_seed: bool = True) -> LineSpec:
        """The form as a LineSpec, validated; NpcError names the problem. With the Seed field empty
        the spec's seed is newly drawn (`fresh_seed`; False: only checking the form, seed 0)."""
        card = self.current_card
        if card is None:
            raise NpcError("no character: create one first (Ctrl+N)")
        source = self.query_one("#npc-template", Input).value
        template = source if source.strip() else None  # kept exactly as typed: its text stays byte-identical
        variables: dict[str, str] = {}
        if template is not None:
            parsed = parse_template(template)
            for name in parsed.slots:
                value = self.var_values.get(name, "")
                if not value:
                    raise NpcError(f"the variable {{{name}}} has no value")
                variables[name] = value
            filled = parsed.fill(variables)
            if not filled.holes:
                raise TemplateError("the template has no hole ({___}) for the model to fill")
        count = self._int_field("npc-count", "Variants")
        if not 1 <= count <= MAX_COUNT:
            raise NpcError(f"Variants: 1 to {MAX_COUNT} (got {count})")
        seed = self._int_field("npc-seed", "Seed") if self.seed_typed else None
        raw_t = self.query_one("#npc-temperature", Input).value.strip()
        try:
            temperature = float(raw_t) if raw_t else None
        except ValueError:
            raise NpcError(f"Temp: enter a number (got {raw_t!r})") from None
        if temperature is not None and not 0 <= temperature <= 5:
            raise NpcError(f"Temp: 0 to 5 (got {raw_t})")
        if seed is None:
            # nobody chose a seed: another Ctrl+G is meant to give other lines (through the module, so
            # that tests' repeatable draws apply)
            seed = param_resolution.draw_seed() if fresh_seed else 0
        spec = LineSpec(
            card,
            context=self.query_one("#npc-context", Input).value.strip(),
            situation=self.query_one("#npc-situation", Input).value.strip(),
            template=template,
            variables=variables,
            length=str(self.query_one("#npc-length", Select).value),
            count=count,
            seed=seed,
            params=DiffusionParams(temperature=temperature),
        )
        spec.validate()
        return spec
