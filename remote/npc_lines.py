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

from dgchat.model_backend.engine_protocol import Engine, served
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.model_info import BLOCK_DIFFUSION
from dgchat.model_backend.params import MAX_SEED, DiffusionParams
from dgchat.npc.cards import CharacterCard
from dgchat.npc.generator import (
    MAX_COUNT,
    NO_TEMPLATES,
    RETRY_SEED_STRIDE,
    HoleFill,
    LineBatch,
    LineSpec,
    LineVariant,
    ModelMeta,
)
from dgchat.remote import limits, wire
from dgchat.remote.client import RemoteClient
from dgchat.remote.errors import RemoteApiError, RemoteError
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


def _params(settings: wire.Obj | None, seed: int) -> DiffusionParams | None:
    """The variant's resolved sampler settings back as DiffusionParams (export: `settings`)."""
    if settings is None:
        return None
    values = {k: v for k, v in wire.check_params(settings).items() if k != "logit_bias"}
    try:
        return replace(DiffusionParams(**values), seed=seed)
    except TypeError:
        return None


MAX_LINE_CHARS = 1 << 16  # a line's text (a template and its holes)
MAX_LINE_TOKENS = 1 << 13  # a variant's tokens (the canvas of a template)


def _variant(c: wire.Obj, count: int) -> LineVariant:
    index = c.int("index", 0, count - 1)
    seed = c.int("seed", 0, MAX_SEED)
    attempt = c.int("attempt", 0, 1 << 10)
    holes = []
    for k, item in enumerate(c.list("holes", MAX_LINE_TOKENS)):
        h = wire.Obj(item, f"{c.at('holes')}[{k}]")
        holes.append(HoleFill(h.str("text", MAX_LINE_CHARS), h.int("tokens", 0, MAX_LINE_TOKENS)))
    length_scores = []
    for k, item in enumerate(c.list("length_scores", MAX_LINE_TOKENS, [])):
        where = f"{c.at('length_scores')}[{k}]"
        pair = wire.check_list(item, where, 2)
        if len(pair) != 2:
            raise wire.WireError(f"`{where}` must be [lengths, score]")
        lengths = [wire.check_int(n, f"{where}[0]", 0, MAX_LINE_TOKENS)
                   for n in wire.check_list(pair[0], f"{where}[0]", MAX_LINE_TOKENS)]
        length_scores.append((lengths, wire.check_number(pair[1], f"{where}[1]")))
    problem = c.str("problem", 1024, None)
    return LineVariant(
        index=index, seed=seed, attempt=attempt, text=c.str("text", MAX_LINE_CHARS), holes=holes,
        tokens=[int(t) for t in wire.token_ids(c.list("tokens", MAX_LINE_TOKENS), c.at("tokens"), limits.MAX_VOCAB)],
        stop_reason=c.word("stop_reason"), score=c.number("score", None), length_scores=length_scores,
        problem=problem, status="rejected" if problem else "new",
        params=_params(c.obj("settings", None), seed + attempt * RETRY_SEED_STRIDE))


def batch_from_infill(spec: LineSpec, answer: Any, url: str) -> LineBatch:
    """The server's /v1/infill answer as the LineBatch a local run would have made. Every field is
    checked (types, ranges, one variant per index): anything else is a RemoteApiError naming it."""
    try:
        top = wire.Obj(answer, "")
        ext = top.obj("dgchat")
        model = ModelMeta(**wire.model_file(ext.obj("model")))
        settings = dict(ext.obj("settings").value)
        variants = sorted((_variant(wire.Obj(item, f"choices[{k}]"), spec.count)
                           for k, item in enumerate(top.list("choices", MAX_COUNT))), key=lambda v: v.index)
    except wire.WireError as exc:
        hint = "; is it an older dgchat serve?" if "is missing" in str(exc) else ""
        raise RemoteApiError(f"{url}/v1/infill answered without the line details `dgchat npc --server` needs "
                             f"({exc}){hint}", url=url, status=502) from None
    if [v.index for v in variants] != list(range(spec.count)):
        raise RemoteApiError(f"{url} returned {len(variants)} variants for {spec.count}", url=url, status=502)
    return LineBatch(spec, variants, settings, model)


def lines_on_server(engine: Engine, spec: LineSpec, *, max_attempts: int,
                    started: Callable[[], None] | None = None) -> LineBatch | None:
    """The batch a dgchat serve server makes for `spec` when `engine` is its model (its
    /v1/infill runs the same generator there), or None for a local engine: the caller runs
    npc.generator itself. `started` is called before the request is sent."""
    server = served(engine)
    if server is None:
        return None
    if started is not None:
        started()
    return batch_from_infill(spec, server.infill(infill_body(spec, max_attempts=max_attempts)), server.url)


def check_servers(pool: ServerPool, *, on_drop: Callable[[str, str], None] | None = None,
                  specs: Sequence[LineSpec] = (), where: Sequence[str] = ()) -> dict[str, Any]:
    """Every server must be a dgchat server serving the same model file; returns that file's record.

    A server that cannot be asked (unreachable, an invalid answer, a rejected key) or is not a
    dgchat server is dropped from the pool (`on_drop(url, why)`: one line for the user) while
    another server passes; if none does, the first server's error is raised. Servers serving
    different model files are an error: which one is meant cannot be told. With `specs` (and
    `where`, each spec's place in the lines file), a template line for a block-diffusion model
    (which cannot fill templates) is an error before any line is generated."""
    files = {}
    families: dict[str, tuple[str, str]] = {}  # url -> (family, the server's engine label)
    failures: list[tuple[str, BaseException]] = []
    for client in pool.live_clients():
        try:
            models = client.models()
            details = models[0].details
            if not models[0].is_dgchat or details is None or details.file is None:
                raise InvalidParameterError(
                    f"{client.url} is not a dgchat serve server (or an older one): NPC lines need its /v1/infill; "
                    "other OpenAI servers (vLLM) can answer `dgchat generate --server` only")
        except (RemoteError, InvalidParameterError) as exc:
            failures.append((client.url, exc))
            continue
        files[client.url] = details.file
        families[client.url] = (details.family, details.engine)
    if not files:
        raise failures[0][1] if failures else RemoteError("no server left")
    for url, exc in failures:  # others passed: the run goes on without these
        pool.drop(url, str(exc))
        if on_drop is not None:
            on_drop(url, str(exc))
    prints = {f.get("fingerprint") for f in files.values()}
    if len(prints) > 1:
        listing = ", ".join(f"{u}: {wire.quote(f.get('file'), 80)}" for u, f in files.items())
        raise InvalidParameterError(f"the servers serve different model files ({listing}); one export holds one "
                                    "model's lines")
    block = next(((url, label) for url, (family, label) in families.items() if family == BLOCK_DIFFUSION), None)
    if block is not None:
        for k, spec in enumerate(specs):
            if spec.template is not None:
                place = where[k] if k < len(where) else f"line {k + 1}"
                raise InvalidParameterError(f"{place}: {block[0]} serves a block-diffusion model "
                                            f"({wire.quote(block[1] or 'block diffusion', 80)}): {NO_TEMPLATES}")
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
