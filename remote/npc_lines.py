"""NPC lines on `dgchat serve` servers: a LineSpec as a /v1/infill request, the answer as a LineBatch.

The server runs the same NpcGenerator on the spec as `dgchat npc` does locally (one request per
lines-file entry: its `count` variants in one batched decode, banned-word retries, hole lengths
chosen by score), so an entry's lines depend only on the entry and the model, not on which server
made them. The LineBatch keeps the local spec (card, variables, template as the lines file says)
and the server's record of the model file, so an export from several servers is one export only if
they all serve the same file (build_export refuses a mix).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import Any

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.params import DiffusionParams
from dgchat.npc.cards import CharacterCard
from dgchat.npc.generator import RETRY_SEED_STRIDE, HoleFill, LineBatch, LineSpec, LineVariant, ModelMeta
from dgchat.remote.client import RemoteClient
from dgchat.remote.errors import RemoteApiError
from dgchat.remote.pool import PoolEvent, ServerPool

MAX_REMOTE_ATTEMPTS = 8  # /v1/infill's max_attempts bound
# LineSpec sampler settings and where they go in the request (the rest must stay at their defaults)
_TOP_LEVEL = ("temperature", "top_p")
_EXTENSION = ("steps", "block_length", "top_k", "algorithm", "alg_temp")


def card_object(card: CharacterCard) -> dict[str, Any]:
    """The card as /v1/infill's inline `character` object (the TOML keys)."""
    out: dict[str, Any] = {"id": card.id, "name": card.name}
    for key in ("role", "setting", "voice"):
        if getattr(card, key):
            out[key] = getattr(card, key)
    for key in ("examples", "banned_words"):
        if getattr(card, key):
            out[key] = list(getattr(card, key))
    return out


def infill_body(spec: LineSpec, *, max_attempts: int) -> dict[str, Any]:
    if not 1 <= max_attempts <= MAX_REMOTE_ATTEMPTS:
        raise InvalidParameterError(f"--max-attempts must be 1..{MAX_REMOTE_ATTEMPTS} with --server "
                                    f"(got {max_attempts})")
    plain = DiffusionParams()
    p = spec.params
    other = [f.name for f in fields(DiffusionParams)
             if f.name not in _TOP_LEVEL + _EXTENSION and getattr(p, f.name) != getattr(plain, f.name)]
    if other:
        raise InvalidParameterError(f"{spec.card.id}: {', '.join(other)} cannot be sent to a server")
    body: dict[str, Any] = {"character": card_object(spec.card), "context": spec.context,
                            "situation": spec.situation, "n": spec.count, "seed": spec.seed,
                            "max_attempts": max_attempts}
    if spec.template is None:
        body["length"] = spec.length
    else:
        body["template"] = spec.template
    body["variables"] = {str(k): str(v) for k, v in spec.variables.items()}
    for key in _TOP_LEVEL:
        if getattr(p, key) is not None:
            body[key] = getattr(p, key)
    ext = {k: getattr(p, k) for k in _EXTENSION if getattr(p, k) is not None and getattr(p, k) != getattr(plain, k)}
    if ext:
        body["dgchat"] = ext
    return body


def _params(settings: Any, seed: int) -> DiffusionParams | None:
    """The variant's resolved sampler settings back as DiffusionParams (export: `settings`)."""
    if not isinstance(settings, dict):
        return None
    known = {f.name for f in fields(DiffusionParams)}
    values = {k: v for k, v in settings.items() if k in known and k != "logit_bias"}
    try:
        return replace(DiffusionParams(**values), seed=seed)
    except TypeError:
        return None


def batch_from_infill(spec: LineSpec, answer: Any, url: str) -> LineBatch:
    """The server's /v1/infill answer as the LineBatch a local run would have made."""
    try:
        ext = answer["dgchat"]
        model = ModelMeta(**ext["model"])
        variants = []
        for c in sorted(answer["choices"], key=lambda c: c["index"]):
            attempt = int(c["attempt"])
            problem = c.get("problem")
            variants.append(LineVariant(
                index=int(c["index"]), seed=int(c["seed"]), attempt=attempt, text=str(c["text"]),
                holes=[HoleFill(str(h["text"]), int(h["tokens"])) for h in c["holes"]],
                tokens=[int(t) for t in c["tokens"]], stop_reason=str(c["stop_reason"]),
                score=None if c.get("score") is None else float(c["score"]),
                length_scores=[(list(map(int, lengths)), float(score)) for lengths, score in c["length_scores"]],
                problem=problem, status="rejected" if problem else "new",
                params=_params(c.get("settings"), int(c["seed"]) + attempt * RETRY_SEED_STRIDE)))
        settings = dict(ext["settings"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RemoteApiError(f"{url}/v1/infill answered without the line details `dgchat npc --server` needs "
                             f"({type(exc).__name__}: {exc}); is it an older dgchat serve?", url=url,
                             status=502) from None
    if len(variants) != spec.count:
        raise RemoteApiError(f"{url} returned {len(variants)} variants for {spec.count}", url=url, status=502)
    return LineBatch(spec, variants, settings, model)


def check_servers(pool: ServerPool) -> dict[str, Any]:
    """Every server must be a dgchat server serving the same model file; returns that file's record."""
    files = {}
    for client in pool.clients:
        models = client.models()
        details = models[0].details or {}
        if not models[0].is_dgchat or not isinstance(details.get("file"), dict):
            raise InvalidParameterError(
                f"{client.url} is not a dgchat serve server (or an older one): NPC lines need its /v1/infill; "
                "other OpenAI servers (vLLM) can answer `dgchat generate --server` only")
        files[client.url] = details["file"]
    prints = {f.get("fingerprint") for f in files.values()}
    if len(prints) > 1:
        listing = ", ".join(f"{u}: {f.get('file')}" for u, f in files.items())
        raise InvalidParameterError(f"the servers serve different model files ({listing}); one export holds one "
                                    "model's lines")
    return next(iter(files.values()))


def generate_remote(pool: ServerPool, specs: Sequence[LineSpec], *, max_attempts: int = 4,
                    on_event: Callable[[PoolEvent], None] | None = None,
                    cancel: threading.Event | None = None) -> list[LineBatch]:
    """Every spec's LineBatch, in the specs' order, made on the pool's servers."""
    bodies = [infill_body(s, max_attempts=max_attempts) for s in specs]  # refuse before any request

    def call(client: RemoteClient, i: int) -> LineBatch:
        return batch_from_infill(specs[i], client.post_json("/v1/infill", bodies[i]), client.url)

    return pool.run(list(range(len(specs))), call, units=lambda b: len(b.variants), on_event=on_event,
                    cancel=cancel)
