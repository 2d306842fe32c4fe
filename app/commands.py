"""Command palette (Ctrl+P) providers, one per namespace: "chat: …", "model: …", "view: …", "open: …".

Each provider lists its commands with a help line; typing filters them fuzzily across the whole
"namespace: name" string, so "ch exp" finds "chat: export to Markdown".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from dgchat.app.app import DgchatApp
    from dgchat.app.chat_screen import ChatScreen

Command = tuple[str, str, Callable[[], object]]  # name, help, callback


class NamespacedProvider(Provider):
    namespace = ""

    @property
    def dgchat(self) -> DgchatApp:
        return self.app  # type: ignore[return-value]

    @property
    def chat(self) -> ChatScreen:
        return self.dgchat.chat_screen

    def commands(self) -> Iterable[Command]:
        return ()

    def _title(self, name: str) -> str:
        return f"{self.namespace}: {name}"

    async def discover(self) -> Hits:
        for name, help_text, callback in self.commands():
            yield DiscoveryHit(self._title(name), callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self.commands():
            title = self._title(name)
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)


class ChatCommands(NamespacedProvider):
    namespace = "chat"

    def commands(self) -> Iterable[Command]:
        c = self.chat
        return [
            ("new", "Start a new chat", c.action_new_chat),
            ("rename", "Rename this chat", c.action_rename_chat),
            ("delete", "Delete this chat", c.action_delete_chat),
            ("export to Markdown", "Write this chat to a .md file", c.action_export),
            ("regenerate last answer", "Answer the last prompt again", c.action_regenerate),
            ("edit last prompt", "Edit the last prompt and re-run from there", c.action_edit_last),
            ("copy last answer", "Copy the last answer to the clipboard", c.action_copy_last),
            ("stop", "Stop the answer being generated (keeps the partial answer)", c.action_stop),
            ("search", "Full-text search over all chats", c.action_search),
            ("settings", "Model, system prompt and sampler settings of this chat", c.action_settings),
        ]


class ModelCommands(NamespacedProvider):
    namespace = "model"

    def commands(self) -> Iterable[Command]:
        c = self.chat
        return [
            ("open…", "Use another GGUF model for this chat", c.action_open_model),
            ("reload", "Load the chat's model again", c.action_reload_model),
            ("info", "What the loaded model is and how it runs", c.action_model_info),
            ("precise mode on / off", "Exact mode: f32 KV cache, no flash attention (logits as the reference "
             "implementation's; slower). Saved as [engine] precise in config.toml; reloads the model",
             c.action_toggle_precise),
            ("reset sampler settings", "Back to the model's recommended defaults for this chat", c.action_reset_settings),
            ("manage models…", "Download, remove, import, verify and switch models (F4)", self.dgchat.action_models),
        ]


class SetupCommands(NamespacedProvider):
    namespace = "setup"

    def commands(self) -> Iterable[Command]:
        app = self.dgchat
        return [
            ("run again", "The first-run setup: this machine, a model, its download and a test",
             app.action_setup),
            ("correct the hardware values", "Fix the detected CPU cores, RAM, disk or GPU memory that the "
             "model fit badges use (kept in hardware.toml)", lambda: app.action_setup("hardware")),
        ]


class ViewCommands(NamespacedProvider):
    namespace = "view"

    def commands(self) -> Iterable[Command]:
        app = self.dgchat
        c = self.chat
        return [
            ("toggle dark / light", "Switch between the dark and the light theme", app.action_toggle_dark),
            ("toggle sidebar", "Show or hide the list of chats", c.action_toggle_sidebar),
            ("keys", "All key bindings and their ids for remapping", app.action_help),
            ("focus prompt", "Put the cursor in the prompt box", c.action_focus_prompt),
        ]


class OpenChatCommands(NamespacedProvider):
    namespace = "open"

    def commands(self) -> Iterable[Command]:
        c = self.chat
        return [
            (chat.title, f"Open chat {chat.id}", (lambda chat_id=chat.id: c.open_chat(chat_id)))
            for chat in self.dgchat.store.list_chats()
        ]


PROVIDERS = (ChatCommands, ModelCommands, SetupCommands, ViewCommands, OpenChatCommands)
