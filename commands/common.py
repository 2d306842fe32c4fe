"""Pieces shared by the subcommands: common flags, model resolution, sampler flags."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dgchat import assets
from dgchat.config import load_config
from dgchat.hub.manager import ModelManager
from dgchat.model_backend.engine_protocol import LocalEngine
from dgchat.model_backend.errors import InvalidParameterError, ModelFileError
from dgchat.model_backend.param_resolution import CONFIG, FLAG, Layer, precise_setting
from dgchat.model_backend.placement import EXPERTS_ON
from dgchat.model_backend.params import (
    ALGORITHMS,
    CACHE_MODES,
    SAMPLER_PLACES,
    SOFT_EMBEDDINGS,
    DiffusionParams,
    threads_problem,
)


def add_common(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS keeps `dgchat --verbose generate` working: the subparser must not reset it to False
    parser.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help="show llama.cpp's log lines")


def add_model_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("-m", "--model", required=required,
                        help="GGUF model file or installed model name (default: $DGCHAT_MODEL, else the "
                             "default_model of the config, else the bundled model)")
    # --n-gpu-layers: the older spelling, kept (dest stays n_gpu_layers for the commands that read it)
    parser.add_argument("--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=gpu_layers_arg, default=None,
                        metavar="N", help="llama.cpp's n_gpu_layers: the output layer, then the last N-1 layers on the "
                                          "GPU (default: [engine] gpu_layers, else planned from the GPU's free memory)")
    parser.add_argument("--experts-on", choices=EXPERTS_ON, default=None,
                        help="mixture-of-experts models: where the routed experts may go; cpu keeps them all in "
                             "RAM, gpu never (default: [engine] experts_on, else auto: in RAM only as the GPU's "
                             "free memory needs)")
    parser.add_argument("--threads", type=threads_arg, default=None, metavar="N",
                        help="CPU threads, 1 to 4 per core (default: all cores)")
    parser.add_argument("--rpc", default=None, metavar="HOST:PORT[,HOST:PORT]", help=RPC_HELP)


def gpu_layers_arg(text: str) -> int:
    """argparse type of --gpu-layers: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0 (got {text!r})")
    return value


def placement_choice(args: argparse.Namespace) -> dict[str, Any]:
    """--gpu-layers and --experts-on, else config.toml's [engine] gpu_layers and experts_on, as
    open_local_engine's keywords (model_backend/placement.py plans what is left unset)."""
    layers, experts = getattr(args, "n_gpu_layers", None), getattr(args, "experts_on", None)
    if layers is None or experts is None:
        config = load_config()
        layers = config.n_gpu_layers if layers is None else layers
        experts = config.experts_on if experts is None else experts
    return {"n_gpu_layers": layers, "experts_on": experts or "auto"}


def threads_arg(text: str) -> int:
    """argparse type of every --threads flag: a whole number from 1 to 4 per core, else the
    parser's one-line error naming the flag and the range."""
    try:
        value: object = int(text)
    except ValueError:
        value = text
    problem = threads_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return int(text)


# The RPC backend is in the default engine build (engine/build.py adds -DGGML_RPC=ON unless --no-rpc),
# so the help asks for no special build
RPC_HELP = ("put the model's layers on llama.cpp RPC servers (`dgchat rpc-server` on other machines; the default "
            "engine build includes RPC). No authentication or encryption: trusted networks only (docs/SCALING.md)")


def use_rpc_servers(spec: str, *, command: str | None, remote: object = None) -> None:
    """Register the RPC servers of `--rpc` before any model loads (model_backend/rpc.py): each one
    is reached and greeted first, so a bad address is a one-line error, not an abort."""
    if remote:
        raise InvalidParameterError("--rpc puts a local model's layers on RPC servers, --server runs on a remote "
                                    "engine: give one of them")
    if command == "bench":
        raise InvalidParameterError("dgchat bench measures in fresh processes of its own: --rpc is not supported there")

    from dgchat.model_backend import rpc  # loads llama.cpp: only when --rpc is given

    endpoints = rpc.connect(spec)
    sys.stderr.write("dgchat: model layers go to the RPC server(s) " + ", ".join(e.text for e in endpoints)
                     + " (split by free memory; local GPUs too)\n")


def add_sampler_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling (unset values take the model's recommended defaults)")
    g.add_argument("--steps", type=int, help="denoising steps per canvas")
    g.add_argument("--gen-length", type=int, help="canvas length: tokens denoised in parallel")
    g.add_argument("--block-length", type=int, help="semi-autoregressive block length inside the canvas")
    g.add_argument("--max-tokens", type=int, help="longest answer; answers continue on new canvases up to this")
    g.add_argument("--algorithm", choices=ALGORITHMS, help="which positions to commit first")
    g.add_argument("--eps", type=float, help="timestep schedule end point (Dream-style schedule)")
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-k", type=int, help="keep the k most likely tokens (0: off)")
    g.add_argument("--top-p", type=float, help="nucleus sampling (1: off)")
    g.add_argument("--cfg-scale", type=float, default=0.0, help="classifier-free guidance scale")
    g.add_argument("--threshold", type=float, help="commit every position whose confidence >= this (Fast-dLLM)")
    g.add_argument("--factor", type=float, help="Fast-dLLM factor-based parallel decoding")
    g.add_argument("--alg-temp", type=float, default=0.0, help="randomness in choosing positions to commit")
    g.add_argument("--gumbel", action="store_true", help="reference mode: llama.cpp's add_gumbel_noise")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--mode", choices=("dgchat", "reference"), default="dgchat",
                   help="reference: the same tokens as llama.cpp's examples/diffusion")
    g.add_argument("--cache", choices=CACHE_MODES, default="auto",
                   help="KV cache reuse across steps (auto: prefix on GGUFs with KV memory, else none)")
    g.add_argument("--sampler-on", choices=SAMPLER_PLACES, default="auto",
                   help="where a step's vocabulary-wide work (softmax, entropy, draws, DiffusionGemma's "
                        "self-conditioning) runs: backend = inside llama.cpp on its CPU/GPU, host = numpy "
                        "(auto: the backend with dgchat's engine)")
    g.add_argument("--soft-embedding", choices=SOFT_EMBEDDINGS, default="auto",
                   help="DiffusionGemma: self-conditioning over the whole vocabulary (exact) or each position's "
                        "256 likeliest tokens (auto: exact with --precise, on a GPU or up to 65,536 tokens)")
    g.add_argument("--no-early-stop", action="store_true", help="keep denoising after the end token")
    g.add_argument("--entropy-bound", type=float, help="DiffusionGemma: entropy budget per step")
    g.add_argument("--t-min", type=float, help="DiffusionGemma: final temperature")
    g.add_argument("--t-max", type=float, help="DiffusionGemma: initial temperature")
    g.add_argument("--pad-bias", type=float,
                   help="DiffusionGemma: added to the pad token's logit at each denoising step; negative "
                        "values give longer answers (default: the model's, 0 if it names none)")
    g.add_argument("--ar", action="store_true", help="DiffusionGemma: decode autoregressively with the same weights")


PRECISE_HELP = ("exact mode: f32 KV cache and no flash attention, the engine the equivalence tests use (logits "
                "match transformers to float32 noise; slower, more memory), and DiffusionGemma's "
                "self-conditioning over the whole vocabulary at any size. Default: [engine] precise in "
                "config.toml, else off (f16 KV cache, flash attention where the backend has it)")


def add_precise_arg(parser: argparse.ArgumentParser, help: str = PRECISE_HELP) -> None:
    # None when not given: the config's [engine] precise decides (precise_choice)
    parser.add_argument("--precise", action=argparse.BooleanOptionalAction, default=None, help=help)


def precise_choice(args: argparse.Namespace) -> tuple[bool, str]:
    """Exact mode and where it was chosen: --precise/--no-precise, else config.toml's [engine]
    precise, else off (model_backend/param_resolution.precise_setting)."""
    flag = getattr(args, "precise", None)
    if flag is not None:
        return precise_setting((FLAG, flag))
    return precise_setting((CONFIG, load_config().precise))


def open_local_engine(model_path: str | Path, *, n_gpu_layers: int | None = None, n_threads: int | None = None,
                      precise: bool = False, experts_on: str = "auto") -> LocalEngine:
    """The engine `dgchat generate`, `serve` and `npc` run a local model on. precise: the f32 KV
    cache without flash attention (llamacpp.LlamaContext exact_kv), as tests/fixtures/dg_engine.py
    opens it; otherwise an f16 KV cache with flash attention on auto. n_gpu_layers and experts_on
    (`placement_choice`) override the placement planned from the GPU's free memory."""
    from dgchat.model_backend.loader import load_engine  # loads llama.cpp: not at `dgchat --help`

    return load_engine(model_path, n_gpu_layers=n_gpu_layers, n_threads=n_threads, precise=precise,
                       experts_on=experts_on)


def flag_layer(args: argparse.Namespace) -> Layer:
    """The sampler flags as the "flag" layer of model_backend/param_resolution."""
    return Layer.of(FLAG, params_from_args(args))


def params_from_args(args: argparse.Namespace) -> DiffusionParams:
    params = DiffusionParams(
        steps=args.steps,
        gen_length=args.gen_length,
        block_length=args.block_length,
        algorithm=args.algorithm,
        eps=args.eps,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        cfg_scale=args.cfg_scale,
        threshold=args.threshold,
        factor=args.factor,
        alg_temp=args.alg_temp,
        gumbel=args.gumbel,
        seed=args.seed,
        max_tokens=args.max_tokens,
        early_stop=not args.no_early_stop,
        mode=args.mode,
        cache=args.cache,
        entropy_bound=args.entropy_bound,
        t_min=args.t_min,
        t_max=args.t_max,
        pad_bias=args.pad_bias,
        autoregressive=args.ar,
        sampler_on=args.sampler_on,
        soft_embedding=args.soft_embedding,
    )
    params.validate()
    return params


def resolve_model_path(arg: str | None) -> Path:
    """The model to use: the argument, else $DGCHAT_MODEL, else the configured default, else the bundled model."""
    if arg:
        path = Path(arg).expanduser()
        if path.exists() or path.suffix == ".gguf" or "/" in arg:
            return path
        # not a file: an installed or bundled model's name (`dgchat models list`)
        return ModelManager().model_path(arg)
    env = os.environ.get("DGCHAT_MODEL")
    if env:
        return Path(env).expanduser()
    try:
        configured = load_config().default_model
        if configured:
            return Path(configured).expanduser()
    except (ImportError, AttributeError):
        pass

    bundled = assets.bundled_model_path()
    if bundled is None:
        raise ModelFileError("no model given and no bundled model installed; pass -m MODEL.gguf")
    return bundled


@contextmanager
def ctrl_c_cancels() -> Iterator[threading.Event]:
    """An event that the first Ctrl-C sets (the work stops at its next step and keeps what it has);
    a second Ctrl-C interrupts at once. Off the main thread (where signals cannot be handled) the
    event is only set by its owner."""
    cancel = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield cancel
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(_sig: int, _frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)
