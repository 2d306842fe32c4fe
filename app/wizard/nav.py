"""The wizard's button bar: Back at the left, the step's own buttons, the main button docked at the
right (dgchat.tcss), so that it is on screen at any width.

Which buttons show and what they say comes from the current step (step.NavPlan). Below NARROW
columns the buttons take short labels (SHORT_LABELS); where the visible ones still do not fit (60
columns, run again: Close joins them) they take the shorter words of TINY_LABELS rather than being
cut. Below SHORT rows they lose their borders (compact).
"""

from __future__ import annotations

from typing import Any

from dgchat.app.wizard.step import WIZARD_MAX_WIDTH, NavPlan
from rich.cells import cell_len
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Button, Static

# button -> its label below NARROW columns (the main button's labels are short already)
SHORT_LABELS = {"Use a server…": "Server…", "Use the bundled model": "Bundled model",
                "Choose another model": "Other model", "Run the test again": "Test again"}
# a label -> a shorter one, used only where the bar's visible buttons would not fit whole with the
# labels above (60 columns, run again: Close joins them): a shorter word reads better than a cut one
TINY_LABELS = {"Bundled model": "Bundled", "Use this model": "Use it", "Use it (no download)": "Use it",
               "Resume download": "Resume", "Other model": "Other", "Test again": "Again",
               "Start chatting": "Chat", "Download again": "Again"}  # each set again by every show()
NAV_MIN_WIDTH = (16, 8)  # a bar button's min-width: Textual's Button default, below NARROW dgchat.tcss's
BUTTON_IDS = ("wiz-back", "wiz-skip", "wiz-close", "wiz-redetect", "wiz-server", "wiz-bundled", "wiz-cancel",
              "wiz-retry", "wiz-retest", "wiz-next")


class WizardNav(Horizontal):
    """The bar (#wiz-nav); its Button.Pressed messages go on to the screen, which acts on them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(id="wiz-nav", **kwargs)

    def compose(self) -> ComposeResult:
        yield Button("Back", id="wiz-back")
        yield Static("", id="wiz-nav-gap")
        yield Button("Skip setup", id="wiz-skip")
        yield Button("Close", id="wiz-close")
        yield Button("Detect again", id="wiz-redetect")
        yield Button("Use a server…", id="wiz-server")
        yield Button("Use the bundled model", id="wiz-bundled")
        yield Button("Cancel", id="wiz-cancel", variant="warning")
        yield Button("Retry", id="wiz-retry")
        yield Button("Run the test again", id="wiz-retest")
        yield Button("Next", id="wiz-next", variant="primary")

    def button(self, button_id: str) -> Button:
        return self.query_one(f"#{button_id}", Button)

    def set_compact(self, compact: bool) -> None:
        """Borderless buttons (below SHORT rows)."""
        for button in self.query(Button).results(Button):
            button.compact = compact

    def show(self, plan: NavPlan, *, rerun: bool, narrow: bool, width: int) -> None:
        """Show what `plan` offers; `rerun`: the wizard was opened again after setup (Close instead
        of Skip setup); `narrow`: below NARROW columns; `width`: the terminal's."""
        shown = set(plan.shown)
        if rerun:
            shown.discard("wiz-skip")
            if not plan.busy:
                shown.add("wiz-close")
        for button_id in BUTTON_IDS:
            if button_id != "wiz-next":
                self.button(button_id).display = button_id in shown
        for button_id, disabled in plan.disabled.items():
            self.button(button_id).disabled = disabled
        for button_id, label in plan.labels.items():
            self.button(button_id).label = label
        main = self.button("wiz-next")
        main.display = plan.next_shown
        main.label = plan.next_label
        main.disabled = not plan.next_enabled

        def short(text: str) -> str:
            return SHORT_LABELS.get(text, text) if narrow else text

        self.button("wiz-back").label = short(plan.back_label)
        for button_id, text in (("wiz-server", "Use a server…"), ("wiz-bundled", "Use the bundled model"),
                                ("wiz-retest", "Run the test again")):
            self.button(button_id).label = short(text)
        self._fit_labels(narrow, width)
        for button in self.query(Button).results(Button):
            # Textual keeps a button's width for its old label (the width is cached, a new label only
            # repaints): measured again, so a longer label is never cut
            button.clear_cached_dimensions()
            button.refresh(layout=True)

    def _fit_labels(self, narrow: bool, width: int) -> None:
        """TINY_LABELS where the visible buttons would not fit the bar: the docked main button would
        cover the end of the one before it ("Bundled mod")."""
        buttons = [b for b in self.query(Button).results(Button) if b.display]
        min_width = NAV_MIN_WIDTH[narrow]

        def button_width(button: Button) -> int:  # its label and padding (Button's content width), margin-left 1
            return max(cell_len(str(button.label)) + 2, min_width) + 1

        room = min(width, WIZARD_MAX_WIDTH) - 2  # #wizard's padding
        if sum(map(button_width, buttons)) <= room:
            return
        for button in buttons:
            button.label = TINY_LABELS.get(str(button.label), str(button.label))
