"""Crash-safe on-disk entries for every polyfuse cache (compile, zoo, emulator, CUDA binaries).

A cache entry is only trusted when it proves itself: each one carries the store's format
version, the version of the cache that wrote it and a SHA-256 of its content, all checked on
read. Anything unreadable, truncated, inconsistent or from another version reads as a *miss*;
the caller rebuilds the entry and writes it again, which heals the file.

Writes are atomic: the bytes go to a private temporary file in the same directory, are
flushed with ``fsync`` and then ``os.replace``-d over the entry, so a reader sees the old
entry or the new one, never half of one, and a process killed mid-write (``kill -9``, out of
memory) leaves at most a stray temporary file. Two processes writing the same key each
replace the entry with a complete file of their own; the last one wins.

Two kinds of entry:

* :meth:`Store.read_json` / :meth:`Store.write_json` — a JSON value in a file of its own:
  one header line ``polyfuse-store <format> <kind> <version> <sha256> <length>`` and the
  JSON body;
* :meth:`Store.read_artifact` / :meth:`Store.commit_artifact` — a file whose format is not
  ours (a shared library the emulator ``dlopen``-s): its checksum lives in a sidecar
  ``<name>.sum`` written after it, and a build of one key is serialised by a lock file.

The header line and its checks are also available on their own (:func:`write_entry`,
:func:`decode_entry`) for files that are not cache entries: a saved compiled graph
(:mod:`polyfuse.artifact`) is one such entry whose body is JSON followed by binary blobs.
Where a cache treats a bad entry as a miss, :func:`decode_entry` says what is wrong with it
(:class:`EntryError`), so a user's file can be refused with a reason.

``POLYFUSE_STORE_FAULT`` plants faults for the fault tests (never set it otherwise):
``kill-after:N`` kills the process with SIGKILL right after its N-th completed write,
``kill-during:N`` in the middle of its N-th write (half of the temporary file written).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

#: Bump when the header line or the sidecar format changes.
FORMAT = 1
_MAGIC = b"polyfuse-store"
_writes = 0  # completed writes in this process (for the planted faults)


def _fault(stage: str) -> None:
    """SIGKILL this process when ``POLYFUSE_STORE_FAULT`` asks for it at ``stage``."""
    spec = os.environ.get("POLYFUSE_STORE_FAULT")
    if not spec:
        return
    what, _, n = spec.partition(":")
    if what == stage and int(n or 1) == _writes + (stage == "kill-during"):
        os.kill(os.getpid(), signal.SIGKILL)


def _sha(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: Path, data: bytes | Sequence[bytes], mode: int | None = None) -> None:
    """Replace ``path`` by ``data`` atomically (temporary file, fsync, ``os.replace``).

    ``data`` is the bytes, or a sequence of bytes-like parts written one after the other
    (large entries are never joined in memory). ``mode``: the file's permissions (default:
    the temporary file's, readable by its owner only)."""
    global _writes
    parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            half = sum(len(memoryview(p).cast("B")) for p in parts) // 2
            for part in parts:  # the first half, the planted fault, the second half
                view = memoryview(part).cast("B")
                if 0 <= half < len(view):
                    f.write(view[:half])
                    f.flush()
                    _fault("kill-during")
                    f.write(view[half:])
                else:
                    f.write(view)
                half -= len(view)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _writes += 1
    _fault("kill-after")


class EntryError(ValueError):
    """Why bytes are not a valid entry of the expected kind and version (:func:`decode_entry`).

    ``problem`` is one of "not a store entry", "store format", "kind", "version",
    "truncated", "checksum"; ``found`` is the value the file holds where that helps (its
    format, kind or version).
    """

    def __init__(self, problem: str, message: str, found: str = "") -> None:
        super().__init__(message)
        self.problem = problem
        self.found = found


def entry_header(kind: str, version: int, sha256: str, length: int) -> bytes:
    """The header line of an entry of ``kind`` at ``version`` with a body of ``length`` bytes
    whose SHA-256 is ``sha256``."""
    return b"%s %d %s %d %s %d\n" % (
        _MAGIC,
        FORMAT,
        kind.encode(),
        version,
        sha256.encode(),
        length,
    )


def write_entry(
    path: Path, kind: str, version: int, parts: Sequence[bytes], mode: int | None = None
) -> None:
    """Write an entry whose body is ``parts`` (concatenated) to ``path``, atomically, without
    joining the parts in memory (``mode``: as for :func:`write_atomic`)."""
    sha = hashlib.sha256()
    length = 0
    for part in parts:
        sha.update(part)
        length += len(memoryview(part).cast("B"))
    write_atomic(path, [entry_header(kind, version, sha.hexdigest(), length), *parts], mode)


def decode_entry(data: bytes, kind: str, version: int) -> memoryview:
    """The body of the entry ``data`` after every check (magic, store format, kind, version,
    length, SHA-256); raises :class:`EntryError` saying which failed."""
    end = data.find(b"\n", 0, 512)
    fields = bytes(data[:end]).split(b" ") if end >= 0 else []
    if len(fields) != 6 or fields[0] != _MAGIC:
        raise EntryError("not a store entry", "no polyfuse-store header")
    _, fmt, got_kind, got_version, sha, length = fields
    if fmt != b"%d" % FORMAT:
        raise EntryError(
            "store format", f"store format {fmt.decode(errors='replace')}, not {FORMAT}",
            fmt.decode(errors="replace"),
        )  # fmt: skip
    if got_kind != kind.encode():
        found = got_kind.decode(errors="replace")
        raise EntryError("kind", f"a '{found}' entry, not '{kind}'", found)
    if got_version != b"%d" % version:
        found = got_version.decode(errors="replace")
        raise EntryError("version", f"version {found}, not {version}", found)
    body = memoryview(data)[end + 1 :]
    if not length.isdigit() or int(length) != len(body):
        want = length.decode(errors="replace")
        raise EntryError("truncated", f"{len(body)} of {want} body bytes", want)
    if sha != _sha(body).encode():
        raise EntryError("checksum", "SHA-256 mismatch")
    return body


class Store:
    """Versioned, checksummed entries of one cache (``kind``) under ``directory``.

    ``version`` is the cache's own entry format: entries written under another version are
    misses. Keys are file names (hex digests, optionally with a suffix); entries are spread
    over sub-directories by the first two characters when ``fan_out`` is set.
    """

    def __init__(self, directory: str | os.PathLike, kind: str, version: int, fan_out=True):
        self.directory = Path(directory)
        self.kind = kind
        self.version = version
        self.fan_out = fan_out

    def path(self, key: str) -> Path:
        """Where the entry ``key`` lives."""
        return self.directory / key[:2] / key if self.fan_out else self.directory / key

    # ------------------------------------------------------------------ JSON entries

    def read_json(self, key: str) -> Any | None:
        """The value stored under ``key``, or None (missing, corrupt or another version)."""
        try:
            data = self.path(key).read_bytes()
            return json.loads(bytes(decode_entry(data, self.kind, self.version)))
        except (OSError, EntryError, ValueError):
            return None

    def write_json(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON-serialisable) under ``key``, atomically."""
        body = json.dumps(value, separators=(",", ":")).encode()
        write_entry(self.path(key), self.kind, self.version, [body])

    # ------------------------------------------------------------------ foreign-format artifacts

    def _sum_path(self, path: Path) -> Path:
        return path.with_name(path.name + ".sum")

    def read_artifact(self, key: str) -> Path | None:
        """The path of the artifact ``key`` when it exists and matches its checksum."""
        path = self.path(key)
        try:
            want = self._sum_path(path).read_text().split()
            data = path.read_bytes()
        except (OSError, UnicodeDecodeError):
            return None
        have = [f"{FORMAT}", self.kind, f"{self.version}", _sha(data), f"{len(data)}"]
        return path if want == have else None

    def commit_artifact(self, key: str) -> Path:
        """Record the checksum of the artifact just built at :meth:`path` (``key``)."""
        path = self.path(key)
        data = path.read_bytes()
        line = f"{FORMAT} {self.kind} {self.version} {_sha(data)} {len(data)}\n"
        write_atomic(self._sum_path(path), line.encode())
        return path

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Hold the build lock of ``key`` (other processes building it wait)."""
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
