"""Block diffusion's logits source: the block denoiser's requests answered by llama.cpp.

With the model's block-causal mask (engine/patches/0017, active while causal attention is off):
- an `EncodeRequest` (the prompt's whole blocks, or a text being scored) appends its tokens to the
  sequence's cache in one decode (the mask makes that exact: nothing of a block sees a later block);
- a `DenoiseRequest` decodes its `commit` (a finished block, kept in the cache) and its canvas (the
  current block) in one pass, returns the rows asked for (the masked positions) and removes the
  canvas's cells afterwards.
In `--ar` mode (`causal`) the same requests run with ordinary causal attention (ar_decoder).

Several sequences (generate_batch) share each decode, one llama.cpp sequence id each. With dgchat's
diffusion head a request's rows come back as RowStats computed in llama.cpp's graph; otherwise (or
for a request without a sample spec) as logits, turned into RowStats on the host when it has one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from dgchat.model_backend.logits_source import PLAIN_HEAD, head_request
from dgchat.model_backend.requests import DenoiseRequest, EncodeRequest, Request
from dgchat.model_backend.sampling import RowStats, SampleSpec

if TYPE_CHECKING:  # the engine makes its sources: a type only, not an import cycle
    from dgchat.model_backend.block_diffusion import BlockDiffusionEngine

# tokens one decode may carry at least (Engine.context_for raises it to the longest sequence)
MIN_BATCH = 512


class BlockLlamaSource:
    """Answers the requests of one or several block denoisers (driver.LogitsSource)."""

    def __init__(self, engine: BlockDiffusionEngine, n_seq: int, per_seq_tokens: int, *, on_backend: bool,
                 causal: bool = False, reuse: bool = False) -> None:
        self.engine = engine
        self.block = engine.block_size
        self.on_backend = on_backend
        self.causal = causal
        self.ctx = engine.context_for(per_seq_tokens, n_seq=n_seq,
                                      batch_tokens=max(MIN_BATCH, 2 * self.block * n_seq))
        # reuse: the cells of the last generation's prompt and stored blocks (sequence 0) are kept, and
        # the next prompt decodes only from the first block where it differs (a chat's next turn
        # repeats the conversation so far). Only where block positions do not move with the prompt's
        # length (SDAR's blocks count from position 0) and attention is block-causal.
        reuse = reuse and n_seq == 1 and not causal
        kept = engine.kept_prefix(self.ctx) if reuse else None
        engine.forget_prefix()  # kept again only when this generation ends with its cells known
        if kept is None:
            self.ctx.clear()
        # the tokens cached at positions 0.. of sequence 0 (None: not tracked)
        self.stored: np.ndarray | None = kept if kept is not None else np.empty(0, np.int32) if reuse else None
        self._first = True
        self._skip = 0  # prompt tokens the first EncodeRequest need not decode
        self.reused_tokens = 0  # prompt tokens whose cells came from the last generation
        if on_backend:
            self.ctx.configure_head(PLAIN_HEAD)

    def finish(self) -> None:
        """The generation ended: its cells are what `stored` says, for the next one to reuse."""
        if self.stored is not None:
            self.engine.keep_prefix(self.ctx, self.stored)

    def answer(self, requests: Sequence[tuple[int, Request]]) -> list[np.ndarray | RowStats]:
        results: list[np.ndarray | RowStats | None] = [None] * len(requests)
        enc = [(k, s, r) for k, (s, r) in enumerate(requests) if isinstance(r, EncodeRequest)]
        den = [(k, s, r) for k, (s, r) in enumerate(requests) if isinstance(r, DenoiseRequest)]
        if len(enc) + len(den) != len(requests):
            raise TypeError("block diffusion answers EncodeRequest and DenoiseRequest only")
        self.ctx.set_causal(self.causal)
        if self._first:
            self._first = False
            self._drop_stale(enc)
        try:
            if enc:
                self._encode(enc, results)
            if den:
                self._denoise(den, results)
        except BaseException:
            self.stored = None  # an aborted decode: its cells are not known
            raise
        return results  # type: ignore[return-value]

    def _drop_stale(self, enc) -> None:
        """Before the first decode of a reusing source: keep the cells of the whole blocks its prompt
        shares with the last generation, remove the rest."""
        if self.stored is None:
            return
        first = enc[0][2] if len(enc) == 1 else None
        keep = 0
        if first is not None and first.positions.size and int(first.positions[0]) == 0 and first.outputs.size == 0:
            n = min(self.stored.size, first.tokens.size)
            diff = np.flatnonzero(self.stored[:n] != first.tokens[:n])
            common = int(diff[0]) if diff.size else n
            keep = (common // self.block) * self.block
        self.ctx.seq_rm(0, keep)
        self.stored = self.stored[:keep].copy()
        self._skip = self.reused_tokens = keep

    # -- one decode, many sequences --------------------------------------------------------------
    def _decode(self, parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]],
                specs: list[SampleSpec | None]) -> list[np.ndarray | RowStats]:
        """One llama.cpp decode of (sequence id, tokens, positions, output indices) parts. Each part's
        outputs come back as RowStats under its spec (computed in the graph when every part has one
        and the head is on), else as logits (turned into RowStats on the host where a spec is given)."""
        tokens = np.concatenate([p[1] for p in parts]).astype(np.int32)
        positions = np.concatenate([p[2] for p in parts]).astype(np.int32)
        seq_ids = np.concatenate([np.full(p[1].size, p[0], np.int32) for p in parts])
        offsets = np.cumsum([0] + [p[1].size for p in parts])
        outputs = np.concatenate([offsets[i] + p[3] for i, p in enumerate(parts)]).astype(np.int64)
        sizes = [p[3].size for p in parts]
        ctx = self.ctx
        wanted = [i for i, n in enumerate(sizes) if n]
        if self.on_backend and wanted and all(specs[i] is not None for i in wanted):
            live = [specs[i] for i in wanted]
            head = head_request(ctx, live, np.repeat(np.arange(len(live)), [sizes[i] for i in wanted]))
            stats = ctx.decode_tokens(tokens, positions, seq_ids=seq_ids, outputs=outputs, head=head)
            split = iter(stats.split([sizes[i] for i in wanted]))
            return [next(split) if n else _empty_stats() for n in sizes]
        logits = ctx.decode_tokens(tokens, positions, seq_ids=seq_ids, outputs=outputs)
        out: list[np.ndarray | RowStats] = []
        start = 0
        for n, spec in zip(sizes, specs):
            rows = np.array(logits[start:start + n], copy=True)
            start += n
            if spec is None:
                out.append(rows)
                continue
            t0 = time.perf_counter()
            st = spec.stats(rows)
            out.append(replace(st, host_s=time.perf_counter() - t0))
        return out

    # -- requests ----------------------------------------------------------------------------------
    def _encode(self, items, results) -> None:
        """Append each request's tokens: all of a round in one decode when they fit, else one each
        (the context's batch holds a whole sequence, as non-causal attention needs: Engine.context_for).
        Tokens whose cells a reusing source kept are not decoded again."""
        skip, self._skip = self._skip, 0
        if skip and self.stored is not None:
            (k, s, r), = items
            self.stored = np.concatenate([self.stored, r.tokens[skip:]]).astype(np.int32)
            if skip == r.tokens.size:
                results[k] = np.empty((0, self.engine.n_vocab), np.float32) if r.sample is None else _empty_stats()
                return
            items = [(k, s, EncodeRequest(r.tokens[skip:], r.positions[skip:], np.empty(0, np.int64), r.sample))]
        elif self.stored is not None:
            self.stored = _appended(self.stored, items)
        parts = [(s, r.tokens, r.positions, np.asarray(r.outputs, dtype=np.int64)) for _, s, r in items]
        specs = [r.sample for _, _, r in items]
        if sum(p[1].size for p in parts) <= self.ctx.max_tokens:
            answers = self._decode(parts, specs)
        else:
            answers = [self._decode([p], [sp])[0] for p, sp in zip(parts, specs)]
        for (k, _, _), got in zip(items, answers):
            results[k] = got

    def _denoise(self, items, results) -> None:
        parts, specs = [], []
        for _, s, r in items:
            rows = np.arange(r.canvas.size) if r.rows is None else np.asarray(r.rows, dtype=np.int64)
            if r.commit is not None:
                tokens = np.concatenate([r.commit[0], r.canvas])
                positions = np.concatenate([r.commit[1], r.positions])
                rows = rows + r.commit[0].size
            else:
                tokens, positions = r.canvas, r.positions
            parts.append((s, tokens, positions, rows))
            specs.append(r.sample)
        total = sum(p[1].size for p in parts)
        if total <= self.ctx.max_tokens:
            answers = self._decode(parts, specs)
        else:  # more sequences than one decode holds: one decode each
            answers = [self._decode([p], [sp])[0] for p, sp in zip(parts, specs)]
        for (k, s, r), got in zip(items, answers):
            results[k] = got
            self.ctx.seq_rm(s, int(r.positions[0]))  # the block's cells: recomputed by its next step
            if self.stored is not None and r.commit is not None:
                self.stored = _appended(self.stored, [(k, s, EncodeRequest(r.commit[0], r.commit[1],
                                                                           np.empty(0, np.int64)))])


def _appended(stored: np.ndarray, items) -> np.ndarray | None:
    """`stored` with a sequence-0 request's tokens appended where they continue it; None (no longer
    tracked) otherwise."""
    if len(items) != 1 or items[0][1] != 0:
        return None
    r = items[0][2]
    if not r.positions.size or int(r.positions[0]) != stored.size:
        return None
    return np.concatenate([stored, r.tokens]).astype(np.int32)


def _empty_stats() -> RowStats:
    e = np.empty(0, np.float32)
    i = np.empty(0, np.int32)
    return RowStats(i, i, e, e, e, e)
