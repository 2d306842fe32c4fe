"""Banned words: kept out of generated text in two layers.

1. Prevention: every surface form of a banned word that the tokenizer writes as ONE token
   (`word`, ` word`, `Word`, ` Word`, `WORD`, ` WORD`) gets a logit bias of -100, i.e. that token
   can never be sampled. Multi-token forms are not biased: banning their first token would also
   ban every other word that starts with it.
2. Guarantee: the finished text is checked (case-insensitive, whole words: not inside a longer
   word) over the generated characters only, and a line that still contains a banned word is
   rejected and generated again with another seed (see NpcGenerator). Fixed template text and
   variables are the author's and are not checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from dgchat.npc.templates import Tokenizer


class BannedWords:
    def __init__(self, words: Iterable[str]) -> None:
        self.words = tuple(w for w in (w.strip() for w in words) if w)
        if self.words:
            alternatives = "|".join(re.escape(w) for w in sorted(self.words, key=len, reverse=True))
            self._pattern: re.Pattern[str] | None = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)
        else:
            self._pattern = None

    def __bool__(self) -> bool:
        return bool(self.words)

    def find(self, text: str, spans: Sequence[tuple[int, int]] | None = None) -> str | None:
        """The first banned word in `text` that overlaps one of the character `spans` (default: anywhere)."""
        if self._pattern is None:
            return None
        for m in self._pattern.finditer(text):
            if spans is None or any(m.start() < e and s < m.end() for s, e in spans):
                return m.group(0)
        return None

    def surface_forms(self) -> list[str]:
        forms: list[str] = []
        for w in self.words:
            for cased in (w, w.lower(), w.capitalize(), w.upper()):
                for form in (cased, " " + cased):
                    if form not in forms:
                        forms.append(form)
        return forms

    def logit_bias(self, tokenizer: Tokenizer) -> tuple[tuple[int, float], ...]:
        """(token, -100) for every surface form that is a single token."""
        banned: list[int] = []
        for form in self.surface_forms():
            tokens = tokenizer.tokenize(form)
            if tokens.size == 1 and tokenizer.bytes_of(tokens) == form.encode("utf-8") and int(tokens[0]) not in banned:
                banned.append(int(tokens[0]))
        return tuple((t, -100.0) for t in sorted(banned))
