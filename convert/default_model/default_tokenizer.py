"""The default model's tokenizer and chat template.

Tokenizer: byte-level BPE (16,384 entries by default, issue 13's v2; the shipped v1 has 8,192:
`prepare --vocab-size 8192`) trained with `tokenizers` on the training plays. The
pre-tokenizer is GPT-2's: `ByteLevel(add_prefix_space=False, use_regex=True)` splits with

    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

which is the regex llama.cpp applies for `tokenizer.ggml.pre = "gpt-2"` (LLAMA_VOCAB_PRE_TYPE_GPT2
in llama-vocab.cpp; its trailing `\\s+` alternative is implied by llama.cpp's splitter, which keeps
unmatched whitespace as its own piece). No normalizer, no BOS added by the tokenizer itself:
the chat template writes `<bos>`.

Special tokens (fixed ids):

    0 <pad>            canvas padding after the end of a turn (what `generate` writes after eos)
    1 <eos>            end of text; never trained on, kept as a second stop token
    2 <bos>            start of a conversation
    3 <start_of_turn>  opens a turn; the speaker's name and a newline follow
    4 <end_of_turn>    closes a turn; the model's stop token
    5 <mask>           unused by the uniform-state objective; reserved for a masked-diffusion model

Chat template (the NPC format). A conversation is a scene of a play: every turn is spoken by a
named character, and the model speaks as its own character.

    <bos><start_of_turn>system
    You are FALSTAFF, a fat old knight. Scene: London. The Boar's Head Tavern.<end_of_turn>
    <start_of_turn>PRINCE
    Now, Hal, what time of day is it, lad?<end_of_turn>
    <start_of_turn>FALSTAFF
    <generation starts here>

* `system` message: who the model is. Content is free text; the training data always reads
  "You are NAME[, description]. [Scene: place.]", so that shape works best. Its optional `name`
  is the model's character name (default: the first assistant message's `name`, else "HOST").
* `user` messages are spoken by `name` if given, else "TRAVELLER".
* `assistant` messages are spoken by their own `name` if given, else the model's name.
* Names are upper-cased (the plays' convention); content is stripped of surrounding whitespace.
* `add_generation_prompt` opens a turn for the model's character.

Training renders every example through this same template (`render_chat`), so the token
sequence the model sees at run time is the one it was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgchat.model_backend.errors import DgchatError
from dgchat.paths import atomic_write_text

VOCAB_SIZE = 16384
PAD, EOS, BOS, START_OF_TURN, END_OF_TURN, MASK = range(6)
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<mask>"]
GGUF_PRE_TOKENIZER = "gpt-2"  # llama.cpp name whose regex equals the ByteLevel regex above
GPT2_SPLIT_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

DEFAULT_MODEL_NAME = "HOST"
DEFAULT_USER_NAME = "TRAVELLER"

CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(model='" + DEFAULT_MODEL_NAME + "') -%}"
    "{%- for message in messages | reverse -%}"
    "{%- if message['role'] == 'assistant' and message['name'] is defined and message['name'] -%}"
    "{%- set ns.model = message['name'] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and message['name'] is defined and message['name'] -%}"
    "{%- set ns.model = message['name'] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set speaker = 'system' -%}"
    "{%- elif message['name'] is defined and message['name'] -%}"
    "{%- set speaker = message['name'] | trim | upper -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- set speaker = ns.model | trim | upper -%}"
    "{%- else -%}"
    "{%- set speaker = '" + DEFAULT_USER_NAME + "' -%}"
    "{%- endif -%}"
    "{{- '<start_of_turn>' + speaker + '\n' + message['content'] | trim + '<end_of_turn>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<start_of_turn>' + ns.model | trim | upper + '\n' -}}"
    "{%- endif -%}"
)


def render_chat(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False,
                template: str = CHAT_TEMPLATE) -> str:
    """Render like a runtime would: Jinja2's ImmutableSandboxedEnvironment, standard variables."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=list(messages),
        add_generation_prompt=add_generation_prompt,
        bos_token=SPECIAL_TOKENS[BOS],
        eos_token=SPECIAL_TOKENS[EOS],
    )


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE):
    """Train the byte-level BPE on `texts` (rendered conversations; special tokens are skipped)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise DgchatError(f"special token {name} got id {tok.token_to_id(name)}, expected {i}")
    if tok.get_vocab_size() != vocab_size:
        raise DgchatError(f"tokenizer has {tok.get_vocab_size()} entries, expected {vocab_size}")
    return tok


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def tokenizer_config(model_max_length: int) -> dict[str, Any]:
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[BOS],
        "eos_token": SPECIAL_TOKENS[EOS],
        "pad_token": SPECIAL_TOKENS[PAD],
        "mask_token": SPECIAL_TOKENS[MASK],
        "additional_special_tokens": [SPECIAL_TOKENS[START_OF_TURN], SPECIAL_TOKENS[END_OF_TURN]],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "right",
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
        # Read by dgchat's converter: the llama.cpp pre-tokenizer name for this vocabulary.
        "dgchat_gguf_pre": GGUF_PRE_TOKENIZER,
    }


def _atomic_write_text(path: Path, text: str) -> None:
    atomic_write_text(path, text, mode=0o644)  # these files ship


def save_tokenizer_files(tok, out_dir: Path, model_max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json the way a HF checkpoint carries them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write_text(out_dir / "tokenizer.json", tok.to_str(pretty=True))
    _atomic_write_text(out_dir / "tokenizer_config.json",
                       json.dumps(tokenizer_config(model_max_length), indent=2) + "\n")


@dataclass(frozen=True)
class EncodedTurn:
    start: int  # index of the first body token (just after "<start_of_turn>NAME\n")
    end: int  # index of the turn's <end_of_turn> token
    role: str


def encode_chat(tok, messages: Sequence[dict[str, Any]]) -> tuple[list[int], list[EncodedTurn]]:
    """Tokenize a rendered conversation and locate each non-system turn's body.

    The body of turn i is ids[start:end]; the canvas target is that plus <end_of_turn>. The header
    "<start_of_turn>NAME\\n" always ends in a newline token of its own (the GPT-2 regex splits
    "\\n" from the following word), so ids[:start] is exactly what
    `render_chat(messages[:i], add_generation_prompt=True)` tokenizes to when the speaker is
    the model's character -- the tests check that.
    """
    newline = tok.token_to_id("\u010a")  # byte-level spelling of "\\n"
    ids = tok.encode(render_chat(messages), add_special_tokens=False).ids
    starts = [i for i, t in enumerate(ids) if t == START_OF_TURN]
    ends = [i for i, t in enumerate(ids) if t == END_OF_TURN]
    if len(starts) != len(messages) or len(ends) != len(messages):
        raise DgchatError("a message renders special tokens inside its content")
    turns: list[EncodedTurn] = []
    for msg, s, e in zip(messages, starts, ends):
        try:
            nl = ids.index(newline, s + 1, e)
        except ValueError:
            raise DgchatError("turn header does not end in a newline token") from None
        if msg["role"] != "system":
            turns.append(EncodedTurn(start=nl + 1, end=e, role=msg["role"]))
    return ids, turns
