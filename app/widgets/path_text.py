"""Text with file paths in it, wrapped after a '/' instead of inside a name.

Textual wraps a line at its spaces and folds a word longer than the line wherever the line ends, so
a path longer than its column reads `~/.local/share/dgcha` / `t/models`. `PathText` is a Visual (what
a Static shows: `static.update(PathText(text))`) that lays the text out again for the width it is
given: words as Textual would, and a word longer than a whole line (a path, a repository) broken
after one of its '/' (`~/.local/share/` / `dgchat/models`); only a part between two '/' that is
still longer than the line is folded at the edge. A word that fits on a line of its own moves there
whole, as before.
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from textual.content import Content
from textual.css.styles import RulesMap
from textual.strip import Strip
from textual.style import Style
from textual.visual import RenderOptions, Visual

_WORD = re.compile(r"\S+")
_PIECE = re.compile(r"[^/]*/+|[^/]+")  # a word's parts, each ending after its '/'


def _fold(text: str, start: int, end: int, width: int) -> int:
    """The index in text[start:end] up to which at most `width` cells fit (at least one character)."""
    cells = 0
    for i in range(start, end):
        cells += cell_len(text[i])
        if cells > width:
            return max(i, start + 1)
    return end


def line_spans(text: str, width: int) -> list[tuple[int, int]]:
    """(start, end) of each line `text` takes at `width` cells, breaking at spaces and, inside a
    word longer than a line, after a '/'. The spaces at a break are dropped."""
    width = max(1, width)
    spans: list[tuple[int, int]] = []
    start = 0
    for physical in text.split("\n"):
        end = start + len(physical)
        line_start, line_cells, last_end = start, 0, start
        for match in _WORD.finditer(text, start, end):
            word_start, word_end = match.span()
            # the spaces before the word count, except after a break (they are dropped there)
            gap = cell_len(text[last_end:word_start]) if line_cells or line_start == start else 0
            cells = cell_len(match.group())
            if line_cells + gap + cells <= width:
                line_cells += gap + cells
                last_end = word_end
                continue
            if cells <= width:  # the word moves to the next line whole
                if line_cells:
                    spans.append((line_start, last_end))
                line_start, line_cells, last_end = word_start, cells, word_end
                continue
            for n, piece in enumerate(_PIECE.finditer(text, word_start, word_end)):
                piece_start, piece_end = piece.span()
                piece_gap = gap if n == 0 else 0
                piece_cells = cell_len(piece.group())
                if line_cells + piece_gap + piece_cells <= width:
                    line_cells += piece_gap + piece_cells
                    last_end = piece_end
                    continue
                if line_cells:
                    spans.append((line_start, last_end))
                    line_start = piece_start
                while cell_len(text[line_start:piece_end]) > width:  # a part longer than a line
                    cut = _fold(text, line_start, piece_end, width)
                    spans.append((line_start, cut))
                    line_start = cut
                line_cells = cell_len(text[line_start:piece_end])
                last_end = piece_end
        spans.append((line_start, last_end))
        start = end + 1
    return spans


class PathText(Visual):
    """A Static's text laid out by `line_spans` for the width it is drawn at (see the module
    docstring); its styles (spans) are kept."""

    def __init__(self, text: str | Content) -> None:
        self.content = text if isinstance(text, Content) else Content(text)
        self._laid_out: tuple[int, Content] | None = None

    def __str__(self) -> str:
        return self.content.plain

    def at(self, width: int) -> Content:
        """The text with its line breaks for `width` cells."""
        if self._laid_out is not None and self._laid_out[0] == width:
            return self._laid_out[1]
        content = self.content
        lines = Content("\n").join(content[a:b] for a, b in line_spans(content.plain, width))
        self._laid_out = (width, lines)
        return lines

    def render_strips(self, width: int, height: int | None, style: Style, options: RenderOptions) -> list[Strip]:
        return self.at(width).render_strips(width, height, style, options)

    def get_optimal_width(self, rules: RulesMap, container_width: int) -> int:
        return self.content.get_optimal_width(rules, container_width)

    def get_minimal_width(self, rules: RulesMap) -> int:
        return self.content.get_minimal_width(rules)

    def get_height(self, rules: RulesMap, width: int) -> int:
        return self.at(width).get_height(rules, width)
