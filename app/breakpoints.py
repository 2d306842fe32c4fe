"""Width classes for the screens that have to fit small terminals (chat, NPC workshop, drafting).

Textual puts one of these classes on the active screen as the terminal is resized (a screen's
HORIZONTAL_BREAKPOINTS); dgchat.tcss and the screens' CSS key their compact layouts on them:

- `-narrow`, below NARROW_BELOW columns: side lists (the chats, the characters) are hidden unless
  the user shows them with Ctrl+B. Even a 22-column list would leave the conversation under 58
  columns there, less than a ~50-character line of text after the message border, padding and
  scrollbar; 80 columns is the smallest width where both fit, so the classic 80x24 keeps its list.
- `-medium`, from NARROW_BELOW up to WIDE_FROM: side lists are narrower and forms wrap onto more rows.
- `-wide`, from WIDE_FROM columns: the full layout (the NPC form's rows need ~75 columns beside a
  30-column list).
"""

from __future__ import annotations

NARROW_BELOW = 80
WIDE_FROM = 110
WIDTH_BREAKPOINTS: list[tuple[int, str]] = [(0, "-narrow"), (NARROW_BELOW, "-medium"), (WIDE_FROM, "-wide")]

