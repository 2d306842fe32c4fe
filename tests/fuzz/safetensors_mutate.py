"""Mutations of a Hugging Face checkpoint folder for the converter's fuzz target.

The seed is a tiny real checkpoint (tests/fixtures/convert_tiny.py). A case copies it and changes
one of: the safetensors header (shapes, offsets, dtypes, the JSON's own type, the length prefix),
the shard index's weight_map (names outside the folder, non-strings), or config.json (sizes that
drive loops and allocations).
"""

from __future__ import annotations

import json
import random
import shutil
import struct
from pathlib import Path

_HUGE = [2**62, 2**63 - 1, 2**64, -1, -(2**62), 0, 10**30, 1.5, "7", None, True, [], {}]


def _read_st(path: Path) -> tuple[dict | list | str, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_st(path: Path, header: object, data: bytes, *, length: int | None = None) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob) if length is None else length) + blob + data)


def mutate_folder(seed: Path, dest: Path, rng: random.Random) -> None:
    """Write a mutated copy of the checkpoint folder `seed` to `dest`."""
    shutil.copytree(seed, dest)
    st = dest / "model.safetensors"
    header, data = _read_st(st)
    names = [k for k in header if k != "__metadata__"]
    op = rng.randrange(14)
    if op == 0:  # a shape that overflows int64 arithmetic, or a negative / odd one
        name = rng.choice(names)
        header[name]["shape"] = rng.choice([[2**62, 4], [2**63, 2], [-4, -8], [2**32, 2**32], [0, 5], ["4", 4],
                                            [1.5], [4] * 40, "abc", None])
        if rng.random() < 0.5:
            header[name]["data_offsets"] = [0, 0]
    elif op == 1:  # offsets: negative, reversed, past the end, huge, not a pair
        name = rng.choice(names)
        header[name]["data_offsets"] = rng.choice([[-8, 0], [16, 8], [0, 2**63], [2**64, 2**64 + 4], [0], "0-4",
                                                   [0, len(data) + 4], [1.5, 9.5], None])
    elif op == 2:
        header[rng.choice(names)]["dtype"] = rng.choice(["F64", "I8", "", None, 3, "BF16", "F16"])
    elif op == 3:  # the header is not an object
        header = rng.choice([[1, 2, 3], "text", 42, None, [header]])
    elif op == 4:
        header[rng.choice(names)] = rng.choice([[], "x", 5, None, {"dtype": "F32"}])
    elif op == 5:  # the length prefix lies
        _write_st(st, header, data, length=rng.choice([0, 1, 2**63, 2**64 - 1, len(json.dumps(header)) + 5]))
        return
    elif op == 6:  # an embedding that claims a vocabulary of 2^62 rows (the loop-driver of the finding)
        emb = next((n for n in names if "embed" in n or "wte" in n), names[0])
        header[emb]["shape"] = [2**62, header[emb]["shape"][-1]]
        header[emb]["data_offsets"] = [0, 0]
    elif op == 7:  # shards with names outside the folder
        index = {"metadata": {}, "weight_map": {n: rng.choice(["../../../../etc/passwd", "/etc/passwd",
                                                              "../" + seed.name + "/model.safetensors",
                                                              "sub/../../x.safetensors", "model.safetensors",
                                                              "\x00", 5, ""]) for n in names}}
        (dest / "model.safetensors.index.json").write_text(json.dumps(index))
    elif op == 8:
        (dest / "model.safetensors.index.json").write_text(rng.choice(["[]", "{}", '{"weight_map": []}',
                                                                       '{"weight_map": {"a": null}}', "nul"]))
    elif op == 9:  # config sizes
        config = json.loads((dest / "config.json").read_text())
        key = rng.choice([k for k, v in config.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
                         or list(config))
        config[key] = rng.choice(_HUGE)
        (dest / "config.json").write_text(json.dumps(config))
    elif op == 10:
        (dest / "config.json").write_text(rng.choice(["[]", "1", '"x"', "{", '{"architectures": 5}', ""]))
    elif op == 11:  # a symlinked shard pointing outside the folder
        outside = dest.parent / f"outside-{rng.randrange(10**9)}.safetensors"
        shutil.copy(st, outside)
        st.unlink()
        st.symlink_to(outside)
        return
    elif op == 12:  # truncated data
        _write_st(st, header, data[: rng.randrange(len(data))])
        return
    else:  # raw bytes in the JSON
        blob = bytearray(json.dumps(header).encode())
        for _ in range(rng.randrange(1, 6)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        st.write_bytes(struct.pack("<Q", len(blob)) + bytes(blob) + data)
        return
    _write_st(st, header, data)
