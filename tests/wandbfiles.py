"""What an offline W&B run directory holds (offline-run-TIME-ID/run-ID.wandb), read back as W&B
wrote it: the file's records, each one of W&B's own protobuf `Record`s (wandb.proto).

wandb 0.31 has no Python reader of its run files any more (wandb-core, in Go, writes and syncs
them), so the framing is read here: W&B's header (":W&B", magic 0xBEE1, version 0), then the
LevelDB log format of 32 KiB blocks, each chunk with a CRC-32 of its type byte and data, a
length and a type (full, first, middle, last). Every checksum is checked: a file this reader
misunderstood fails the test instead of passing it."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32768
CHUNK = struct.Struct("<IHB")  # checksum, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    """The file's records, in order, as wandb.proto's Record messages."""
    from wandb.proto import wandb_internal_pb2

    for data in _chunks(path.read_bytes()):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated
        record.ParseFromString(data)
        yield record


def _chunks(raw: bytes) -> Iterator[bytes]:
    assert raw.startswith(HEADER), f"not a W&B run file: {raw[:7]!r}"
    position, pending = len(HEADER), b""
    while position + CHUNK.size <= len(raw):
        left = BLOCK - position % BLOCK
        if left < CHUNK.size:  # a block's tail too short for a chunk header: zeros
            position += left
            continue
        checksum, length, kind = CHUNK.unpack_from(raw, position)
        if (checksum, length, kind) == (0, 0, 0):  # the rest of a block not written yet
            position += left
            continue
        data = raw[position + CHUNK.size : position + CHUNK.size + length]
        assert zlib.crc32(data, zlib.crc32(bytes([kind]))) == checksum, f"bad chunk at {position}"
        position += CHUNK.size + length
        pending += data
        if kind in (FULL, LAST):
            yield pending
            pending = b""


@dataclass
class OfflineRun:
    """One offline session's run as its file says: its id, name, config, summary, exit code."""

    directory: Path
    run_id: str = ""
    name: str = ""
    project: str = ""
    entity: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def offline_run(directory: Path) -> OfflineRun:
    """The run of offline run directory `directory` (one `.wandb` file in it)."""
    (path,) = directory.glob("run-*.wandb")
    run = OfflineRun(directory)
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.name = record.run.run_id, record.run.display_name
            run.project, run.entity = record.run.project, record.run.entity
            run.config.update(_items(record.run.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def _items(updates: Any) -> dict[str, Any]:
    """Config or summary items (key, or nested_key joined by dots; the value as JSON)."""
    return {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in updates}
