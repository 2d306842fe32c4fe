"""DiffusionGemma's logits source: the requests of its denoisers answered by llama.cpp.

The encoder requests (prompt, committed canvases, AR steps) run as causal passes that append to a
sequence's KV cache; the denoising steps run as bidirectional passes over the canvas that read the
cache and leave it as it was. Where each step's vocabulary-wide work runs (llama.cpp's graph, or
numpy) is described in diffusion_gemma.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from dgchat.model_backend import sampling
from dgchat.model_backend.logits_source import head_request
from dgchat.model_backend.requests import DenoiseRequest, EncodeRequest, Request
from dgchat.model_backend.sampling import RowStats

if TYPE_CHECKING:  # the engine makes its sources: a type only, not an import cycle
    from dgchat.model_backend.diffusion_gemma import DiffusionGemmaEngine

# self-conditioning slots: 0 reads zero (a canvas's first step), 1 is unused; then one per canvas row
FIRST_SLOT = 2


class DgLlamaSource:
    """Answers the requests of one or several sequences (one sequence id each), batching the
    requests of a round into at most two llama.cpp calls (one causal, one bidirectional).

    On the backend (`on_backend`) the decoder reads token ids and the context's diffusion head
    computes the statistics and keeps each canvas row's self-conditioning signal in a device slot;
    on the host the decoder reads embeddings built in numpy from the sequence's previous processed
    logits, kept here."""

    def __init__(self, engine: DiffusionGemmaEngine, n_seq: int, per_seq_tokens: int, canvas: int, *,
                 on_backend: bool, soft_top_k: int | None) -> None:
        self.engine = engine
        self.n_seq = n_seq
        self.canvas = canvas
        self.on_backend = on_backend
        self.soft_top_k = soft_top_k
        self.ctx = engine.context_for(per_seq_tokens, n_seq=n_seq, batch_tokens=max(n_seq * canvas, 512))
        self.ctx.clear()
        self._processed: dict[int, np.ndarray] = {}  # host path: each sequence's last processed logits
        # tests: called as check(source, items, stats, logits) after every backend denoising decode,
        # which then also returns its logits
        self.check = engine.step_check
        if on_backend:
            self.ctx.configure_head(engine.head_setup(FIRST_SLOT + n_seq * canvas, soft_top_k))

    def answer(self, requests: Sequence[tuple[int, Request]]) -> list[np.ndarray | RowStats]:
        """driver.LogitsSource: each sequence index is the request's llama.cpp sequence id."""
        results: list[np.ndarray | RowStats | None] = [None] * len(requests)
        enc = [(k, s, r) for k, (s, r) in enumerate(requests) if isinstance(r, EncodeRequest)]
        den = [(k, s, r) for k, (s, r) in enumerate(requests) if isinstance(r, DenoiseRequest)]
        if enc:
            self._encode(enc, results)
        if den:
            (self._denoise_backend if self.on_backend else self._denoise_host)(den, results)
        return results  # type: ignore[return-value]

    def _encode(self, items, results) -> None:
        ctx = self.ctx
        ctx.set_causal(True)
        limit = ctx.max_tokens
        sampled = self.on_backend and all(r.sample is not None for _, _, r in items)
        by_k = {k: r for k, _, r in items}
        # chunk long prompts; every chunk may carry tokens of several sequences
        flat = []
        for k, s, r in items:
            want = {int(i): j for j, i in enumerate(r.outputs)}  # token index -> output number
            for i in range(r.tokens.size):
                flat.append((k, s, int(r.tokens[i]), int(r.positions[i]), want.get(i, -1)))
        out_rows: dict[int, list] = {k: [] for k, _, _ in items}
        for a in range(0, len(flat), limit):
            chunk = flat[a : a + limit]
            tokens = np.array([c[2] for c in chunk], np.int32)
            pos = np.array([c[3] for c in chunk], np.int32)
            seqs = np.array([c[1] for c in chunk], np.int32)
            outs = np.array([i for i, c in enumerate(chunk) if c[4] >= 0], np.int64)
            if sampled and outs.size:
                specs = [by_k[chunk[i][0]].sample for i in outs]
                head = head_request(ctx, specs, np.arange(len(specs)), np.array([chunk[i][4] for i in outs]))
                stats = ctx.decode_tokens(tokens, pos, seq_ids=seqs, outputs=outs, head=head)
                for row, i in enumerate(outs):
                    out_rows[chunk[i][0]].append(stats.take(slice(row, row + 1)))
                continue
            logits = ctx.decode_tokens(tokens, pos, seq_ids=seqs, outputs=outs)
            for row, i in enumerate(outs):
                out_rows[chunk[i][0]].append(np.array(logits[row], copy=True))
        for k, _, r in items:
            rows = out_rows[k]
            if sampled:
                results[k] = RowStats.concat(rows)
                continue
            logits = np.stack(rows) if rows else np.empty((0, self.engine.n_vocab), np.float32)
            results[k] = logits if r.sample is None else r.sample.stats(logits)

    def slots(self, seq: int, n: int) -> np.ndarray:
        """The head's self-conditioning slots of a sequence's first n canvas rows."""
        return FIRST_SLOT + seq * self.canvas + np.arange(n)

    @staticmethod
    def _positions(items) -> tuple[np.ndarray, np.ndarray]:
        """Positions and sequence ids of a round's canvases, concatenated."""
        pos = np.concatenate([r.positions for _, _, r in items]).astype(np.int32)
        seqs = np.concatenate([np.full(r.positions.size, s, np.int32) for _, s, r in items])
        return pos, seqs

    def _denoise_backend(self, items, results) -> None:
        ctx = self.ctx
        ctx.set_causal(False)
        tokens = np.concatenate([r.canvas for _, _, r in items]).astype(np.int32)
        pos, seqs = self._positions(items)
        sizes = [r.canvas.size for _, _, r in items]
        writes = np.concatenate([self.slots(s, r.canvas.size) for _, s, r in items])
        reads = np.concatenate([np.zeros(r.canvas.size, np.int64) if r.first_step else self.slots(s, r.canvas.size)
                                for _, s, r in items])
        head = head_request(ctx, [r.sample for _, _, r in items], np.repeat(np.arange(len(items)), sizes),
                            sc_write=writes.astype(np.int32), sc_read=reads.astype(np.int32),
                            keep_logits=self.check is not None)
        stats = ctx.decode_tokens(tokens, pos, seq_ids=seqs, head=head)
        if self.check is not None:
            self.check(self, items, *stats)
            stats = stats[0]
        for (k, _, _), part in zip(items, stats.split(sizes)):
            results[k] = part
        for _, s, r in items:
            ctx.seq_rm(s, int(r.positions[0]))  # the decoder reads the cache, never writes it

    def _denoise_host(self, items, results) -> None:
        ctx = self.ctx
        ctx.set_causal(False)
        engine = self.engine
        t0 = time.perf_counter()
        emb = np.concatenate([
            engine.selfcond.decoder_inputs(engine.embedding, r.canvas, None if r.first_step else self._processed[s],
                                           top_k=self.soft_top_k)
            for _, s, r in items
        ])
        host_s = time.perf_counter() - t0
        pos, seqs = self._positions(items)
        logits = ctx.decode_embeddings(emb, pos, seq_ids=seqs)
        t0 = time.perf_counter()
        start = 0
        stats: list[tuple[int, RowStats]] = []
        for k, s, r in items:
            n = r.positions.size
            x = np.array(logits[start : start + n], copy=True)
            start += n
            if r.sample.bias_ids.size:
                x[:, r.sample.bias_ids] += r.sample.bias_values
            processed = (x * np.float32(r.sample.inv_temp)).astype(np.float32)  # as the backend scales
            self._processed[s] = processed
            stats.append((k, sampling.row_stats(processed, inv_temp=1.0, uniform=r.sample.uniform)))
        host_s += time.perf_counter() - t0
        for k, st in stats:
            results[k] = replace(st, host_s=host_s)
        for _, s, r in items:
            ctx.seq_rm(s, int(r.positions[0]))  # the decoder reads the cache, never writes it
