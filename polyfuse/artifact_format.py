"""The bytes of a saved compiled graph: one :mod:`polyfuse.base.store` entry of kind ``artifact``.

Layout (everything after the header line is covered by the header's SHA-256 and length)::

    polyfuse-store <store format> artifact <FORMAT_VERSION> <sha256> <length>\\n
    <manifest: one line of JSON>\\n
    <blobs, back to back>

The manifest holds every small fact (launches, buffers, inputs and outputs, the plan summary,
versions, per-arch compiler reports) and a table of the blobs — the CUDA source, a cubin and
its PTX per arch, the constants' bytes — with each blob's offset, length and SHA-256, so a
blob is checked on its own too. Nothing here is pickled: reading an artifact never runs code.

:func:`decode` turns any problem into an :class:`~polyfuse.errors.ArtifactError` whose one-line
message names the file, says what is wrong (not an artifact, another format version,
truncated, corrupt) and what to do.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyfuse.base.store import FORMAT as STORE_FORMAT
from polyfuse.base.store import EntryError, decode_entry, entry_header, write_entry
from polyfuse.errors import ArtifactError

#: The store kind of an artifact entry.
KIND = "artifact"
#: Bump when the manifest's layout or meaning changes: older files are then refused.
FORMAT_VERSION = 1
#: The suffix polyfuse gives the artifacts it names (``zoo --save``, the GPU benchmark).
SUFFIX = ".pfa"

_RESAVE = "re-save it with fn.save(path)"


@dataclass(frozen=True)
class Decoded:
    """An artifact read back: its manifest and its blobs by name."""

    manifest: dict[str, Any]
    blobs: dict[str, bytes]


def body_parts(manifest: Mapping[str, Any], blobs: Mapping[str, bytes]) -> list[bytes]:
    """The body of an artifact entry: the manifest line (with the blob table), then the blobs."""
    table: dict[str, dict[str, Any]] = {}
    offset = 0
    for name, data in blobs.items():
        table[name] = {
            "offset": offset,
            "length": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        offset += len(data)
    # NaN/inf (a float scalar argument, user metadata) as Python's json writes and reads them
    head = json.dumps({**manifest, "blobs": table}, separators=(",", ":"))
    return [head.encode() + b"\n", *blobs.values()]


def write(path: Path, manifest: Mapping[str, Any], blobs: Mapping[str, bytes]) -> None:
    """Write ``manifest`` and ``blobs`` as one artifact entry at ``path``, atomically."""
    # a file to ship, not a private cache entry: readable by all, as cp would leave it
    write_entry(Path(path), KIND, FORMAT_VERSION, body_parts(manifest, blobs), mode=0o644)


def dumps(manifest: Mapping[str, Any], blobs: Mapping[str, bytes]) -> bytes:
    """The bytes :func:`write` would write (for pickling)."""
    parts = body_parts(manifest, blobs)
    sha = hashlib.sha256()
    for part in parts:
        sha.update(part)
    length = sum(len(part) for part in parts)
    return b"".join([entry_header(KIND, FORMAT_VERSION, sha.hexdigest(), length), *parts])


def _problem(where: str, e: EntryError) -> str:
    """The one-line message for an entry that failed :func:`~polyfuse.base.store.decode_entry`."""
    if e.problem == "not a store entry":
        return f"{where} is not a polyfuse artifact (no polyfuse-store header): {_RESAVE}"
    if e.problem == "kind":
        return (
            f"{where} is a polyfuse '{e.found}' cache entry, not an artifact: load a file "
            "written by fn.save(path)"
        )
    if e.problem in ("version", "store format"):
        what = "artifact format" if e.problem == "version" else "store format"
        reads = FORMAT_VERSION if e.problem == "version" else STORE_FORMAT
        return (
            f"{where} has {what} version {e.found}, and this polyfuse reads version {reads}: "
            f"load it with the polyfuse that saved it, or {_RESAVE} with this one"
        )
    if e.problem == "truncated":
        return f"{where} is truncated ({e}): copy it again or {_RESAVE}"
    return (
        f"{where} is corrupt (its SHA-256 does not match its contents): copy it again or " + _RESAVE
    )


def decode(data: bytes, origin: str) -> Decoded:
    """Check and split the bytes of an artifact read from ``origin`` (a path, for messages)."""
    where = f"artifact '{origin}'"
    try:
        body = decode_entry(data, KIND, FORMAT_VERSION)
    except EntryError as e:
        raise ArtifactError(_problem(where, e)) from None
    end = _find_newline(body)
    try:
        if end < 0:
            raise ValueError("no manifest line")
        manifest = json.loads(bytes(body[:end]))
        table = manifest.pop("blobs")
        start = end + 1
        blobs: dict[str, bytes] = {}
        for name, entry in table.items():
            lo = start + int(entry["offset"])
            blob = bytes(body[lo : lo + int(entry["length"])])
            if len(blob) != entry["length"] or hashlib.sha256(blob).hexdigest() != entry["sha256"]:
                raise ArtifactError(
                    f"{where} is corrupt (blob '{name}' does not match its SHA-256): copy it "
                    f"again or {_RESAVE}"
                )
            blobs[name] = blob
    except ArtifactError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ArtifactError(f"{where} is corrupt (its manifest is malformed): {_RESAVE}") from None
    return Decoded(manifest, blobs)


def _find_newline(body: memoryview) -> int:
    """The offset of the first newline of ``body`` (the end of the manifest), else -1."""
    step = 1 << 20
    for lo in range(0, len(body), step):
        i = bytes(body[lo : lo + step]).find(b"\n")
        if i >= 0:
            return lo + i
    return -1


def read(path: str | Path) -> Decoded:
    """Read and check the artifact at ``path``."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ArtifactError(
            f"cannot read artifact '{path}': {reason}; pass the path of a file written by "
            "fn.save(path)"
        ) from None
    return decode(data, str(path))
