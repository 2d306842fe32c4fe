"""What the wizard's parts share: the steps in order, what a step offers in the button bar
(`NavPlan`), the hooks the screen calls on a step (`WizardStep`), and the small-terminal limits that
more than one part lays out by."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from textual.widget import Widget

STEPS = ("welcome", "hardware", "model", "download", "ready")  # the steps line; "server" counts as "model"
STEP_TITLES = {"welcome": "Welcome", "hardware": "This machine", "model": "Model", "download": "Download",
               "ready": "Ready"}

WIZARD_MAX_WIDTH = 110  # #wizard's max-width in dgchat.tcss
NARROW = 90  # columns below which the buttons take their short labels
SHORT = 28  # rows below which the buttons lose their borders and the table shows fewer rows


@dataclass(frozen=True)
class NavPlan:
    """What the button bar offers on a step. The screen adds what depends on how the wizard was
    opened: Close when it was run again (unless `busy`), and no Skip setup then."""

    shown: frozenset[str] = frozenset()  # the ids of the bar's buttons shown besides the main one
    next_label: str = "Next"
    next_enabled: bool = True
    next_shown: bool = True
    back_label: str = "Back"
    labels: Mapping[str, str] = field(default_factory=dict)  # a label the step sets (Retry's own word)
    disabled: Mapping[str, bool] = field(default_factory=dict)  # buttons whose state the step sets
    busy: bool = False  # a download runs: Close (run again) is not offered until it has stopped


class WizardStep(Protocol):
    """A step widget: the ContentSwitcher's child with the id `step-<name>`. The screen asks it
    what the bar offers and where the focus goes, and hands it the main button's press; the step
    answers with messages (app/wizard/messages.py)."""

    def nav_plan(self) -> NavPlan:
        """The buttons this step offers now."""
        ...

    def focus_target(self) -> Widget | None:
        """The field that takes the focus when the step shows (None: the main button)."""
        ...

    def next(self) -> None:
        """The main button was pressed (or Enter in a field, or a table row chosen)."""
        ...
