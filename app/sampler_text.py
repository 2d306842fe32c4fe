"""Sampler settings as people read them: numbers without float noise, annealed temperatures as
"0.8 → 0.4".

Model files store defaults as float32, so 0.005 reads back as 0.004999999888241291; `:g` (six
significant digits) gives the number that was meant. DiffusionGemma does not use `temperature`
when it denoises: its temperature runs from t_max down to t_min over each canvas's steps, so a
status line reading "T 0" for it was wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dgchat.model_backend.params import DiffusionParams

# shown together as the temperature line, not one by one
_TEMPERATURE_KEYS = ("temperature", "t_min", "t_max")


def value_text(value: Any) -> str:
    """One setting's value: floats without noise, true/false, the rest as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def annealed(t_max: Any, t_min: Any) -> str:
    return f"{value_text(float(t_max))} → {value_text(float(t_min))}"


def temperature_text(params: DiffusionParams, uniform_state: bool) -> str:
    """The temperature a generation with `params` uses: "0.8 → 0.4" for a uniform-state model
    (DiffusionGemma) denoising with a t_max → t_min schedule, else the fixed temperature."""
    if uniform_state and not params.autoregressive and params.t_min is not None and params.t_max is not None:
        return annealed(params.t_max, params.t_min)
    return value_text(float(params.temperature or 0.0))


def defaults_text(defaults: Mapping[str, Any], uniform_state: bool) -> tuple[str, str]:
    """(temperature, the other recommended settings as "k=v, …") of a model's defaults."""
    if uniform_state and defaults.get("t_min") is not None and defaults.get("t_max") is not None:
        temperature = annealed(defaults["t_max"], defaults["t_min"]) + " (annealed over each canvas's steps)"
    else:
        temperature = value_text(float(defaults.get("temperature") or 0.0))
    rest = ", ".join(f"{k}={value_text(v)}" for k, v in sorted(defaults.items()) if k not in _TEMPERATURE_KEYS)
    return temperature, rest


# names in the resolved-settings table where the field name reads badly
_LABELS = {"gen_length": "canvas length", "t_max": "temperature start", "t_min": "temperature end",
           "precise": "exact mode (--precise)"}
# block diffusion (SDAR, BD3LM): the canvas is one block, steps are per block, the answer is max tokens
_BLOCK_LABELS = {"gen_length": "canvas (one block)", "block_length": "block length", "steps": "steps per block",
                 "max_tokens": "max tokens (answer)"}


def sources_text(table: Mapping[str, Mapping[str, Any]], uniform_state: bool, *, block_size: int | None = None) -> str:
    """The settings a chat runs with and where each came from (model_backend/param_resolution's
    table, as `dgchat generate --json` prints it), one per line: "steps  48  (model file)".
    Settings no one chose (DiffusionParams' own defaults: cfg 0, ...) are left out (the seed reads "new for each answer"), and a
    uniform-state model's fixed temperature, which it does not read while it denoises. With
    `block_size` (block diffusion) the names say what they mean there ("steps per block")."""
    labels = {**_LABELS, **_BLOCK_LABELS} if block_size else _LABELS
    rows = []
    for name, row in table.items():
        if name == "seed" and row["source"] in ("default", "family default", "model file"):
            # the app draws a seed for every answer unless a person fixed one (with_fresh_seed)
            rows.append(("seed", "new for each answer", "shown on the answer"))
            continue
        if row["source"] == "default" and name != "precise":
            continue
        if name == "temperature" and uniform_state and not table.get("autoregressive", {}).get("value"):
            continue
        value = row["value"]
        text = (f"{len(value)} entries" if value else "none") if isinstance(value, list) else value_text(value)
        rows.append((labels.get(name, name.replace("_", " ")), text, str(row["source"])))
    width = max((len(label) for label, _, _ in rows), default=0)
    return "\n".join(f"  {label.ljust(width)}  {text}  ({source})" for label, text, source in rows)
