"""This machine's speed as the wizard knows it: the saved or measured profile, or how its
measurement goes, and what the machine and model steps say about it.

The measurement itself runs on the machine step (hardware.py, in a worker); the model step gets
each new report through the screen (messages.SpeedChanged) and lists models by memory until a
profile arrives, then by answer time.
"""

from __future__ import annotations

from dataclasses import dataclass

from dgchat.app import model_ops
from dgchat.hub.machine_profile import MachineProfile, summary
from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class SpeedReport:
    """The profile, or the state of its measurement."""

    profile: MachineProfile | None = None
    state: str = "unknown"  # unknown | measuring | ready | failed | stopped
    error: str = ""  # why the measurement failed
    progress: tuple[float, str] = (0.0, "")  # the measurement's fraction done, and what it measures now

    def status(self) -> str:
        """One line on the measurement while there is no profile ("" once there is one)."""
        if self.state == "measuring":
            return model_ops.measuring_text(*self.progress)
        if self.state == "failed":
            return (f"This machine's speed could not be measured ({self.error}); models are "
                    "suggested by memory only.")
        if self.state in ("unknown", "stopped") and self.profile is None:
            return "This machine's speed is not measured yet; models are suggested by memory only."
        return ""

    def no_speed(self) -> str:
        """Why a model that fits has no answer time (model_ops.speed_lines)."""
        if self.state == "measuring":
            return "not known yet (measuring this machine, a few seconds)"
        if self.state == "failed":
            return "unknown (this machine's speed could not be measured)"
        return "unknown (this machine's speed is not measured)"

    def rows(self, label_width: int) -> Table | Text:
        """The machine step's speed rows (machine_profile.summary), their labels `label_width`
        wide so that they line up with the fields above; without a profile, the status line."""
        if self.profile is None:
            return Text(self.status(), style="red" if self.state == "failed" else "")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=label_width, style="bold", no_wrap=True)
        grid.add_column()
        for label, value in summary(self.profile):
            grid.add_row(Text(label), Text(value))  # the CPU's name is the system's text, never markup
        return grid
