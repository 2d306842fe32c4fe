"""Architecture, training and generation settings of the default model (issue 4).

One place for every number the recipe uses, so a run is reproducible from the step count and
the seed alone. `model_config()` builds the transformers `DiffusionGemmaConfig`; the vision tower
it must carry to instantiate is the smallest one Gemma 4's vision code accepts, and the
converter skips its weights (text-only model).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dgchat.convert.default_model.default_tokenizer import BOS, END_OF_TURN, EOS, PAD, VOCAB_SIZE

CANVAS_LENGTH = 32  # most speeches are a line or two; short canvases waste less on padding
MAX_SEQ_LEN = 256  # training window (tokens); must stay below SLIDING_WINDOW
SLIDING_WINDOW = 512  # >= the training context, so sliding layers behave like full ones there
MAX_TURN_TOKENS = 96  # longer speeches are split at line breaks into turns of at most this
MAX_CANVASES = 8  # canvases drawn per window and step (bounds the decoder's cost)


@dataclass(frozen=True)
class TextArch:
    vocab_size: int = VOCAB_SIZE
    hidden_size: int = 256
    num_hidden_layers: int = 4
    # Two sliding, one full, one sliding... the last must be full (transformers forces it).
    layer_types: tuple[str, ...] = ("sliding_attention", "full_attention", "sliding_attention", "full_attention")
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64  # sliding layers
    # Full-attention layers: Gemma 4 gives them a wider head; kept equal to the sliding layers'
    # here, because transformers 5.23 serialises `per_layer_config` as {} in config.json and a
    # reload would fall back to head_dim / num_key_value_heads anyway.
    global_head_dim: int = 64
    num_global_key_value_heads: int = 2
    intermediate_size: int = 512  # dense MLP, also the self-conditioning MLP
    num_experts: int = 4
    top_k_experts: int = 2
    moe_intermediate_size: int = 256
    sliding_window: int = SLIDING_WINDOW
    max_position_embeddings: int = 4096
    final_logit_softcapping: float = 30.0
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02


@dataclass(frozen=True)
class TrainSettings:
    """v1's recipe (issue 4), from scratch; `V2_CONTINUATION` is what v2 changes."""

    seed: int = 1234
    # 2400 steps x 16 windows (~200 tokens each) = 7.7M encoder tokens, ~5 epochs of the training
    # plays. Measured on the 2-core dev machine (bf16 autocast, 2 threads, otherwise idle):
    # 2.15 s/step (~1500 encoder tokens/s + ~1700 canvas tokens/s) -> ~86 min of steps, ~91 min
    # with evaluation and samples.
    steps: int = 2400
    batch_size: int = 16  # windows of up to MAX_SEQ_LEN tokens
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 150
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    ar_loss_weight: float = 1.0  # next-token loss on the causal encoder pass
    router_aux_weight: float = 0.01  # Switch-style load balancing over the experts
    self_cond_prob: float = 0.5  # share of steps that first run a no-grad decoder pass
    t_min: float = 0.02  # noise level t = t_min + (1 - t_min) * u ** t_power, u ~ U(0, 1), per canvas
    # 1.0: t uniform (v1). v2 uses 0.5, a density rising linearly to 1 (twice v1's share of
    # canvases above t = 0.9): generation starts from a fully random canvas, where v1's decoder
    # barely beat the unigram (4.78 vs 4.82 nats).
    t_power: float = 1.0
    # Rollout canvases (v3): on a self-conditioning step, this share of the canvases is fed to the
    # second pass as the generation sampler would leave it after one step from the first pass's
    # logits (`train_default.rollout_canvases`): the sure positions hold the decoder's own draws,
    # all others fresh random tokens, next to the previous logits / temperature. Generation shows
    # the decoder exactly that, but the plain objective never does: there the self-conditioning
    # logits come from the same canvas, so a random token in it is never news.
    rollout_prob: float = 0.0
    # v4: the loss on a rollout canvas counts only the positions holding fresh random tokens, not
    # the ones the sampler accepted (drawn at high noise, often wrong). Measured: the answers shrink
    # as v3's do; the short answers come from the pad tail (below; model card), which the shipped
    # model's pad bias breaks at sampling time.
    rollout_loss_fresh_only: bool = False
    # What fills a turn's last canvas after its <end_of_turn> (`train_default.canvases_for`):
    # "pad" (v1-v4) or "text", what the window says next (v5).
    turn_tail: str = "pad"
    eval_every: int = 200
    eval_batches: int = 12
    ckpt_every: int = 200
    log_every: int = 10
    sample_every: int = 400


V1_VOCAB_SIZE = 8192

# v2 (issue 13) continues from v1's weights (convert/default_model/warm_start.py) with the vocabulary grown to
# 16,384 entries and more of its canvases at high noise. Peak LR half of v1's: the body is already
# trained, the 8,192 new token rows are not. 1000 steps measured ~5 s each on the 2-core machine
# (the 16k LM head costs ~1.6x the 8k one per step), about 90 minutes with evaluation.
V2_CONTINUATION = TrainSettings(steps=1000, lr=1e-3, warmup_steps=100, t_power=0.5, eval_every=250,
                                ckpt_every=50, sample_every=500)
# v3, an experiment (issue 13, fifth session; not shipped): v2 from its step 1,000 with rollout
# canvases. The decoder keeps a random token whenever it is sure of it (tests/bench/probe_nonwords.py:
# 34 of 40 non-words hold copied noise), and only the inference-like canvas shows it that the token
# just arrived. Measured: the non-words go, and so does the answers' length (model card, "Rollout
# canvases"): the shipped model stays v2.
V3_ROLLOUT = TrainSettings(steps=500, lr=2e-4, warmup_steps=20, t_power=1.0, self_cond_prob=0.5,
                           rollout_prob=0.5, eval_every=100, ckpt_every=50, sample_every=250)
# v4 (issue 13): v3 with the rollout loss on fresh positions only. Its step-100 weights are the
# bundled model, exported with `--pad-bias -1`: without that sampler default they answer in ~4 words
# (the pad chain, below), with it as long as v2 at 97.6 % word validity (model card, "v4").
V4_ROLLOUT_FRESH = replace(V3_ROLLOUT, rollout_loss_fresh_only=True)
# v5, an experiment (issue 13, sixth session): v3 with text after each answer's <end_of_turn>
# instead of pads. In v3/v4 the sampler accepts the pads first, from the canvas's end backwards
# (each is sure given the pad to its right, and the temperature below 1 sharpens every link of
# that chain), until the answer is a few tokens long. Measured: longer in tokens, not in words
# (runs of commas, the next turn's header), and canvases that never settle: not shipped.
V5_ROLLOUT_TEXT_TAIL = replace(V3_ROLLOUT, turn_tail="text")
# v6 (issue 13, ninth session): v4's weights, the decoder trained on a teacher's answers instead of
# the plays' lines (sequence-level distillation, convert/default_model/distill.py; `train --teacher FILE`), the
# encoder's AR loss still on the plays. The v4 decoder resolves ~1.3 canvas positions a step because
# the plays' next line, given its scene, could be almost anything; the teacher's answers (the model's
# own left-to-right decoder, its first word sampled, the rest greedy) are a function of the context
# and their first word, so the student can accept most of a canvas at once.
V6_DISTILLED = replace(V4_ROLLOUT_FRESH, steps=300, lr=3e-4, t_power=0.5, eval_every=50, ckpt_every=25,
                       sample_every=100)
RECIPES = {"v1": TrainSettings(), "v2": V2_CONTINUATION, "v3": V3_ROLLOUT, "v4": V4_ROLLOUT_FRESH,
           "v5": V5_ROLLOUT_TEXT_TAIL, "v6": V6_DISTILLED}
# Recipes that fine-tune v2's step-1,000 weights (v6: v4's, the shipped file): they need --init-from and
# have no AR-only baseline of their own (v2's is theirs).
V2_FINE_TUNES = frozenset({"v3", "v4", "v5", "v6"})
# Recipes whose decoder targets are a teacher's answers (`train --teacher`)
DISTILLED = frozenset({"v6"})


# The AR-only baseline (`train --objective ar`, same model, same start) gets the diffusion run's
# training time in steps of its own, from step times measured on the same idle 2-core machine.
# v1: an encoder-only step 0.81 s against the diffusion step's 2.15 s, 2.65x v1's 2,400 steps.
# v2: 3.0 s against 5.6 s at the 16k vocabulary (steps 10-100 of each run), 1.87x the 800 steps
# v2 shipped with (its run stopped there), so 1,500, on a cosine schedule of its own that ends there.
AR_BASELINE_STEPS = {"v1": 6360, "v2": 1500}


@dataclass(frozen=True)
class GenerationDefaults:
    max_new_tokens: int = 128  # four canvases: enough for a speech of a few lines
    max_denoising_steps: int = 24
    entropy_bound: float = 0.5
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005
    eos_token_id: tuple[int, ...] = field(default=(END_OF_TURN, EOS))


def model_config(arch: TextArch = TextArch(), canvas_length: int = CANVAS_LENGTH):
    from transformers import DiffusionGemmaConfig

    text = {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_hidden_layers,
        "layer_types": list(arch.layer_types),
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "global_head_dim": arch.global_head_dim,
        "num_global_key_value_heads": arch.num_global_key_value_heads,
        "num_experts": arch.num_experts,
        "top_k_experts": arch.top_k_experts,
        "moe_intermediate_size": arch.moe_intermediate_size,
        "sliding_window": arch.sliding_window,
        "max_position_embeddings": arch.max_position_embeddings,
        "final_logit_softcapping": arch.final_logit_softcapping,
        "rms_norm_eps": arch.rms_norm_eps,
        "initializer_range": arch.initializer_range,
        "pad_token_id": PAD,
        "eos_token_id": EOS,
        "bos_token_id": BOS,
        "tie_word_embeddings": True,
        "attention_bias": False,
    }
    # Smallest vision tower the Gemma 4 vision code builds; never trained, skipped on conversion.
    vision = {
        "model_type": "gemma4_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "position_embedding_size": 64,
    }
    cfg = DiffusionGemmaConfig(
        text_config=text,
        vision_config=vision,
        canvas_length=canvas_length,
        tie_word_embeddings=True,
        initializer_range=arch.initializer_range,
    )
    return cfg


def generation_config_dict(gen: GenerationDefaults = GenerationDefaults()) -> dict[str, Any]:
    """generation_config.json contents (DiffusionGemmaGenerationConfig's serialised form)."""
    return {
        "max_new_tokens": gen.max_new_tokens,
        "max_denoising_steps": gen.max_denoising_steps,
        "sampler_config": {"entropy_bound": gen.entropy_bound, "_cls_name": "EntropyBoundSamplerConfig"},
        "t_min": gen.t_min,
        "t_max": gen.t_max,
        "stability_threshold": gen.stability_threshold,
        "confidence_threshold": gen.confidence_threshold,
        "bos_token_id": BOS,
        "pad_token_id": PAD,
        "eos_token_id": list(gen.eos_token_id),
    }


def settings_dict() -> dict[str, Any]:
    return {
        "text_arch": asdict(TextArch()),
        "train": asdict(V2_CONTINUATION),
        "generation": asdict(GenerationDefaults()),
        "canvas_length": CANVAS_LENGTH,
        "max_seq_len": MAX_SEQ_LEN,
        "max_turn_tokens": MAX_TURN_TOKENS,
    }
