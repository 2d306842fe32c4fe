"""The wizard's steps line, under its title: '✓ Welcome  ›  2 This machine  ›  3 Model …'.

Where that does not fit, only the current step is named ('✓ 1 › 2 This machine › 3 › 4 › 5'). A step
passed over is marked '–', not '✓' (the download, when the model needed none). The server form
counts as the model step.
"""

from __future__ import annotations

from typing import Any

from dgchat.app.wizard.step import STEP_TITLES, STEPS, WIZARD_MAX_WIDTH
from rich.text import Text
from textual.widgets import Static


def steps_text(step: str, *, download_skipped: bool, short: bool) -> Text:
    """The line at `step`; `short`: only the current step named, the others numbered."""
    current = STEPS.index("model" if step == "server" else step)
    skipped = {"download"} if step == "ready" and download_skipped else set()
    text = Text()
    for i, name_of in enumerate(STEPS):
        if i:
            text.append(" › " if short else "  ›  ", style="dim")
        name = f"{i + 1}" if short and i != current else STEP_TITLES[name_of]
        if i < current and name_of in skipped:
            text.append(f"– {name}" if short else f"– {name} skipped", style="dim")
        elif i < current:
            text.append(f"✓ {name}", style="dim")
        elif i == current:
            text.append(f"{i + 1} {name}", style="bold reverse")
        else:
            text.append(name if short else f"{i + 1} {name}", style="dim")
    return text


class StepsLine(Static):
    """#wiz-steps: the whole line where it fits the terminal's `width`, else the short one."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", id="wiz-steps", **kwargs)

    def show(self, step: str, *, download_skipped: bool, width: int) -> None:
        full = steps_text(step, download_skipped=download_skipped, short=False)
        room = min(width, WIZARD_MAX_WIDTH) - 4  # #wizard's and #wiz-steps' padding
        self.update(full if full.cell_len <= room else steps_text(step, download_skipped=download_skipped, short=True))
