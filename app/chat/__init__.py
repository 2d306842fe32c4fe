"""The chat screen's areas, one module each; app/chat_screen.py composes the widgets and wires them.

- transcript.py: the conversation shown, and what a message's keys do to it (copy, edit, regenerate,
  flip versions), with the one-frame swaps that put a finished answer or another version in place
- composer.py: the prompt box: sending, its history, its focus
- answering.py: generation control: starting an answer, the live canvas, the answer's end, Stop
- model_switching.py: the chat's model and settings: loading, the settings dialog, model: info
- status_line.py: the status line and the conversation's size in the model's context
- saved_chats.py: the sidebar's saved chats: open, new, rename, delete, search
- export_replay.py: Markdown export, replaying an answer's denoising, its .cast export
"""
