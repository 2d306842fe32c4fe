"""Chat templates from model files, rendered in Jinja2's immutable sandbox.

A template comes from an untrusted file: it renders in `ImmutableSandboxedEnvironment` (no
attribute access to internals, no mutation of the objects we pass in), and rendering errors
become a DgchatError instead of a traceback.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dgchat.model_backend.errors import DgchatError

# Used when a diffusion GGUF carries no template (llama.cpp's diffusion example falls back to ChatML too).
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TemplateRenderError(DgchatError):
    pass


def _raise(message: str) -> None:
    raise TemplateRenderError(f"the model's chat template refused the conversation: {message}")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
    return env


_ENV = _environment()


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    extra: dict[str, Any] | None = None,
) -> str:
    try:
        compiled = _ENV.from_string(template)
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **(extra or {}),
        )
    except TemplateRenderError:
        raise
    except TemplateError as exc:
        raise TemplateRenderError(f"the model's chat template failed to render: {exc}") from None
    except Exception as exc:  # the sandbox raises SecurityError and ordinary errors alike
        raise TemplateRenderError(f"the model's chat template failed to render: {type(exc).__name__}: {exc}") from None
