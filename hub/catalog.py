"""The model catalog: assets/catalog.toml, validated into typed entries with clear errors.

An entry is a real GGUF file on the Hugging Face hub (repo + filename + revision), a Hugging Face
*checkpoint* (repo + `files` + revision: safetensors, config and tokenizer, converted and quantized
locally after the download, dgchat.hub.checkpoint), or the bundled model (`bundled = true`, no
download). Every field is documented at the top of assets/catalog.toml and in docs/MODELS.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgchat.assets import ASSETS_DIR, BUNDLED_MODEL_NAME
from dgchat.hub.errors import CatalogError
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.params import DiffusionParams
from dgchat.toml_files import TomlFileError, read_toml

SCHEMA = 1
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
FAMILIES = ("diffusion_gemma", "llada", "llada_moe", "dream", "rnd1", "block_diffusion", "tiny")
# a checkpoint's file: a plain name at the top of the repo (what convert() reads from one folder)
FILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
# sampler settings a catalog may recommend (DiffusionParams fields that describe a model, not a run);
# their types and ranges are DiffusionParams.FIELDS'
SAMPLER_KEYS = ("steps", "gen_length", "block_length", "algorithm", "eps", "temperature", "top_k", "top_p", "threshold",
                "alg_temp", "max_tokens", "cache", "entropy_bound", "t_min", "t_max", "stability_threshold",
                "confidence_threshold", "pad_bias")
_TOP_KEYS = ("schema", "models")
_ENTRY_KEYS = ("name", "title", "description", "family", "repo", "filename", "revision", "size", "size_exact",
               "sha256", "convert", "context", "rank", "bundled", "quant", "typical_steps", "arch", "sampler",
               "files", "optional_files", "checkpoint_size", "file_sha256")
_ARCH_KEYS = ("n_layer", "n_head_kv", "head_dim", "n_layer_swa", "sliding_window", "n_head_kv_full",
              "head_dim_full", "extra_bytes", "n_embd", "n_head", "n_ff", "n_vocab", "n_expert", "n_expert_used",
              "n_ff_expert", "self_cond_inter")
_SHAPE_KEYS = ("n_embd", "n_head", "n_ff", "n_vocab", "n_expert", "n_expert_used", "n_ff_expert", "self_cond_inter")
# llama-quantize's file types the speed prediction knows (dgchat.hub.speed._QUANT_MIX)
QUANTS = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q6_K", "F16", "BF16", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q3_K_M",
          "Q2_K", "IQ4_XS")
# what a checkpoint entry may be quantized to after conversion: llama.cpp's quantizer types that
# dgchat.convert.quantize.QUANT_TYPES offers and the speed prediction knows (a test holds the two)
CHECKPOINT_QUANTS = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0", "Q3_K_M",
                     "Q2_K", "IQ4_XS")


@dataclass(frozen=True)
class ArchInfo:
    """What the memory estimate (docs/MODELS.md, "Fit estimate") and the speed prediction ("Speed
    prediction": the shape's matrix sizes, 0 where unknown) need to know about the network."""

    n_layer: int
    n_head_kv: int
    head_dim: int
    n_layer_swa: int = 0  # layers with sliding-window attention (their KV holds at most sliding_window tokens)
    sliding_window: int | None = None
    n_head_kv_full: int | None = None  # full-attention layers, when they differ from the sliding ones
    head_dim_full: int | None = None
    extra_bytes: int = 0  # runtime buffers beyond weights and KV cache (e.g. logits over a large vocabulary)
    n_embd: int = 0  # hidden size
    n_head: int = 0  # query heads
    n_ff: int = 0  # dense MLP width (0: none, every layer a mixture of experts)
    n_vocab: int = 0
    n_expert: int = 0  # experts per layer (0: dense)
    n_expert_used: int = 0  # experts each token is routed to
    n_ff_expert: int = 0  # one expert's MLP width
    self_cond_inter: int = 0  # DiffusionGemma's self-conditioning MLP width

    def kv_bytes(self, context: int, bytes_per_value: int = 2) -> int:
        """K and V (f16: 2 bytes) for `context` tokens over every layer."""
        n_swa = self.n_layer_swa if self.sliding_window else 0
        n_full = self.n_layer - n_swa
        full = n_full * (self.n_head_kv_full or self.n_head_kv) * (self.head_dim_full or self.head_dim) * context
        swa = n_swa * self.n_head_kv * self.head_dim * min(context, self.sliding_window or context)
        return 2 * bytes_per_value * (full + swa)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _ARCH_KEYS if getattr(self, k) not in (None, 0) or k in
                ("n_layer", "n_head_kv", "head_dim")}


@dataclass(frozen=True)
class CatalogEntry:
    name: str  # what the user types: `dgchat models pull NAME`
    title: str
    description: str
    family: str
    repo: str | None  # None for the bundled model
    filename: str | None  # path of the file inside the repo
    revision: str
    size: int  # bytes; approximate unless size_exact
    size_exact: bool
    sha256: str | None  # None: taken from the hub's LFS etag at download time
    convert: bool  # needs `dgchat convert` after download (upstream diffusion-gemma layout)
    context: int  # tokens the memory estimate assumes
    rank: int  # higher = preferred when several fit
    arch: ArchInfo
    sampler: dict[str, Any] = field(default_factory=dict)
    bundled: bool = False
    quant: str | None = None  # llama-quantize's file type (Q4_K_M, ...); None: read from the file name
    typical_steps: float | None = None  # steps a canvas takes in practice (measured); None: unknown
    # a Hugging Face checkpoint instead of a GGUF: the repo files to fetch (`files`, all required;
    # `optional_files`, fetched when the hub has them), the download's size in bytes, and per-file
    # sha256 pins; converted and quantized to `quant` after the download (dgchat.hub.checkpoint)
    files: tuple[str, ...] = ()
    optional_files: tuple[str, ...] = ()
    checkpoint_size: int = 0
    file_sha256: dict[str, str] = field(default_factory=dict)

    @property
    def downloadable(self) -> bool:
        return not self.bundled

    @property
    def checkpoint(self) -> bool:
        """A Hugging Face checkpoint (safetensors + config + tokenizer), converted and quantized locally."""
        return bool(self.files)

    @property
    def download_size(self) -> int:
        """Bytes that come over the network: the checkpoint's, or the GGUF's."""
        return self.checkpoint_size if self.checkpoint else self.size

    @property
    def weight_files(self) -> tuple[str, ...]:
        return tuple(f for f in self.files if f.endswith(".safetensors"))

    @property
    def pinned(self) -> bool:
        """Whether the catalog fixes the exact bytes: a sha256 and a revision that is a commit hash.
        Unpinned entries are checked against what the hub itself reports (the LFS sha256 or the git
        sha1 in its ETag), which protects against a corrupt transfer but not against a changed or
        replaced upload; docs/MODELS.md ("Pinning a catalog entry") says how to pin one."""
        if self.checkpoint:
            return COMMIT_RE.match(self.revision) is not None and all(f in self.file_sha256 for f in self.files)
        return self.bundled or (self.sha256 is not None and COMMIT_RE.match(self.revision) is not None)

    @property
    def download_name(self) -> str:
        """The file name the download lands under (the repo file's base name); a checkpoint's folder."""
        if self.checkpoint:
            return f"{self.name}.checkpoint"
        assert self.filename is not None
        return self.filename.rsplit("/", 1)[-1]

    @property
    def installed_name(self) -> str:
        """The file name in the models folder: converted entries get `<stem>.dgchat.gguf`, checkpoint
        entries `<repo name>-<QUANT>.gguf`."""
        if self.bundled:
            return BUNDLED_MODEL_NAME
        if self.checkpoint:
            assert self.repo is not None and self.quant is not None
            return f"{self.repo.rsplit('/', 1)[-1]}-{self.quant}.gguf"
        name = self.download_name
        if self.convert:
            stem = name[:-5] if name.lower().endswith(".gguf") else name
            return f"{stem}.dgchat.gguf"
        return name

    def sampler_params(self):  # -> DiffusionParams (imported lazily: no numpy at catalog load)
        return DiffusionParams(**self.sampler)


@dataclass(frozen=True)
class Catalog:
    entries: tuple[CatalogEntry, ...]
    path: Path

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, name: str) -> CatalogEntry | None:
        key = name.strip().lower()
        for e in self.entries:
            if e.name == key:
                return e
        return None

    def get(self, name: str) -> CatalogEntry:
        entry = self.find(name)
        if entry is None:
            raise CatalogError(f"no model named {name!r} in the catalog (known: {', '.join(self.names())})")
        return entry

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    @property
    def bundled(self) -> CatalogEntry:
        return next(e for e in self.entries if e.bundled)

    def by_file(self, repo: str, filename: str) -> CatalogEntry | None:
        for e in self.entries:
            if e.repo == repo and e.filename == filename:
                return e
        return None


def default_catalog_path() -> Path:
    return ASSETS_DIR / "catalog.toml"


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read and validate a catalog (default: the shipped assets/catalog.toml)."""
    path = Path(path) if path is not None else default_catalog_path()
    try:  # a regular file of bounded size and nesting (dgchat.toml_files)
        raw = read_toml(path)
    except TomlFileError as exc:
        if exc.kind == "missing":
            raise CatalogError(f"model catalog not found: {path}") from None
        raise CatalogError(f"{path}: {exc}") from None
    return parse_catalog(raw, path)


def parse_catalog(raw: dict[str, Any], path: Path) -> Catalog:
    for key in raw:
        if key not in _TOP_KEYS:
            raise CatalogError(f"{path}: unknown top-level key {key!r} (known: {', '.join(_TOP_KEYS)})")
    if raw.get("schema") != SCHEMA:
        raise CatalogError(f"{path}: schema must be {SCHEMA} (got {raw.get('schema')!r})")
    models = raw.get("models")
    if not isinstance(models, list) or not models:
        raise CatalogError(f"{path}: no [[models]] entries")
    entries: list[CatalogEntry] = []
    seen: set[str] = set()
    files: set[tuple[str, str]] = set()
    for i, item in enumerate(models):
        if not isinstance(item, dict):
            raise CatalogError(f"{path}: models[{i}] must be a table")
        entry = _entry(item, path, i)
        if entry.name in seen:
            raise CatalogError(f"{path}: model name {entry.name!r} appears twice")
        seen.add(entry.name)
        if entry.repo is not None and entry.filename is not None:
            if (entry.repo, entry.filename) in files:
                raise CatalogError(f"{path}: model {entry.name}: {entry.repo}/{entry.filename} is listed twice")
            files.add((entry.repo, entry.filename))
        if entry.checkpoint:  # two entries would convert into the same file
            key = (entry.repo or "", f"checkpoint {entry.quant}")
            if key in files:
                raise CatalogError(f"{path}: model {entry.name}: the checkpoint {entry.repo} at {entry.quant} is "
                                   "listed twice")
            files.add(key)
        entries.append(entry)
    n_bundled = sum(e.bundled for e in entries)
    if n_bundled != 1:
        raise CatalogError(f"{path}: exactly one entry must be the bundled model (bundled = true); found {n_bundled}")
    return Catalog(tuple(entries), path)


class _Table:
    """Typed access to one TOML table with errors that name the file, the entry and the key."""

    def __init__(self, data: dict[str, Any], where: str, known: tuple[str, ...]) -> None:
        self.data = data
        self.where = where
        for key in data:
            if key not in known:
                raise CatalogError(f"{where}: unknown key {key!r} (known: {', '.join(known)})")

    def fail(self, key: str, what: str) -> CatalogError:
        value = self.data.get(key)
        return CatalogError(f"{self.where}: {key} must be {what} (got {value!r})")

    def str(self, key: str, required: bool = True, default: str | None = None) -> str | None:
        if key not in self.data:
            if required:
                raise CatalogError(f"{self.where}: missing key {key!r}")
            return default
        value = self.data[key]
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "a non-empty string")
        return value.strip()

    def int(self, key: str, required: bool = True, default: int | None = None, lo: int = 0) -> int | None:
        if key not in self.data:
            if required:
                raise CatalogError(f"{self.where}: missing key {key!r}")
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise self.fail(key, f"an integer >= {lo}")
        return value

    def bool(self, key: str, default: bool = False) -> bool:
        if key not in self.data:
            return default
        value = self.data[key]
        if not isinstance(value, bool):
            raise self.fail(key, "true or false")
        return value


def _entry(item: dict[str, Any], path: Path, index: int) -> CatalogEntry:
    label = item.get("name") if isinstance(item.get("name"), str) else f"models[{index}]"
    t = _Table(item, f"{path}: model {label}", _ENTRY_KEYS)
    name = t.str("name")
    assert name is not None
    if not NAME_RE.match(name):
        raise t.fail("name", "lower-case letters, digits, '.', '_' or '-' (at most 80, starting with a letter "
                             "or digit)")
    bundled = t.bool("bundled")
    checkpoint = "files" in item
    repo = t.str("repo", required=not bundled)
    filename = t.str("filename", required=not (bundled or checkpoint))
    if bundled and (repo is not None or filename is not None or checkpoint):
        raise CatalogError(f"{t.where}: the bundled model has no repo, filename or files (it ships with dgchat)")
    if checkpoint and filename is not None:
        raise CatalogError(f"{t.where}: give either filename (a GGUF) or files (a checkpoint to convert), not both")
    if repo is not None and not REPO_RE.match(repo):
        raise t.fail("repo", "'owner/name' as on the hub")
    if filename is not None:
        parts = filename.split("/")
        if filename.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in filename:
            raise t.fail("filename", "a relative path inside the repo")
        if not filename.lower().endswith(".gguf"):
            raise t.fail("filename", "a .gguf file")
    family = t.str("family")
    if family not in FAMILIES:
        raise t.fail("family", "one of " + ", ".join(FAMILIES))
    sha = t.str("sha256", required=False)
    if sha is not None:
        sha = sha.lower()
        if not SHA256_RE.match(sha):
            raise t.fail("sha256", "64 hexadecimal digits")
    convert = t.bool("convert")
    if convert and bundled:
        raise CatalogError(f"{t.where}: the bundled model cannot need conversion")
    if checkpoint and (convert or sha is not None):
        key = "convert" if convert else "sha256"
        raise CatalogError(f"{t.where}: {key} is for a GGUF entry; a checkpoint is always converted, and its "
                           "files are pinned in [models.file_sha256]")
    files, optional, file_sha = _checkpoint_files(t, item) if checkpoint else ((), (), {})
    for key in ("optional_files", "checkpoint_size", "file_sha256"):
        if key in item and not checkpoint:
            raise CatalogError(f"{t.where}: {key} belongs to a checkpoint entry (one with files = [...])")
    arch_raw = item.get("arch")
    if not isinstance(arch_raw, dict):
        raise CatalogError(f"{t.where}: missing [models.arch] table (n_layer, n_head_kv, head_dim)")
    a = _Table(arch_raw, f"{t.where}: arch", _ARCH_KEYS)
    arch = ArchInfo(
        n_layer=a.int("n_layer", lo=1), n_head_kv=a.int("n_head_kv", lo=1), head_dim=a.int("head_dim", lo=1),
        n_layer_swa=a.int("n_layer_swa", required=False, default=0), sliding_window=a.int(
            "sliding_window", required=False, lo=1),
        n_head_kv_full=a.int("n_head_kv_full", required=False, lo=1),
        head_dim_full=a.int("head_dim_full", required=False, lo=1),
        extra_bytes=a.int("extra_bytes", required=False, default=0),
        **{k: a.int(k, required=False, default=0) for k in _SHAPE_KEYS},
    )  # type: ignore[arg-type]
    if arch.n_expert_used > arch.n_expert:
        raise a.fail("n_expert_used", f"at most n_expert ({arch.n_expert})")
    if arch.n_expert and not (arch.n_expert_used and arch.n_ff_expert):
        raise CatalogError(f"{a.where}: n_expert needs n_expert_used and n_ff_expert")
    quant = t.str("quant", required=checkpoint)
    if quant is not None and quant.upper() not in QUANTS:
        raise t.fail("quant", "one of " + ", ".join(QUANTS))
    if checkpoint and quant is not None and quant.upper() not in CHECKPOINT_QUANTS:
        raise t.fail("quant", "a type a checkpoint is quantized to: " + ", ".join(CHECKPOINT_QUANTS))
    checkpoint_size = t.int("checkpoint_size", required=checkpoint, default=0, lo=1) or 0
    typical = item.get("typical_steps")
    if typical is not None and (isinstance(typical, bool) or not isinstance(typical, (int, float))
                                or not 1 <= typical <= 8192):
        raise t.fail("typical_steps", "a number of steps between 1 and 8192")
    if arch.n_layer_swa > arch.n_layer:
        raise a.fail("n_layer_swa", f"at most n_layer ({arch.n_layer})")
    if arch.n_layer_swa and not arch.sliding_window:
        raise CatalogError(f"{a.where}: n_layer_swa needs sliding_window")
    sampler = _sampler(item.get("sampler", {}), f"{t.where}: sampler")
    return CatalogEntry(
        name=name, title=t.str("title") or name, description=t.str("description") or "", family=family,
        repo=repo, filename=filename, revision=t.str("revision", required=False, default="main") or "main",
        size=t.int("size", lo=1) or 0, size_exact=t.bool("size_exact"), sha256=sha, convert=convert,
        context=t.int("context", lo=64) or 0, rank=t.int("rank", required=False, default=0) or 0, arch=arch,
        sampler=sampler, bundled=bundled, quant=quant.upper() if quant else None,
        typical_steps=float(typical) if typical is not None else None,
        files=files, optional_files=optional, checkpoint_size=checkpoint_size, file_sha256=file_sha,
    )


def _names(t: _Table, key: str, required: bool) -> tuple[str, ...]:
    raw = t.data.get(key, [] if not required else None)
    if not isinstance(raw, list) or (required and not raw):
        raise t.fail(key, "a list of file names" + (" (at least one)" if required else ""))
    out: list[str] = []
    for name in raw:
        if not isinstance(name, str) or not FILE_NAME_RE.match(name) or name in (".", ".."):
            raise CatalogError(f"{t.where}: {key} must list plain file names at the top of the repo (got {name!r})")
        if name in out:
            raise CatalogError(f"{t.where}: {key} lists {name!r} twice")
        out.append(name)
    return tuple(out)


def _checkpoint_files(t: _Table, item: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """A checkpoint entry's `files`, `optional_files` and `file_sha256`: what convert() needs is there
    (config.json, tokenizer.json, the safetensors weights and, for shards, their index)."""
    files = _names(t, "files", required=True)
    optional = _names(t, "optional_files", required=False)
    both = sorted(set(files) & set(optional))
    if both:
        raise CatalogError(f"{t.where}: {both[0]!r} is in both files and optional_files")
    if any(f.endswith((".py", ".bin", ".pt", ".pth", ".pkl", ".ckpt")) for f in (*files, *optional)):
        raise CatalogError(f"{t.where}: files may list safetensors, JSON, text and template files only (no code, "
                           "no pickled weights)")
    for need in ("config.json", "tokenizer.json"):
        if need not in files:
            raise CatalogError(f"{t.where}: files must include {need} (the converter reads it)")
    weights = [f for f in files if f.endswith(".safetensors")]
    if not weights:
        raise CatalogError(f"{t.where}: files must include the weights (model.safetensors, or the shards and "
                           "model.safetensors.index.json)")
    if len(weights) > 1 and "model.safetensors.index.json" not in files:
        raise CatalogError(f"{t.where}: files lists {len(weights)} safetensors shards but not "
                           "model.safetensors.index.json")
    raw = item.get("file_sha256", {})
    if not isinstance(raw, dict):
        raise t.fail("file_sha256", "a table of file name = sha256")
    pins: dict[str, str] = {}
    for name, value in raw.items():
        if name not in files and name not in optional:
            raise CatalogError(f"{t.where}: file_sha256 names {name!r}, which files does not list")
        if not isinstance(value, str) or not SHA256_RE.match(value.strip().lower()):
            raise CatalogError(f"{t.where}: file_sha256.{name} must be 64 hexadecimal digits (got {value!r})")
        pins[name] = value.strip().lower()
    return files, optional, pins


def _sampler(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: must be a table")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in SAMPLER_KEYS:
            raise CatalogError(f"{where}: unknown key {key!r} (known: {', '.join(SAMPLER_KEYS)})")
        spec = DiffusionParams.FIELDS[key]
        if not spec.has_type(value):
            raise CatalogError(f"{where}: {key} must be {spec.type_text} (got {value!r})")
        out[key] = float(value) if spec.kind is float else value

    try:
        DiffusionParams(**out).validate()
    except InvalidParameterError as exc:
        raise CatalogError(f"{where}: {exc}") from None
    return out
