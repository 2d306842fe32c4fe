"""Hugging Face BPE tokenizers (tokenizer.json) -> GGUF vocabulary metadata.

Two BPE flavours are supported, the ones dgchat's model families use:

- byte-level BPE (GPT-2 style: a `ByteLevel` pre-tokenizer maps bytes to printable characters;
  LLaDA, Dream/Qwen2): written as llama.cpp tokenizer model "gpt2" with a pre-tokenizer name that
  llama.cpp knows (from the family, or recognised from the split regex);
- SentencePiece-style BPE with byte fallback (spaces become "▁", unknown bytes become <0xNN>
  tokens; Gemma): written under the model name the family gives (e.g. "gemma4").

GGUF keys follow llama.cpp's `tokenizer.ggml.*` convention (gguf-py `Keys.Tokenizer`); token types
are llama.cpp's `llama_token_type` values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType, TokenType

from dgchat.convert.errors import ConvertError
from dgchat.convert.writer import GGUFPlan

# split regexes of well-known byte-level tokenizers -> llama.cpp pre-tokenizer names
_KNOWN_PRE = {
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": "gpt-2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    # Ling / LLaDA-MoE (inclusionAI): the "original regex from tokenizer.json" that llama.cpp's
    # LLAMA_VOCAB_PRE_TYPE_BAILINGMOE quotes (src/llama-vocab.cpp); llama.cpp accepts the names
    # "bailingmoe", "bailingmoe2" and "llada-moe" for it
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+": "bailingmoe",
}


@dataclass
class Vocab:
    model: str  # tokenizer.ggml.model
    pre: str | None  # tokenizer.ggml.pre
    tokens: list[str]
    types: list[int]
    merges: list[str]
    special: dict[str, int] = field(default_factory=dict)  # bos/eos/unk/pad/mask/sep/eot -> id
    add_bos: bool = False
    add_eos: bool = False
    chat_template: str | None = None
    named_templates: dict[str, str] = field(default_factory=dict)

    def id_of(self, text: str) -> int | None:
        try:
            return self.tokens.index(text)
        except ValueError:
            return None

    def write(self, plan: GGUFPlan) -> None:
        plan.string("tokenizer.ggml.model", self.model)
        if self.pre:
            plan.string("tokenizer.ggml.pre", self.pre)
        plan.array("tokenizer.ggml.tokens", self.tokens, GGUFValueType.STRING)
        plan.array("tokenizer.ggml.scores", [0.0] * len(self.tokens), GGUFValueType.FLOAT32)
        plan.array("tokenizer.ggml.token_type", self.types, GGUFValueType.INT32)
        if self.merges:
            plan.array("tokenizer.ggml.merges", self.merges, GGUFValueType.STRING)
        names = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
                 "pad": "padding_token_id", "mask": "mask_token_id", "sep": "seperator_token_id",
                 "eot": "eot_token_id"}
        for role, key in names.items():
            if role in self.special:
                plan.u32(f"tokenizer.ggml.{key}", self.special[role])
        plan.boolean("tokenizer.ggml.add_bos_token", self.add_bos)
        plan.boolean("tokenizer.ggml.add_eos_token", self.add_eos)
        if self.chat_template:
            plan.string("tokenizer.chat_template", self.chat_template)
        for name, template in self.named_templates.items():
            plan.string(f"tokenizer.chat_template.{name}", template)


def _load_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConvertError(f"{path}: unreadable JSON ({exc})") from None
    return data if isinstance(data, dict) else None


def _components(node: Any) -> list[dict[str, Any]]:
    """Flatten a normalizer / pre-tokenizer / decoder spec (Sequence nodes) into its parts."""
    if not isinstance(node, dict):
        return []
    parts = node.get("pretokenizers") or node.get("normalizers") or node.get("decoders")
    if node.get("type") == "Sequence" and isinstance(parts, list):
        out: list[dict[str, Any]] = []
        for p in parts:
            out.extend(_components(p))
        return out
    return [node]


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _byte_level_pre(tj: dict[str, Any]) -> str | None:
    for comp in _components(tj.get("pre_tokenizer")):
        if comp.get("type") == "Split":
            pattern = comp.get("pattern", {})
            regex = pattern.get("Regex") if isinstance(pattern, dict) else None
            if regex in _KNOWN_PRE:
                return _KNOWN_PRE[regex]
            return None
    # ByteLevel with its own regex is GPT-2's
    for comp in _components(tj.get("pre_tokenizer")):
        if comp.get("type") == "ByteLevel" and comp.get("use_regex", True):
            return "gpt-2"
    return None


def read_hf_tokenizer(
    folder: Path,
    *,
    n_vocab: int,
    spm_model: str,
    byte_level_pre: str | None = None,
    default_add_bos: bool = False,
    fallback_ids: dict[str, int | None] | None = None,
    pre_aliases: dict[str, str] | None = None,
) -> Vocab:
    """Read tokenizer.json (+ tokenizer_config.json, chat_template.jinja) from `folder`.

    `n_vocab` is the model's embedding row count: the vocabulary is padded to it with unused
    tokens (checkpoints often round the embedding up) and may not exceed it. `spm_model` is the
    llama.cpp model name for SentencePiece-style BPE; `byte_level_pre` the pre-tokenizer name
    for byte-level BPE when the family knows it (it replaces detection); `pre_aliases` renames a
    detected pre-tokenizer to the name llama.cpp's converter writes for the family (same regex)."""
    folder = Path(folder)
    tj = _load_json(folder / "tokenizer.json")
    if tj is None:
        raise ConvertError(f"{folder}: no tokenizer.json (dgchat converts fast-tokenizer checkpoints only)")
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise ConvertError(f"{folder}: tokenizer model {model.get('type')!r} is not supported (BPE only)")
    base_vocab = model.get("vocab")
    if not isinstance(base_vocab, dict):
        raise ConvertError(f"{folder}/tokenizer.json: model.vocab is missing")

    pre_types = {c.get("type") for c in _components(tj.get("pre_tokenizer"))}
    dec_types = {c.get("type") for c in _components(tj.get("decoder"))}
    byte_level = "ByteLevel" in pre_types or "ByteLevel" in dec_types
    byte_fallback = bool(model.get("byte_fallback"))
    if byte_level:
        ggml_model = "gpt2"
        pre = byte_level_pre or _byte_level_pre(tj)
        if pre is None:
            regex = next((c.get("pattern", {}).get("Regex") for c in _components(tj.get("pre_tokenizer"))
                          if c.get("type") == "Split" and isinstance(c.get("pattern"), dict)), None)
            found = f" (split regex {regex[:60]!r}...)" if isinstance(regex, str) else ""
            raise ConvertError(f"{folder}: unrecognised byte-level pre-tokenizer{found}; llama.cpp would split the "
                               "text differently")
        pre = (pre_aliases or {}).get(pre, pre)
    elif byte_fallback or "Metaspace" in pre_types:
        ggml_model, pre = spm_model, spm_model
    else:
        raise ConvertError(f"{folder}: BPE tokenizer without byte-level or byte-fallback handling is not supported")

    id_to_tok: dict[int, str] = {}
    for text, idx in base_vocab.items():
        id_to_tok[int(idx)] = text
    added: dict[int, bool] = {}
    for tok in tj.get("added_tokens") or []:
        idx, content = int(tok["id"]), str(tok["content"])
        id_to_tok[idx] = content
        added[idx] = bool(tok.get("special"))
    size = max(id_to_tok) + 1
    if size > n_vocab:
        raise ConvertError(f"{folder}: the tokenizer has {size} tokens but the model embeds only {n_vocab}")

    tc = _load_json(folder / "tokenizer_config.json") or {}
    unk_text = _token_text(tc.get("unk_token")) or model.get("unk_token")

    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_vocab):
        text = id_to_tok.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
            continue
        tokens.append(text)
        if i in added:
            types.append(TokenType.CONTROL if added[i] else TokenType.USER_DEFINED)
        elif text == unk_text:
            types.append(TokenType.UNKNOWN)
        elif byte_fallback and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types.append(TokenType.BYTE)
        else:
            types.append(TokenType.NORMAL)

    merges: list[str] = []
    for m in model.get("merges") or []:
        if isinstance(m, str):
            merges.append(m)
        elif isinstance(m, (list, tuple)) and len(m) == 2:
            merges.append(f"{m[0]} {m[1]}")
        else:
            raise ConvertError(f"{folder}/tokenizer.json: malformed merge {m!r}")

    tok_index = {t: i for i, t in enumerate(tokens)}
    special: dict[str, int] = {}
    for role in ("bos", "eos", "unk", "pad", "mask", "sep"):
        text = _token_text(tc.get(f"{role}_token"))
        if text is not None and text in tok_index:
            special[role] = tok_index[text]
        elif fallback_ids and fallback_ids.get(role) is not None:
            special[role] = int(fallback_ids[role])  # type: ignore[arg-type]
    if fallback_ids and fallback_ids.get("eot") is not None:
        special["eot"] = int(fallback_ids["eot"])  # type: ignore[arg-type]

    add_bos = tc.get("add_bos_token")
    if not isinstance(add_bos, bool):
        add_bos = _post_processor_adds_bos(tj, tokens, special.get("bos"), default_add_bos)
    add_eos = tc.get("add_eos_token")
    if not isinstance(add_eos, bool):
        add_eos = False

    chat_template, named = _chat_templates(folder, tc)
    return Vocab(ggml_model, pre, tokens, [int(t) for t in types], merges, special, add_bos, add_eos,
                 chat_template, named)


def _post_processor_adds_bos(tj: dict[str, Any], tokens: list[str], bos: int | None, default: bool) -> bool:
    pp = tj.get("post_processor")
    if not isinstance(pp, dict):
        return default
    for comp in [pp, *(pp.get("processors") or [])]:
        if comp.get("type") == "TemplateProcessing":
            single = comp.get("single") or []
            first = single[0] if single else {}
            st = first.get("SpecialToken") if isinstance(first, dict) else None
            return bool(st and bos is not None and st.get("id") == tokens[bos])
    return default


def _chat_templates(folder: Path, tc: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    jinja = folder / "chat_template.jinja"
    named: dict[str, str] = {}
    templates_dir = folder / "additional_chat_templates"
    if templates_dir.is_dir():
        for f in sorted(templates_dir.glob("*.jinja")):
            named[f.stem] = f.read_text(encoding="utf-8")
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), named
    value = tc.get("chat_template")
    if isinstance(value, str):
        return value, named
    if isinstance(value, list):
        default = None
        for entry in value:
            if isinstance(entry, dict) and isinstance(entry.get("template"), str):
                if entry.get("name") == "default":
                    default = entry["template"]
                elif isinstance(entry.get("name"), str):
                    named[entry["name"]] = entry["template"]
        return default, named
    return None, named
