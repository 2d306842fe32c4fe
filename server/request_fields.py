"""The fields of an OpenAI-compatible request, parsed and checked: each a 400 (ApiError) naming the
field when it is of the wrong type or out of range, before anything is tokenized or generated.

The limits on what one request may ask (choices, stop strings, logit biases, messages), the
parameters this server refuses unless at their no-op value, and the `dgchat` extension object
(the diffusion sampler's settings and the streaming options). openai_api.py plans a generation
from these; infill.py reads its shared fields (n, seed, temperature, top_p, `dgchat`) with them.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

from dgchat.model_backend.engine_protocol import LocalEngine
from dgchat.model_backend.params import MAX_BIAS, DiffusionParams
from dgchat.server.errors import ApiError

MAX_N = 8
MAX_STOP = 4
MAX_LOGIT_BIAS = 300
MAX_SEED = 2**63 - 1
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions

# Parameters a client may send that this server cannot honour: refused unless at their no-op value.
_UNSUPPORTED = {
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "audio": (None,),
    "prediction": (None,),
}
# The `dgchat` extension: the sampler settings a request may set, each type- and range-checked by its
# row of DiffusionParams.FIELDS (the bounds every reader of settings uses: no request can ask for a
# trillion steps), and a canvas or top_k bounded further by the served model's context length and
# vocabulary; then the response options.
REQUEST_FIELDS = ("steps", "gen_length", "block_length", "top_k", "algorithm", "cache", "alg_temp", "threshold",
                  "factor", "cfg_scale", "eps", "entropy_bound", "t_min", "t_max", "pad_bias")
# keys of the extension that are about the response, not the sampler
STREAM_KEYS = ("canvas", "final")
_DGCHAT_KEYS = (*REQUEST_FIELDS, *STREAM_KEYS)
# alg_temp draws positions from softmax(confidence / alg_temp): a tiny one underflows every weight
# but the largest to 0, and the draw of n positions fails; 0 selects deterministically instead
MIN_ALG_TEMP = 0.05
MIN_TOP_P = 1e-6
MAX_STOP_CHARS = 512  # one stop string
MAX_MESSAGES = 2048


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def int_field(body: dict, key: str, lo: int, hi: int, default: int | None = None) -> int | None:
    """`body[key]`, an integer in lo..hi (a whole float such as 2.0 passes as 2); `default` when absent."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise bad(f"`{key}` must be an integer", key)
    if not lo <= value <= hi:
        raise bad(f"`{key}` must be between {lo} and {hi} (got {value})", key)
    return value


def float_field(body: dict, key: str, lo: float, hi: float) -> float | None:
    """`body[key]`, a finite number in lo..hi, as a float; None when absent."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"`{key}` must be a number", key)
    if not lo <= value <= hi:
        raise bad(f"`{key}` must be between {lo} and {hi} (got {value})", key)
    return float(value)


def check_unsupported(body: dict) -> None:
    for key, allowed in _UNSUPPORTED.items():
        if key in body and body[key] not in allowed:
            raise bad(f"`{key}` is not supported by this server (dgchat runs text-diffusion models)", key,
                      "unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad("`response_format` other than {\"type\": \"text\"} is not supported", "response_format",
                  "unsupported_parameter")
    best_of = body.get("best_of")
    if best_of not in (None, 1) and best_of != body.get("n", 1):
        raise bad("`best_of` is not supported", "best_of", "unsupported_parameter")


def parse_stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad("`stop` must be a string or a list of strings", "stop")
    if len(stop) > MAX_STOP:
        raise bad(f"`stop` takes at most {MAX_STOP} strings", "stop")
    if any(s == "" for s in stop):
        raise bad("`stop` strings must not be empty", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        raise bad(f"`stop` strings must be at most {MAX_STOP_CHARS} characters", "stop")
    return stop


def parse_logit_bias(body: dict, n_vocab: int) -> tuple[tuple[int, float], ...]:
    raw = body.get("logit_bias")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise bad("`logit_bias` must be an object of token id -> bias", "logit_bias")
    if len(raw) > MAX_LOGIT_BIAS:
        raise bad(f"`logit_bias` takes at most {MAX_LOGIT_BIAS} tokens", "logit_bias")
    out = []
    for key, value in raw.items():
        # ASCII digits only: int() would also take "١٢", " 12 " and "1_2"
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10):
            raise bad(f"`logit_bias` keys must be token ids (got {key[:40]!r})", "logit_bias")
        token = int(key)
        if not 0 <= token < n_vocab:
            raise bad(f"`logit_bias` token {token} is outside the vocabulary (0..{n_vocab - 1})", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -MAX_BIAS <= value <= MAX_BIAS:
            raise bad(f"`logit_bias` values must be numbers in [-{MAX_BIAS:g}, {MAX_BIAS:g}] (got {str(value)[:40]})",
                      "logit_bias")
        out.append((token, float(value)))
    return tuple(out)


def _bound(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _in_range(value: float, lo: float, hi: float, lo_open: bool, hi_open: bool) -> bool:
    return (lo < value if lo_open else lo <= value) and (value < hi if hi_open else value <= hi)


def parse_dgchat(body: dict, engine: LocalEngine | None = None) -> dict[str, Any]:
    """The `dgchat` extension object, every value type- and range-checked (`engine`: the served
    model, whose context length and vocabulary bound the canvas and top_k)."""
    ext = body.get("dgchat")
    if ext is None:
        return {}
    if not isinstance(ext, dict):
        raise bad("`dgchat` must be an object of dgchat sampler settings", "dgchat")
    # a canvas longer than the context, or a top_k over the vocabulary, cannot run on this model
    model_bound = {"gen_length": int(engine.n_ctx_max) if engine is not None else None,
                   "block_length": int(engine.n_ctx_max) if engine is not None else None,
                   "top_k": int(engine.n_vocab) if engine is not None else None}
    out: dict[str, Any] = {}
    for key, value in ext.items():
        name = f"dgchat.{key}"
        if key not in _DGCHAT_KEYS:
            raise bad(f"unknown dgchat setting `{key[:40]}` (known: {', '.join(sorted(_DGCHAT_KEYS))})",
                      f"dgchat.{key[:40]}")
        spec = DiffusionParams.FIELDS.get(key)
        kind = spec.kind if spec is not None else bool  # the response options are true or false
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            raise bad(f"`{name}` must be {'a number' if kind is float else kind.__name__}", name, "invalid_parameter")
        if spec is not None and kind in (int, float):
            lo, hi = spec.lowest, spec.highest
            if model_bound.get(key) is not None:
                hi = min(hi, model_bound[key])
            if not _in_range(value, lo, hi, spec.lo_open, spec.hi_open):
                raise bad(f"`{name}` must be {'above' if spec.lo_open else 'at least'} {_bound(lo)} and "
                          f"{'below' if spec.hi_open else 'at most'} {_bound(hi)} (got {value})", name,
                          "invalid_parameter")
        out[key] = value
    if 0 < out.get("alg_temp", 0) < MIN_ALG_TEMP:
        raise bad(f"`dgchat.alg_temp` must be 0 (off) or at least {MIN_ALG_TEMP}", "dgchat.alg_temp",
                  "invalid_parameter")
    for key in ("algorithm", "cache"):
        choices = DiffusionParams.FIELDS[key].choices
        if key in out and out[key] not in choices:
            raise bad(f"`dgchat.{key}` must be one of {', '.join(choices)}", f"dgchat.{key}", "invalid_parameter")
    return out


def parse_seed(body: dict) -> int:
    seed = int_field(body, "seed", 0, MAX_SEED)
    # OpenAI's semantics: without a seed, every request samples afresh; the seed used is returned
    return seed if seed is not None else secrets.randbelow(2**31)


def parse_top_p(body: dict) -> float | None:
    top_p = float_field(body, "top_p", 0.0, 1.0)
    # the sampler works in float32: 1e-300 would be 0 there (the engine refuses it)
    if top_p is not None and top_p < MIN_TOP_P:
        raise bad(f"`top_p` must be greater than 0 (at least {MIN_TOP_P:g})", "top_p")
    return top_p


def parse_messages(body: dict) -> list[dict[str, str]]:
    """A chat's `messages` as role and content: `developer` read as system, text parts joined."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("`messages` must be a non-empty list", "messages")
    if len(messages) > MAX_MESSAGES:
        raise bad(f"`messages` takes at most {MAX_MESSAGES} messages", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"`{where}` must be an object", where)
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise bad(f"`{where}.role` must be system, developer, user or assistant (got {role!r})", f"{where}.role")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad(f"`{where}.content[{j}]`: only text parts are supported", f"{where}.content")
                parts.append(part["text"])
            content = "".join(parts)
        elif content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise bad(f"`{where}.content` must be a string or a list of text parts", f"{where}.content")
        out.append({"role": role, "content": content})
    return out


__all__ = [
    "COMPLETIONS_DEFAULT_MAX_TOKENS", "MAX_LOGIT_BIAS", "MAX_MESSAGES", "MAX_N", "MAX_SEED", "MAX_STOP",
    "MAX_STOP_CHARS", "MIN_ALG_TEMP", "MIN_TOP_P", "REQUEST_FIELDS", "STREAM_KEYS", "bad", "check_unsupported",
    "float_field", "int_field", "parse_dgchat", "parse_logit_bias", "parse_messages", "parse_seed", "parse_stop",
    "parse_top_p",
]
