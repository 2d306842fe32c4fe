"""Export the trained default model into `assets/` and measure what the model card reports (issue 4).

    python -m dgchat.convert.default_model.bundle_default --model convert/runs/v4/dgchat-tiny-plays --data-dir convert/runs/data \\
        --out assets/dgchat-tiny-plays.gguf --report convert/runs/v4/bundle_report.json

1. `dgchat convert` (the path a user's 26B checkpoint takes) writes the exported folder as GGUF
   in f32, f16 and q8_0.
2. Each file is scored through llama.cpp on held-out windows (two whole plays the training never
   saw): the causal encoder's next-token cross-entropy, in nats per token. The smallest type whose
   loss is within `--tolerance` (relative) of f32's is the one shipped -- "quantized if that keeps
   quality".
3. The shipped file generates the model card's NPC exchanges: the first 20 of a fixed seed list,
   uncurated, by block diffusion and by `--ar`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dgchat.convert.api import convert
from dgchat.convert.default_model.token_windows import Windows
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.params import DiffusionParams
from dgchat.paths import atomic_write_bytes, atomic_write_text

TYPES = ("f32", "f16", "q8_0")  # largest first; the smallest that keeps quality ships
SEEDS = list(range(20))

# (character the model plays, scene, who speaks to it, what they say): NPC situations in the
# plays' idiom. Exchange i uses seed SEEDS[i]; nothing is picked after seeing the output.
EXCHANGES: list[tuple[str, str, str, str]] = [
    ("INNKEEPER", "A tavern in Eastcheap.", "TRAVELLER", "Good evening. Have you a bed for the night?"),
    ("GUARD", "Before the castle gate, at night.", "TRAVELLER", "Let me pass, I bring letters for the king."),
    ("KING", "The palace. A room of state.", "MESSENGER", "My liege, the French are landed at the coast."),
    ("FOOL", "A heath. A storm.", "LEAR", "Where are my daughters now, boy?"),
    ("NURSE", "A street in Verona.", "ROMEO", "Commend me to thy lady, nurse."),
    ("HOST", "An inn on the road to London.", "FALSTAFF", "Bring me a cup of sack, and be quick."),
    ("QUEEN", "A garden of the palace.", "LADY", "Madam, will you walk a little in the garden?"),
    ("CAPTAIN", "A camp near the field of battle.", "SOLDIER", "The enemy is marching on the town."),
    ("MERCHANT", "A public place in Venice.", "TRAVELLER", "What ships are come into the harbour?"),
    ("HAMLET", "Elsinore. A room in the castle.", "HORATIO", "My lord, I came to see your father's funeral."),
    ("PORTER", "The gate of a castle.", "MACDUFF", "Was it so late, friend, ere you went to bed?"),
    ("DUKE", "A hall in the duke's palace.", "ANGELO", "What is your will, my lord?"),
    ("SHEPHERD", "The forest of Arden.", "ROSALIND", "I pray you, is there any cottage hereabouts?"),
    ("GHOST", "The platform before the castle.", "HAMLET", "Speak, I am bound to hear."),
    ("CLOWN", "A room in the house.", "OLIVIA", "Take the fool away."),
    ("SERVANT", "A hall in the house.", "MASTER", "Where is my horse? Is he saddled yet?"),
    ("SOLDIER", "The walls of the city.", "CAPTAIN", "What news from the field?"),
    ("PRINCE", "London. An apartment of the prince's.", "POINS", "Where shall we sup tonight, Hal?"),
    ("WITCH", "A desert place. Thunder and lightning.", "BANQUO", "What are these, so withered and so wild?"),
    ("LADY", "A room in the castle.", "LORD", "Why do you weep, sweet lady?"),
]


def messages_for(exchange: tuple[str, str, str, str]) -> list[dict[str, str]]:
    name, scene, user_name, line = exchange
    return [
        {"role": "system", "name": name, "content": f"You are {name}. Scene: {scene}"},
        {"role": "user", "name": user_name, "content": line},
    ]


def heldout_nll(path: Path, windows: Any, n_windows: int) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) of the causal encoder over the first `n_windows`
    held-out windows, computed by llama.cpp; also per character of the scored text, the figure
    that compares models with different tokenizers (v1's 8,192 entries, v2's 16,384)."""
    engine = load_engine(path)
    try:
        total, count, chars = 0.0, 0, 0
        for i in range(min(n_windows, len(windows))):
            ids = np.asarray(windows.ids(i), dtype=np.int32)
            lp = engine.pseudo_log_likelihood(ids[:1], ids[1:])
            total -= float(lp.sum())
            count += int(lp.size)
            chars += len(engine.detokenize([int(t) for t in ids[1:]]))
        return {"nll": total / count, "tokens": count, "chars": chars, "nats_per_char": total / chars}
    finally:
        engine.close()


def npc_samples(path: Path, autoregressive: bool) -> list[dict[str, Any]]:
    engine = load_engine(path)
    out = []
    try:
        for exchange, seed in zip(EXCHANGES, SEEDS):
            prompt = engine.chat_prompt(messages_for(exchange))
            params = DiffusionParams(seed=seed, autoregressive=autoregressive)
            t0 = time.perf_counter()
            final = None
            for event in engine.generate(prompt, params):
                if isinstance(event, FinalEvent):
                    final = event
            assert final is not None
            out.append({"seed": seed, "character": exchange[0], "scene": exchange[1], "speaker": exchange[2],
                        "line": exchange[3], "reply": final.text.strip(), "tokens": len(final.tokens),
                        "seconds": round(time.perf_counter() - t0, 3)})
    finally:
        engine.close()
    return out


def samples_markdown(samples: list[dict[str, Any]]) -> str:
    rows = []
    for s in samples:
        reply = s["reply"].replace("\n", " / ") or "(empty)"
        rows.append(f"{s['seed'] + 1}. *{s['character']}* ({s['scene']}) — **{s['speaker']}:** {s['line']}  \n"
                    f"   **{s['character']}:** {reply}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dgchat.convert.default_model.bundle_default", description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="the exported HF-style folder")
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="the GGUF to write (assets/dgchat-tiny-plays.gguf)")
    ap.add_argument("--report", type=Path, required=True, help="JSON with every number measured")
    ap.add_argument("--windows", type=int, default=60, help="held-out windows to score")
    ap.add_argument("--tolerance", type=float, default=0.005, help="relative loss increase allowed")
    args = ap.parse_args(argv)

    windows = Windows(args.data_dir / "val.npz")
    report: dict[str, Any] = {"model": str(args.model), "types": {}}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for t in TYPES:
            res = convert(args.model, Path(tmp) / f"model-{t}.gguf", outtype=t)
            files[t] = res.output
            score = heldout_nll(res.output, windows, args.windows)
            report["types"][t] = {"bytes": res.n_bytes, **score}
            print(json.dumps({"type": t, "bytes": res.n_bytes, **score}), flush=True)
        base = report["types"]["f32"]["nll"]
        chosen = next(t for t in reversed(TYPES) if report["types"][t]["nll"] <= base * (1 + args.tolerance))
        report["chosen"] = chosen
        atomic_write_bytes(args.out, files[chosen].read_bytes(), mode=0o644)  # it ships
    report["samples_diffusion"] = npc_samples(args.out, autoregressive=False)
    report["samples_ar"] = npc_samples(args.out, autoregressive=True)
    atomic_write_text(args.report, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"shipped {chosen}: {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    print("\n## diffusion\n" + samples_markdown(report["samples_diffusion"]))
    print("\n## --ar\n" + samples_markdown(report["samples_ar"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
