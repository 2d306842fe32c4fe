"""The request a RemoteEngine sends: which settings go on the wire, and the JSON body of one answer.

An OpenAI-compatible server takes the OpenAI sampling fields; `dgchat serve` also takes the
diffusion settings in its `dgchat` extension object (server/openai_api.py), vLLM only `top_k`.
Whatever else a DiffusionParams sets (away from its default and the server's) is a setting the
server cannot take: `unsupported_settings` names them, and remote.engine.RemoteEngine drops them in
`resolve` and refuses them in `generate`, by their command-line `flag`. `body_for` builds the
endpoint and body (remote.limits.AnswerBudget reads the budget of an answer back from that body).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from dgchat.model_backend.params import DiffusionParams
from dgchat.remote.vocabulary import RemotePrompt

# DiffusionParams fields dgchat serve takes in its `dgchat` extension object (server/openai_api.py)
DGCHAT_WIRE = ("steps", "gen_length", "block_length", "top_k", "algorithm", "cache", "alg_temp", "threshold",
               "factor", "cfg_scale", "eps", "entropy_bound", "t_min", "t_max", "pad_bias")
OPENAI_WIRE = ("temperature", "top_p", "seed", "max_tokens", "logit_bias")
VLLM_EXTRA = ("top_k",)  # vLLM's sampling extension
# what no server takes: a request with one of these set (and not at the server's default) is refused
_NOT_ON_THE_WIRE = ("gumbel", "mode", "early_stop", "stability_threshold", "confidence_threshold",
                    "autoregressive", "sampler_on", "soft_embedding")


def flag(name: str) -> str:
    """A DiffusionParams field as the command line spells it."""
    return {"early_stop": "--no-early-stop", "autoregressive": "--ar"}.get(name, "--" + name.replace("_", "-"))


def unsupported_settings(params: DiffusionParams, *, dgchat: bool, defaults: Mapping[str, Any]) -> list[str]:
    """Settings in `params` that a server cannot take (compared with DiffusionParams' defaults and
    the server's reported `defaults`); `dgchat`: the server is dgchat serve (its extension's fields)."""
    plain = DiffusionParams()
    wire_names = set(OPENAI_WIRE) | (set(DGCHAT_WIRE) if dgchat else set(VLLM_EXTRA))
    out = []
    for f in fields(DiffusionParams):
        value = getattr(params, f.name)
        if f.name in wire_names or value == getattr(plain, f.name) or value == defaults.get(f.name):
            continue
        out.append(f.name)
    return out


def body_for(prompt: RemotePrompt, params: DiffusionParams, *, model: str, n: int, dgchat: bool,
             live_canvas: bool) -> tuple[str, dict[str, Any]]:
    """The endpoint and JSON body for one answer (or `n` with seeds seed..seed+n-1) of `model`,
    with settings the server takes (the caller has refused the others). `dgchat`: the server is
    dgchat serve, asked for canvas snapshots (`live_canvas`) or only the final record."""
    body: dict[str, Any] = {"model": model, "n": n, "seed": int(params.seed),
                            "stream_options": {"include_usage": True}}
    if params.max_tokens is not None:
        body["max_tokens"] = int(params.max_tokens)
    for name in ("temperature", "top_p"):
        if getattr(params, name) is not None:
            body[name] = float(getattr(params, name))
    if params.logit_bias:
        body["logit_bias"] = {str(int(t)): float(b) for t, b in params.logit_bias}
    if dgchat:
        ext = {k: getattr(params, k) for k in DGCHAT_WIRE if getattr(params, k) is not None}
        ext["canvas" if live_canvas else "final"] = True  # the final record: tokens, stop reason, stats
        body["dgchat"] = ext
    elif params.top_k:
        body["top_k"] = int(params.top_k)
    if prompt.messages is not None:
        body["messages"] = prompt.messages
        return "/v1/chat/completions", body
    body["prompt"] = prompt.text or ""
    if prompt.suffix:
        body["suffix"] = prompt.suffix
    return "/v1/completions", body
