"""A footer that never cuts a key in half: what does not fit is left out, least relevant first.

Textual's Footer lays its keys in one row and lets the ones past the edge disappear under the
command-palette key, so an 80-column chat read `… ^o Settings f1 K▏^p Commands` while generating.
`FittingFooter` measures its keys after each layout and hides whole keys until the row fits. The
keys closest to what has focus stay longest (the replay's own keys over the message's, those over
the screen's, those over the app's), and F1 (every key, with its description) stays to the last:
a key left out here still works and is listed there. A screen may name actions to leave out
before all others (`FOOTER_DROP_FIRST`): the chat keeps Settings over New chat and Search.
"""

from __future__ import annotations

from typing import Any

from textual.widgets import Footer
from textual.widgets._footer import FooterKey

# the key that lists all the others: it is what a person needs when the row is short
KEYS_ACTION = "help"
_APP_LEVEL = 1_000  # below every widget and the screen


class FittingFooter(Footer):
    """Footer whose row is always whole keys (see the module docstring)."""

    def on_mount(self) -> None:
        super().on_mount()
        self.call_after_refresh(self.fit_keys)

    def on_resize(self) -> None:
        self.call_after_refresh(self.fit_keys)

    async def recompose(self) -> None:
        await super().recompose()
        self.call_after_refresh(self.fit_keys)

    def _level(self, action: str) -> int:
        """How far from the focused widget the binding for `action` lives: 0 the focused widget, 1
        its parent, ..., then the screen, then the app (_APP_LEVEL)."""
        if action == KEYS_ACTION:
            return -1
        node = self.screen.focused
        depth = 0
        while node is not None and node is not self.screen:
            if _binds(node, action):
                return depth
            node = node.parent
            depth += 1
        if _binds(self.screen, action):
            return depth
        return _APP_LEVEL

    def fit_keys(self) -> None:
        if not self.is_attached:
            return
        keys = [k for k in self.query(FooterKey) if not k.has_class("-command-palette")]
        if not keys:
            return
        palette = [k for k in self.query(FooterKey) if k.has_class("-command-palette")]
        # the palette key is docked right with a one-cell border and its padding
        room = self.size.width - sum(_width(k) + 2 for k in palette)
        for key in keys:
            key.display = True
        used = sum(_width(k) for k in keys)
        if used <= room:
            return
        # least relevant first: what the screen names in FOOTER_DROP_FIRST, then the farthest from
        # focus, and within one level the rightmost
        first = tuple(getattr(self.screen, "FOOTER_DROP_FIRST", ()))
        order = sorted(range(len(keys)), key=lambda i: (
            first.index(keys[i].action) if keys[i].action in first else len(first),
            -self._level(keys[i].action), -i))
        for i in order:
            if used <= room:
                break
            keys[i].display = False
            used -= _width(keys[i])


def _width(key: FooterKey) -> int:
    """The cells a key takes in the row (its rendered text and its margins)."""
    return key.render().cell_len + key.styles.margin.left + key.styles.margin.right


def _binds(node: Any, action: str) -> bool:
    bindings = getattr(node, "_bindings", None)
    table = getattr(bindings, "key_to_bindings", None) or {}
    return any(b.action == action for group in table.values() for b in group)
