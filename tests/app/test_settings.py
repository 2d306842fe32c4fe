"""Chat settings (Ctrl+O), the model picker and Export (Ctrl+S) under Pilot, against the tiny
fixture models and the bundled one: focus is visible, bad numbers are named, models are chosen
from a list, exports go to a known folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dgchat.app.chat.model_switching import check_model_file
from dgchat.config import ConfigError, load_config
from dgchat.app.export import chat_markdown, default_export_dir
from dgchat.app.model_picker import ModelPicker
from dgchat.app.prompt_modal import PromptModal
from dgchat.app.settings_modal import SettingsModal
from dgchat.app.widgets.path_suggester import PathSuggester
from dgchat.assets import bundled_model_path
from fixtures.app_harness import (
    FAST_SAMPLER,
    make_app,
    setup_home,
    type_text,
    wait_for,
    wait_idle,
    wait_model,
)

SIZE = (110, 34)


@pytest.fixture
def home(tmp_path, monkeypatch, hf_home):
    return setup_home(tmp_path, monkeypatch)


def _text(widget) -> str:
    return str(widget.render())


async def _settings(pilot) -> SettingsModal:
    await pilot.press("ctrl+o")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, SettingsModal), what="the settings")
    await pilot.pause()
    return pilot.app.screen


async def _picker_ready(pilot) -> ModelPicker:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ModelPicker) and pilot.app.screen.loaded,
                   what="the model picker's list")
    await pilot.pause()
    return pilot.app.screen


def _listed(picker: ModelPicker) -> list[str]:
    return [e.title for e in picker.shown if e.kind != "heading"]


async def _query(pilot, picker: ModelPicker, text: str) -> None:
    field = picker.query_one("#picker-query")
    field.value = text
    field.cursor_position = len(text)
    await pilot.pause()


# -- settings ------------------------------------------------------------------------------------


async def test_settings_open_with_the_first_field_focused_and_focus_visible(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        modal = await _settings(pilot)
        assert app.focused is modal.query_one("#field-model")
        assert app.focused.has_pseudo_class("focus")
        assert modal.query_one("#label-model").has_class("-active")
        # the focused field looks different from the same kind of field without focus
        steps, canvas = modal.query_one("#field-steps"), modal.query_one("#field-gen_length")
        steps.focus()
        await pilot.pause()
        assert steps.has_pseudo_class("focus") and not canvas.has_pseudo_class("focus")
        assert steps.styles.background != canvas.styles.background
        assert modal.query_one("#label-steps").has_class("-active")
        assert not modal.query_one("#label-model").has_class("-active")
        # every button is reachable with Tab and shows focus
        save = modal.query_one("#save")
        blurred = save.styles.text_style
        while app.focused is not save:
            await pilot.press("tab")
        assert save.styles.text_style != blurred


async def test_letters_in_a_number_field_are_named_and_save_refuses(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        modal = await _settings(pilot)
        steps = modal.query_one("#field-steps")
        steps.focus()
        steps.value = ""
        await pilot.press("1", "x")
        await pilot.pause()
        assert steps.value == "1x"  # what was typed stays on screen
        hint = modal.query_one("#hint-steps")
        assert _text(hint) == "✗ “1x” is not a whole number, 1–8192"
        assert hint.has_class("-invalid") and steps.has_class("-invalid")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is modal
        assert _text(modal.query_one("#settings-error")) == "Steps: “1x” is not a whole number, 1–8192"
        assert app.focused is steps

        # out of range: the engine's own words, next to the field
        steps.value = "0"
        await pilot.pause()
        assert _text(hint) == "✗ steps must be a positive integer (got 0)"
        # a rule between two fields marks both
        steps.value = "8"
        modal.query_one("#field-block_length").value = "24"
        modal.query_one("#field-gen_length").value = "64"
        await pilot.pause()
        for name in ("gen_length", "block_length"):
            assert "not divisible by block length 24" in _text(modal.query_one(f"#hint-{name}"))
        modal.query_one("#field-block_length").value = "32"
        await pilot.pause()
        assert _text(hint) == "default: 8 · per canvas" and not hint.has_class("-invalid")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsModal)
        assert app.store.get_chat(app.chat_screen.chat.id).params == {"gen_length": 64, "block_length": 32}


async def test_threshold_says_what_it_does(home, llada_gguf):
    """The hint read "commit all this sure"; it says what the value does now."""
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        modal = await _settings(pilot)
        assert _text(modal.query_one("#hint-threshold")) == \
            "default: off · commit every token at least this sure"


async def test_temperature_shows_what_runs_for_each_family(home, llada_gguf):
    """A masked model samples at `temperature`; a DiffusionGemma (the bundled model) never reads it:
    its temperature anneals t_max → t_min over each canvas's steps (the status line's "T 0.8 → 0.4").
    Settings used to show "Temperature 0 · default: 0 · 0 = greedy" for it."""
    bundled = bundled_model_path()
    assert bundled is not None
    app = make_app(bundled)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        modal = await _settings(pilot)
        assert not modal.query("#field-temperature")
        assert modal.query_one("#field-t_max").value == "0.8" and modal.query_one("#field-t_min").value == "0.4"
        assert _text(modal.query_one("#label-t_max")) == "Temp. start"
        assert _text(modal.query_one("#label-t_min")) == "Temp. end"
        assert _text(modal.query_one("#hint-t_max")) == "default: 0.8 · the first step's temperature"
        assert _text(modal.query_one("#hint-t_min")) == "default: 0.4 · runs 0.8 → 0.4 over a canvas"
        # the hint follows the fields: what will run
        modal.query_one("#field-t_max").value = "1"
        await pilot.pause()
        assert _text(modal.query_one("#hint-t_min")) == "default: 0.4 · runs 1 → 0.4 over a canvas"
        # a rule between the two is named beside both
        modal.query_one("#field-t_min").value = "2"
        await pilot.pause()
        for name in ("t_max", "t_min"):
            assert _text(modal.query_one(f"#hint-{name}")).startswith("✗ need 0 <= t_min < t_max")
        modal.query_one("#field-t_min").value = "0.4"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsModal)
        chat = app.store.get_chat(app.chat_screen.chat.id)
        assert chat.params == {"t_max": 1.0}
        # the status line and the settings agree on what runs
        assert "T 1 → 0.4" in str(app.chat_screen.query_one("#status-text").render())
        assert app.chat_screen.effective_params(app.session.engine).t_max == 1.0

    masked = make_app(llada_gguf)
    async with masked.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        modal = await _settings(pilot)
        assert not modal.query("#field-t_max") and not modal.query("#field-t_min")
        assert modal.query_one("#field-temperature").value == "0"
        assert _text(modal.query_one("#hint-temperature")) == "default: 0 · 0 = greedy"


@pytest.mark.parametrize("size", [(140, 40), (80, 24), (60, 20)])
async def test_settings_fit_the_terminal(home, llada_gguf, size):
    app = make_app(llada_gguf)
    async with app.run_test(size=size) as pilot:
        await wait_model(pilot)
        modal = await _settings(pilot)
        dialog = modal.query_one("#settings").region
        assert dialog.x >= 0 and dialog.y >= 0 and dialog.right <= size[0] and dialog.bottom <= size[1]
        for button_id, label in (("save", "Save"), ("reset", "Reset to model defaults"), ("cancel", "Cancel")):
            button = modal.query_one(f"#{button_id}")
            assert dialog.contains_region(button.region), button_id
            assert button.content_region.width >= len(label), button_id  # the whole label shows
        # the last field is reachable: the form scrolls inside the dialog
        seed = modal.query_one("#field-seed")
        seed.focus()
        await pilot.pause(0.2)
        assert modal.query_one("#settings-scroll").region.contains_region(seed.region)


# -- the model picker ----------------------------------------------------------------------------


async def _wait_loaded(pilot, path: Path) -> None:
    session = pilot.app.session
    await wait_for(pilot, lambda: session.path == path and session.engine is not None and session.loading_path is None,
                   what=f"{path.name} to load")
    await pilot.pause()


def _install(model: Path, tmp_path: Path, name: str) -> Path:
    """An installed model, as `dgchat models import` leaves it (the registry in DGCHAT_HOME)."""
    from dgchat.hub import ModelManager

    copy = tmp_path / "library" / model.name
    copy.parent.mkdir(exist_ok=True)
    shutil.copy(model, copy)
    ModelManager().import_model(copy, name=name)
    return copy


async def test_picker_lists_installed_and_bundled_models_and_sets_the_chats_model(home, tmp_path, llada_gguf,
                                                                                dream_gguf):
    installed = _install(dream_gguf, tmp_path, "tiny-dream")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await type_text(pilot, "hello")
        await pilot.press("enter")
        await wait_idle(pilot)
        chat_id = app.chat_screen.chat.id
        modal = await _settings(pilot)
        await pilot.click("#choose-model")
        picker = await _picker_ready(pilot)
        listed = _listed(picker)
        # the chat's model (given with --model) first, then what the model manager has
        assert listed[0] == llada_gguf.name and picker.shown[1].in_use
        assert "tiny-dream" in listed and "dgchat tiny (bundled)" in listed
        assert "Browse for a .gguf file…" in listed
        catalog = [e for e in picker.shown if e.kind == "catalog"]
        assert catalog and all("not downloaded" in e.status for e in catalog)

        await pilot.press(*"dream")
        await pilot.pause()
        assert [e.title for e in picker.shown if e.kind == "model"] == ["tiny-dream"]
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is modal
        assert modal.query_one("#field-model").value == str(installed)
        await pilot.press("ctrl+s")
        await _wait_loaded(pilot, installed)
        assert app.store.get_chat(chat_id).model == str(installed)


async def test_model_open_command_opens_the_picker_and_switches_the_chat(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await type_text(pilot, "hello")
        await pilot.press("enter")
        await wait_idle(pilot)
        chat_id = app.chat_screen.chat.id
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"model: open")
        await pilot.pause(0.3)
        await pilot.press("enter")
        picker = await _picker_ready(pilot)
        assert picker.query_one("#picker-models").display is False  # only for a model to download
        await pilot.press(*"bundled")
        await pilot.pause()
        await pilot.press("enter")
        bundled = bundled_model_path().resolve()
        await _wait_loaded(pilot, bundled)
        assert app.store.get_chat(chat_id).model == str(bundled)


async def test_picker_says_how_to_get_a_model_that_is_not_downloaded(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        app.chat_screen.action_open_model()
        picker = await _picker_ready(pilot)
        await pilot.press(*"LLaDA 8B")
        await pilot.pause()
        assert picker.highlighted.kind == "catalog"
        assert picker.query_one("#picker-models").display is True
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is picker  # nothing chosen, nothing downloaded
        message = picker.query_one("#picker-message")
        assert "LLaDA 8B Instruct, Q4_K_M is not downloaded" in _text(message)
        assert "dgchat models pull llada-8b-instruct-q4_k_m" in _text(message)
        assert not (home / "data" / "models").exists()
        await pilot.click("#picker-models")
        from dgchat.app.models_screen import ModelsScreen

        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the Models screen")


async def test_browse_lists_folders_and_gguf_files_and_names_a_bad_file(home, tmp_path, llada_gguf):
    folder = tmp_path / "models"
    (folder / "more").mkdir(parents=True)
    (folder / "notes.txt").write_text("not a model")
    bad = folder / "broken.gguf"
    bad.write_bytes(b"GGUF but not really")
    good = folder / "good.gguf"
    shutil.copy(llada_gguf, good)
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        app.chat_screen.action_open_model()
        picker = await _picker_ready(pilot)
        await pilot.click("#picker-browse")
        await pilot.pause()
        assert picker.query_one("#picker-query").value.endswith("/")
        await _query(pilot, picker, str(folder) + "/")
        assert _listed(picker) == ["..", "more/", "broken.gguf", "good.gguf"]  # no .txt
        assert picker.highlighted.title == "broken.gguf"  # Enter takes a model file before a folder
        await _query(pilot, picker, str(folder / "mo"))
        assert _listed(picker) == ["more/"]
        await pilot.press("enter")  # a started name goes into the folder it matches
        await pilot.pause()
        assert picker.query_one("#picker-query").value == "~/models/more/"  # HOME is tmp_path
        # a started name: → completes it
        assert await PathSuggester((".gguf",)).get_suggestion(str(folder / "go")) == str(good)
        await _query(pilot, picker, str(bad))
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is picker
        message = picker.query_one("#picker-message")
        assert _text(message) == check_model_file(str(bad)) and message.has_class("-error")
        await _query(pilot, picker, str(folder / "nothing-here.gguf"))
        await pilot.press("enter")
        await pilot.pause()
        assert "No such file or folder" in _text(message)
        await _query(pilot, picker, str(good))
        await pilot.press("enter")
        await _wait_loaded(pilot, good.resolve())


# -- export --------------------------------------------------------------------------------------


async def _chat_with_answer(pilot) -> None:
    await wait_model(pilot)
    await type_text(pilot, "export me")
    await pilot.press("enter")
    await wait_idle(pilot)


async def test_export_shows_the_full_path_and_writes_into_the_configured_folder(tmp_path, monkeypatch, hf_home,
                                                                              llada_gguf):
    folder = tmp_path / "exports" / "chats"  # does not exist yet
    setup_home(tmp_path, monkeypatch, f'export_dir = "{folder}"\n' + FAST_SAMPLER)
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await _chat_with_answer(pilot)
        chat = app.chat_screen.chat
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptModal), what="the export dialog")
        dialog = app.screen
        target = folder / f"dgchat-{chat.id}-export-me.md"
        # the file's name in the box, its folder whole above it (a whole path in the box showed its end)
        assert dialog.query_one("#prompt-value").value == target.name
        assert str(folder) in _text(dialog.query_one(".dialog--help"))
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, PromptModal)
        chat = app.store.get_chat(chat.id)
        assert target.read_text(encoding="utf-8") == chat_markdown(chat, app.store.messages(chat.id))
        assert sorted(p.name for p in folder.iterdir()) == [target.name]  # no temporary file left


async def test_export_to_a_folder_that_cannot_be_made_says_so_and_keeps_the_dialog(tmp_path, monkeypatch,
                                                                                   hf_home, llada_gguf):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    setup_home(tmp_path, monkeypatch, f'export_dir = "{blocker / "exports"}"\n' + FAST_SAMPLER)
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await _chat_with_answer(pilot)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptModal), what="the export dialog")
        dialog = app.screen
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is dialog  # still open, with the path as typed
        error = _text(dialog.query_one("#prompt-error"))
        assert error == f"cannot create the folder {blocker / 'exports'}: {blocker} is a file"
        assert blocker.read_text() == "in the way"
        # another folder from the same dialog works
        elsewhere = tmp_path / "elsewhere" / "chat.md"
        dialog.query_one("#prompt-value").value = str(elsewhere)
        await pilot.press("enter")
        await pilot.pause()
        assert elsewhere.read_text(encoding="utf-8").startswith("# export me\n")


def test_export_folder_defaults_to_documents_else_the_data_folder(tmp_path, monkeypatch):
    home = setup_home(tmp_path, monkeypatch)
    assert default_export_dir() == home / "data" / "exports"
    (tmp_path / "Documents").mkdir()
    assert default_export_dir() == tmp_path / "Documents" / "dgchat"


def test_export_dir_in_the_config(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('export_dir = "~/Exports"\n')
    assert load_config(path).export_dir == str(Path("~/Exports").expanduser())
    path.write_text("export_dir = 3\n")
    with pytest.raises(ConfigError, match="export_dir must be the path of a folder"):
        load_config(path)
