"""A checkbox whose mark reads the same without colour: ✓ when on, blank when off.

Textual's Checkbox draws an X in both states and tells them apart by colour only, so the wizard's
"GPU offload ▐X▌ offloads" read as on for a CPU-only machine (and does in any monochrome terminal,
screenshot or screen reader's text).
"""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Checkbox

ON_MARK = "✓"
OFF_MARK = " "


class TickBox(Checkbox):
    @property
    def _button(self) -> Content:
        # the mark Checkbox draws is its class's BUTTON_INNER: this box's own follows its value
        self.BUTTON_INNER = ON_MARK if self.value else OFF_MARK
        return super()._button
