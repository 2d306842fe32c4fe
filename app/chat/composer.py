"""The composer: the prompt box under the conversation (#prompt, app/widgets/prompt_input.py).

Sending stores the user message (committed) before anything else, then shows it and asks
generation control (answering.py) to answer it once the prompt is on screen.
"""

from __future__ import annotations

from dgchat.app.chat.part import ChatPart
from dgchat.app.widgets.prompt_input import PromptInput


class Composer(ChatPart):
    """Sending what was typed, the prompt history (Up / Down) and the prompt box's focus."""

    @property
    def prompt(self) -> PromptInput:
        return self.screen.query_one(PromptInput)

    def load_history(self) -> None:
        """Up / Down in the box walk every chat's prompts, newest first."""
        self.prompt.set_history(self.store.prompt_history())

    def focus(self) -> None:
        self.prompt.focus()

    def send(self, text: str) -> None:
        screen = self.screen
        if screen.refuse_while_answering():
            return
        chat = screen.chats.ensure()
        message = self.store.add_message(chat.id, "user", text)  # durable before anything runs
        prompt = self.prompt
        prompt.clear_prompt()
        prompt.set_history(self.store.prompt_history())
        screen.chat = self.store.get_chat(chat.id)
        screen.refresh_sidebar()
        screen.transcript.append(message)  # sending follows the conversation to its end again
        # start once the prompt is on screen: that layout then does not compete with the first steps
        screen.call_after_refresh(screen.start_generation)
