"""Race reports of the race-check emulator: a ``pf_race_report`` (see ``pf_emu.h``) decoded
into a one-line :class:`RaceError` naming the kernel, the memory and both source lines."""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Sequence
from pathlib import Path

from polyfuse.base.errors import RaceError
from polyfuse.cuda.runtime.launch import Launch

_CTYPE_SIZES = {
    "float": 4, "int": 4, "unsigned": 4, "unsigned int": 4, "double": 8, "long long": 8,
    "unsigned long long": 8, "char": 1, "unsigned char": 1, "bool": 1, "short": 2,
    "float2": 8, "float4": 16, "int2": 8, "int4": 16,
}  # fmt: skip


def _race_message(
    kernel: str,
    kind: str,
    space: int,
    memory: str,
    element: int | None,
    offset: int,
    first: Sequence[int],
    second: Sequence[int],
    lines: tuple[int | None, int | None],
) -> str:
    """One line: the kernel, what raced, where, the two threads and their source lines."""
    where = f"element {element}" if element is not None else f"byte offset {offset}"
    what = (
        f"__shared__ '{memory}' {where}" if space == 0 and not memory.endswith("memory")
        else f"{memory} {where}" if space == 0 else f"global buffer '{memory}' {where}"
    )  # fmt: skip
    verbs = {
        "read-after-write": ("wrote", "reads"),
        "write-after-read": ("read", "writes"),
        "write-after-write": ("wrote", "writes"),
    }[kind]

    def who(t: Sequence[int], verb: str, line: int | None) -> str:
        at = f"line {line}" if line else "an unknown line"
        return f"thread ({t[0]},{t[1]},{t[2]}) of block ({t[3]},{t[4]},{t[5]}) {verb} it at {at}"

    if tuple(first[3:]) == tuple(second[3:]):
        fix = "with no __syncthreads() between (add one, or give each thread its own element)"
    else:
        fix = "in the same launch (blocks are not ordered: split the kernel or use atomics)"
    return (
        f"kernel {kernel}: {kind} race on {what}: {who(first, verbs[0], lines[0])}, "
        f"{who(second, verbs[1], lines[1])} {fix}"
    )


def source_lines(library: Path, pcs: Sequence[int]) -> list[int | None]:
    """Source lines of code addresses of a race-check library (addr2line on its -g info): for
    each, the innermost inlined frame that lies in the kernel source, not the header."""
    out: list[int | None] = [None] * len(pcs)
    tool = shutil.which("addr2line")
    if tool is None or not any(pcs):
        return out
    try:
        proc = subprocess.run(
            [tool, "-i", "-a", "-e", str(library), *(hex(p) for p in pcs)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return out
    k = -1
    for line in proc.stdout.splitlines():
        if line.startswith("0x"):
            k += 1
            continue
        file, _, num = line.rpartition(":")
        num = num.split()[0] if num else ""
        # The kernel source is the one .cpp file (the header and system headers are not).
        if 0 <= k < len(out) and out[k] is None and Path(file).suffix == ".cpp" and num.isdigit():
            out[k] = int(num)
    return out


def race_error(
    library: Path,
    shared: Sequence[tuple[str, str]],
    dynamic: Sequence[tuple[str, str]],
    raw: bytes,
    buffers: list[tuple[str, int]],
    launch: Launch | None = None,
) -> RaceError:
    """The :class:`RaceError` for the pf_race_report ``raw`` (see pf_emu.h) of race-check
    ``library``, whose ``__shared__`` variables are ``shared``/``dynamic`` (name, C type);
    named after the racing ``launch``'s kernel when it runs a shared function."""
    kind, space, index, size, offset = struct.unpack_from("<iiiIQ", raw)
    first = struct.unpack_from("<6I", raw, 24)
    second = struct.unpack_from("<6I", raw, 48)
    pcs = struct.unpack_from("<2Q", raw, 72)
    kernel = raw[88 : 88 + 256].split(b"\0", 1)[0].decode(errors="replace")
    if launch is not None and launch.entry == kernel:
        kernel = launch.kernel
    first_line, second_line = source_lines(library, pcs)
    lines = (first_line, second_line)
    kinds = ("read-after-write", "write-after-read", "write-after-write")
    if space == 0:
        if index >= 0 and index < len(shared):
            memory, typ = shared[index]
            item = _CTYPE_SIZES.get(" ".join(typ.replace("const", "").split()), 0)
        elif index == -1 and len(set(dynamic)) == 1:  # one extern __shared__ array
            memory, typ = dynamic[0]
            item = _CTYPE_SIZES.get(" ".join(typ.replace("const", "").split()), 0)
        else:
            memory, item = ("dynamic shared memory" if index == -1 else "shared memory"), 0
    else:
        memory, item = buffers[index] if 0 <= index < len(buffers) else (f"#{index}", 0)
    element = offset // item if item else None
    err = RaceError(
        _race_message(kernel, kinds[kind], space, memory, element, offset, first, second, lines)
    )
    err.kernel, err.kind = kernel, kinds[kind]
    err.space, err.memory, err.element = ("shared", "global")[space], memory, element
    err.threads = tuple((tuple(t[:3]), tuple(t[3:])) for t in (first, second))
    err.lines = lines
    return err
