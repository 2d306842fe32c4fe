"""The NPC workshop screen under Pilot, against the real tiny fixture model: cards created, edited
and validated in the app; variants generated (one batch, distinct seeds), kept / rejected and
exported (the file validates against the shipped schema); template text byte-identical in the UI;
the live canvas while denoising; stop; snapshots."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

from fixtures.app_harness import make_app, wait_for, wait_model

from dgchat.model_backend.events import StepEvent
from dgchat.npc.cards import load_card_file
from dgchat.npc.export import load_schema, read_csv_lines
from dgchat.npc.schema_check import schema_errors
from dgchat.npc.templates import parse_template

SIZE = (110, 34)
GUARD = '''id = "gate_guard"
name = "Captain Brann"
role = "the night captain of the city gate"
voice = "Gruff, clipped sentences."
examples = ["Move along, traveller."]
'''
TEMPLATE = "Halt, {player}! None may pass the {___:2} after dark."


def _cards_dir(home: Path) -> Path:
    folder = home / "data" / "npc" / "cards"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def _open(pilot):
    from dgchat.app.npc_screen import NpcScreen

    await wait_model(pilot)
    await pilot.press("f3")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, NpcScreen), what="the workshop")
    await pilot.pause()
    return pilot.app.screen


async def _set(pilot, screen, widget_id: str, value: str) -> None:
    screen.query_one(f"#{widget_id}").value = value
    await pilot.pause()


async def _generate(pilot, screen) -> None:
    n = len(screen.batches)
    await pilot.press("ctrl+g")
    await wait_for(pilot, lambda: screen.job is None and len(screen.batches) > n, 30, "the variants")
    await pilot.pause()


class GatedBatchEngine:
    """A real engine whose generate_batch holds once every sequence has reached `hold_at` steps
    (until released or cancelled), with fixed elapsed times: deterministic mid-generation views."""

    def __init__(self, engine, hold_at: int) -> None:
        self._engine = engine
        self.hold_at = hold_at
        self.release = threading.Event()
        self.holding = threading.Event()

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate_batch(self, prompts, params, *, cancel=None, **kwargs):
        n = len(prompts)
        for i, event in self._engine.generate_batch(prompts, params, cancel=cancel, **kwargs):
            if isinstance(event, StepEvent):
                event = dataclasses.replace(event, elapsed_s=0.05 * event.step)
            yield i, event
            if isinstance(event, StepEvent) and i == n - 1 and event.step >= self.hold_at:
                self.holding.set()
                deadline = time.monotonic() + 15.0
                while not self.release.is_set() and not (cancel is not None and cancel.is_set()):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)


async def test_cards_are_created_edited_and_validated_in_the_app(home, llada_gguf):
    folder = _cards_dir(home)
    (folder / "broken.toml").write_text('name = "Nobody"\nmood = "grim"\n', encoding="utf-8")
    (folder / "town.toml").write_text(
        '[[card]]\nid = "baker"\nname = "Mira the Baker"\n\n[[card]]\nid = "smith"\nname = "Old Tom"\n',
        encoding="utf-8")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        from dgchat.app.npc_card_modal import CardModal

        # a broken file is named with its problem; the other file's cards are still there
        errors = str(screen.query_one("#npc-card-errors").render())
        assert "broken.toml" in errors and "unknown key `mood`" in errors
        assert [c.id for c in screen.shelf.cards] == ["baker", "smith"]

        # a new card: validation errors are shown in the dialog and nothing is written
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: isinstance(app.screen, CardModal))
        modal = app.screen
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert str(modal.query_one("#card-error").render()) == "card: `name` is empty"
        await _set(pilot, modal, "card-name", "Captain Brann")
        await _set(pilot, modal, "card-id", "gate guard!")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "may hold only letters, digits" in str(modal.query_one("#card-error").render())
        await _set(pilot, modal, "card-id", "baker")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "already used by another card" in str(modal.query_one("#card-error").render())
        await _set(pilot, modal, "card-id", "")
        await _set(pilot, modal, "card-role", "the night captain")
        modal.query_one("#card-examples").text = "Move along, traveller.\n\nGate's shut till dawn.\n"
        await _set(pilot, modal, "card-banned", "okay, OKAY")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "banned word 'okay' is listed twice" in str(modal.query_one("#card-error").render())
        assert not (folder / "captain_brann.toml").exists()
        await _set(pilot, modal, "card-banned", "okay, dude")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.screen is screen)
        [card] = load_card_file(folder / "captain_brann.toml")
        assert (card.id, card.name, card.role) == ("captain_brann", "Captain Brann", "the night captain")
        assert card.examples == ("Move along, traveller.", "Gate's shut till dawn.")
        assert card.banned_words == ("okay", "dude")
        assert screen.current_card.id == "captain_brann"

        # editing a card of a [[card]] file rewrites it there and keeps its neighbour
        cards = screen.query_one("#npc-cards")
        cards.highlighted = [c.id for c in cards.cards].index("smith")
        cards.focus()
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, CardModal))
        modal = app.screen
        assert modal.query_one("#card-name").value == "Old Tom"
        modal.query_one("#card-role").value = "the smith on Anvil Lane"
        modal.query_one("#card-voice").text = "Slow, kind."
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.screen is screen)
        baker, smith = load_card_file(folder / "town.toml")
        assert baker.name == "Mira the Baker" and baker.role == ""
        assert (smith.id, smith.role, smith.voice) == ("smith", "the smith on Anvil Lane", "Slow, kind.")
        assert screen.current_card.id == "smith"

        # cancel leaves the file alone
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, CardModal))
        await _set(pilot, app.screen, "card-name", "Changed")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is screen)
        assert load_card_file(folder / "town.toml")[1].name == "Old Tom"


async def test_variants_keep_reject_export_and_reproduce(home, llada_gguf, tmp_path):
    (_cards_dir(home) / "guard.toml").write_text(GUARD, encoding="utf-8")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        await _set(pilot, screen, "npc-context", "gate_night")
        await _set(pilot, screen, "npc-template", TEMPLATE)
        # the variables editor follows the template's slots; a slot without a value is named
        assert [i.id for i in screen.query("#npc-vars-grid Input")] == ["npc-var-player"]
        await _set(pilot, screen, "npc-count", "3")
        await _set(pilot, screen, "npc-seed", "5")
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert "the variable {player} has no value" in str(screen.query_one("#npc-spec-error").render())
        assert screen.job is None and not screen.batches
        await _set(pilot, screen, "npc-var-player", "Aria")
        await _generate(pilot, screen)

        [batch] = screen.batches
        assert [v.seed for v in batch.variants] == [5, 6, 7]
        assert len({tuple(v.tokens) for v in batch.variants}) > 1  # different seeds, different lines
        views = list(screen.query("VariantView"))
        assert len(views) == 3
        filled = parse_template(TEMPLATE).fill({"player": "Aria"})
        for view, variant in zip(views, batch.variants):
            shown = view.query_one(".variant--text").render().plain
            assert shown == variant.text  # what the UI shows is the line
            # the fixed text of the template is byte-identical around the filled hole
            head, tail = filled.parts[0], filled.parts[2]
            assert shown.encode().startswith(head.encode()) and shown.encode().endswith(tail.encode())
            assert shown == head + variant.holes[0].text + tail
            assert variant.holes[0].tokens == 2

        # keep #1, reject #2 (keys on the focused variant), leave #3
        assert app.focused is views[0]
        await pilot.press("k")
        await pilot.press("down")
        await pilot.press("x")
        await pilot.pause()
        assert [v.status for v in batch.variants] == ["kept", "rejected", "new"]
        assert "kept" in str(views[0].query_one(".variant--head").render())
        assert views[1].has_class("-rejected")

        # export: JSON that validates against the shipped schema, then CSV with the same records
        from dgchat.app.prompt_modal import PromptModal

        out = tmp_path / "exports" / "lines.json"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptModal))
        app.screen.query_one("#prompt-value").value = str(out)
        await pilot.press("enter")
        await wait_for(pilot, out.exists)
        document = json.loads(out.read_text(encoding="utf-8"))
        assert schema_errors(document, load_schema()) == []
        [line] = document["lines"]
        assert (line["text"], line["seed"], line["context"], line["character"]) == (
            batch.variants[0].text, 5, "gate_night", "gate_guard")
        assert line["template"] == TEMPLATE and line["variables"] == {"player": "Aria"}
        assert document["model"]["file"] == llada_gguf.name
        csv_path = tmp_path / "exports" / "lines.csv"
        assert screen.export_to(csv_path) == csv_path
        with csv_path.open(encoding="utf-8", newline="") as handle:
            assert read_csv_lines(handle.read()) == document["lines"]

        # the same seed and model give the same lines
        await _generate(pilot, screen)
        again = screen.batches[-1]
        assert [v.text for v in again.variants] == [v.text for v in batch.variants]
        assert [v.tokens for v in again.variants] == [v.tokens for v in batch.variants]

        # a free line: the length preset is the canvas; two variants with distinct seeds
        await _set(pilot, screen, "npc-template", "")
        assert not screen.query_one("#npc-length").disabled
        screen.query_one("#npc-length").value = "bark"
        await _set(pilot, screen, "npc-count", "2")
        await _set(pilot, screen, "npc-seed", "0")
        await _generate(pilot, screen)
        free = screen.batches[-1]
        assert free.spec.template is None and free.settings["canvas_tokens"] == 12
        assert [v.seed for v in free.variants] == [0, 1]
        assert all(len(v.tokens) <= 12 for v in free.variants)


async def test_the_export_is_one_file_by_its_extension_as_the_docs_say(home, llada_gguf, tmp_path):
    """README said Ctrl+S "exports the kept lines as JSON and CSV"; the dialog writes one file, in the
    format its name asks for (as `dgchat npc --out` does). The docs now say what the app does."""
    from dgchat.app.prompt_modal import PromptModal

    (_cards_dir(home) / "guard.toml").write_text(GUARD, encoding="utf-8")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        await _set(pilot, screen, "npc-count", "1")
        await _generate(pilot, screen)
        screen.query_one("VariantView").focus()
        await pilot.press("k")
        folder = tmp_path / "exports"
        written: set[str] = set()
        for name in ("lines.csv", "lines.json"):
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, PromptModal))
            help_text = str(app.screen.query_one(".dialog--help").render())
            assert "JSON or CSV by the file's extension" in help_text
            app.screen.query_one("#prompt-value").value = str(folder / name)
            await pilot.press("enter")
            await wait_for(pilot, (folder / name).exists)
            written.add(name)
            assert {p.name for p in folder.iterdir()} == written  # that one file, nothing beside it
        assert json.loads((folder / "lines.json").read_text(encoding="utf-8"))["format"] == "dgchat-npc-lines"
        assert read_csv_lines((folder / "lines.csv").read_text(encoding="utf-8"))[0]["character"] == "gate_guard"

    root = Path(__file__).parents[2]
    readme = (root / "README.md").read_text(encoding="utf-8")
    said = " ".join(readme.split("F3 opens the NPC workshop", 1)[1].split("F5 opens Drafting", 1)[0].split())
    assert "Ctrl+S exports the kept lines as JSON or CSV (one file, by its extension)" in said
    assert "JSON and CSV" not in readme
    npc_doc = " ".join((root / "docs" / "NPC.md").read_text(encoding="utf-8").split())
    assert "Ctrl+S exports the kept lines to one file: JSON or CSV by the file name's extension" in npc_doc


async def test_variants_denoise_live_and_stop(home, llada_gguf):
    (_cards_dir(home) / "guard.toml").write_text(GUARD, encoding="utf-8")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        app.session.engine = gated = GatedBatchEngine(app.session.engine, hold_at=2)
        await _set(pilot, screen, "npc-count", "2")
        screen.query_one("#npc-length").value = "bark"
        await pilot.press("ctrl+g")
        await wait_for(pilot, gated.holding.is_set, what="the first steps")
        canvases = list(screen.query("VariantCanvas"))
        await wait_for(pilot, lambda: all(c.event is not None and c.event.step == 2 for c in canvases))
        assert len(canvases) == 2
        for canvas in canvases:
            # undecided positions are placeholders, each variant its own canvas
            assert canvas.event.canvas.tokens.size == 12
            assert "·" in "".join(strip.text for strip in canvas._strips[1:])
        assert "step 2/12" in canvases[0]._strips[0].text
        assert app.session.busy
        # the model cannot be switched while the workshop uses it
        assert app.session.load(Path("elsewhere.gguf")) is False
        t0 = time.monotonic()
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.job is None, 10, "the stop")
        assert time.monotonic() - t0 < 5
        assert not screen.batches and not screen.query("BatchView")
        assert app.screen is screen  # Esc stopped the run; it did not leave the screen
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is not screen


async def test_an_empty_seed_draws_new_seeds_each_batch_and_a_typed_seed_repeats(home, llada_gguf, monkeypatch,
                                                                                 tmp_path):
    """Issue 43, item 1: a second Ctrl+G gave the same lines (the Seed field said 0). Empty, it draws a
    new first seed for each batch, shown in the title and on each variant and recorded in the export;
    the drawn seed typed back in gives those lines again."""
    from dgchat.model_backend import param_resolution

    seeds = iter([100, 500])  # apart, so that the two batches share no variant seed
    drawn: list[int] = []

    def draw() -> int:
        drawn.append(next(seeds))
        return drawn[-1]

    monkeypatch.setattr(param_resolution, "draw_seed", draw)
    (_cards_dir(home) / "guard.toml").write_text(GUARD, encoding="utf-8")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        seed_field = screen.query_one("#npc-seed")
        assert seed_field.value == "" and seed_field.placeholder == "random"
        screen.query_one("#npc-length").value = "bark"
        await _set(pilot, screen, "npc-count", "3")
        await _generate(pilot, screen)
        await _generate(pilot, screen)
        first, second = screen.batches
        assert [v.seed for v in first.variants] == [100, 101, 102]
        assert [v.seed for v in second.variants] == [500, 501, 502]
        assert [v.text for v in first.variants] != [v.text for v in second.variants]
        assert seed_field.value == ""  # the field stays empty: the next batch draws again
        titles = [str(t.render()) for t in screen.query(".batch--title")]
        assert titles[0].endswith("random seeds 100–102") and titles[1].endswith("random seeds 500–502")
        heads = [str(h.render()) for h in screen.query(".variant--head")]
        assert heads[3].startswith("#1 · seed 500")

        # the seed a kept line was made with is in the export
        views = list(screen.query("VariantView"))
        views[4].focus()
        await pilot.press("k")
        out = screen.export_to(tmp_path / "lines.json")
        [line] = json.loads(out.read_text(encoding="utf-8"))["lines"]
        assert (line["seed"], line["text"]) == (501, second.variants[1].text)

        # a typed seed is the person's choice: kept, and the same lines every time
        await _set(pilot, screen, "npc-seed", "500")
        await _generate(pilot, screen)
        await _generate(pilot, screen)
        for again in screen.batches[2:]:
            assert [v.seed for v in again.variants] == [500, 501, 502]
            assert [v.text for v in again.variants] == [v.text for v in second.variants]
        titles = [str(t.render()) for t in screen.query(".batch--title")]
        assert titles[2].endswith(" · seeds 500–502") and "random" not in titles[2]
    assert drawn == [100, 500]  # one draw per empty-seed batch; none for a typed seed


async def test_a_stale_form_problem_goes_once_fixed(home, llada_gguf):
    """Issue 43, item 12: `no character: create one first (Ctrl+N)` stayed on screen after a
    character was created, until the next Ctrl+G. A problem Ctrl+G found in the form is checked
    again as the form or the characters change; the header forgets a deleted character."""
    from dgchat.app.confirm_modal import ConfirmModal
    from dgchat.app.npc_card_modal import CardModal

    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        problem = screen.query_one("#npc-spec-error")

        def shown() -> str:
            return "" if problem.has_class("-empty") else str(problem.render())

        await pilot.press("ctrl+g")
        await pilot.pause()
        assert shown() == "no character: create one first (Ctrl+N)"
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: isinstance(app.screen, CardModal))
        await _set(pilot, app.screen, "card-name", "Captain Brann")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.screen is screen)
        await pilot.pause()
        assert screen.current_card is not None and shown() == ""
        assert screen.sub_title == "Captain Brann"

        # a variable without a value: named at Ctrl+G, gone once it has one; a template without a
        # problem of its own does not hide it
        await _set(pilot, screen, "npc-template", TEMPLATE)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert shown() == "the variable {player} has no value" and screen.job is None
        await _set(pilot, screen, "npc-template", "Halt, {player}! {___:3}")
        assert shown() == "the variable {player} has no value"
        await _set(pilot, screen, "npc-var-player", "Aria")
        assert shown() == ""
        # a field typed wrong, then right
        await _set(pilot, screen, "npc-count", "x")
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert shown() == "Variants: enter a whole number (got 'x')"
        await _set(pilot, screen, "npc-count", "")
        assert shown() == "Variants: enter a whole number (got '')"  # what is still wrong
        await _set(pilot, screen, "npc-count", "2")
        assert shown() == ""

        # the last character deleted: the header no longer names it
        screen.query_one("#npc-cards").focus()
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal))
        await pilot.press("y")
        await wait_for(pilot, lambda: app.screen is screen)
        await pilot.pause()
        assert screen.current_card is None and screen.sub_title == ""


def _snapshot_cards(home: Path) -> None:
    (_cards_dir(home) / "guard.toml").write_text(GUARD, encoding="utf-8")
    (_cards_dir(home) / "baker.toml").write_text('name = "Mira the Baker"\nrole = "the baker on Market Street"\n',
                                                 encoding="utf-8")


def test_snapshot_workshop_with_kept_and_rejected_variants(snap_compare, home, llada_gguf):
    _snapshot_cards(home)

    async def run_before(pilot):
        screen = await _open(pilot)
        screen.query_one("#npc-cards").highlighted = 1  # Captain Brann (sorted by file name)
        await _set(pilot, screen, "npc-context", "gate_night")
        await _set(pilot, screen, "npc-template", TEMPLATE)
        await _set(pilot, screen, "npc-var-player", "Aria")
        await _set(pilot, screen, "npc-count", "3")
        await _generate(pilot, screen)
        await pilot.press("k", "down", "x", "down")
        await pilot.pause(0.1)

    assert snap_compare(make_app(llada_gguf), terminal_size=SIZE, run_before=run_before)


def test_snapshot_workshop_mid_generation(snap_compare, home, llada_gguf):
    _snapshot_cards(home)

    async def run_before(pilot):
        screen = await _open(pilot)
        screen.query_one("#npc-cards").highlighted = 1
        app = pilot.app
        app.session.engine = gated = GatedBatchEngine(app.session.engine, hold_at=3)
        await _set(pilot, screen, "npc-template", "Halt, {player}! {___:6} after dark.")
        await _set(pilot, screen, "npc-var-player", "Aria")
        await _set(pilot, screen, "npc-count", "3")
        await pilot.press("ctrl+g")
        await wait_for(pilot, gated.holding.is_set)
        canvases = list(screen.query("VariantCanvas"))
        await wait_for(pilot, lambda: all(c.event is not None and c.event.step == 3 for c in canvases))
        await pilot.pause(0.1)

    assert snap_compare(make_app(llada_gguf), terminal_size=SIZE, run_before=run_before)


def test_snapshot_card_editor_with_an_error(snap_compare, home, llada_gguf):
    _snapshot_cards(home)

    async def run_before(pilot):
        screen = await _open(pilot)
        screen.query_one("#npc-cards").highlighted = 1
        await pilot.press("ctrl+o")
        await pilot.pause()
        modal = pilot.app.screen
        modal.query_one("#card-banned").value = "okay, Okay"
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)

    assert snap_compare(make_app(llada_gguf), terminal_size=SIZE, run_before=run_before)
