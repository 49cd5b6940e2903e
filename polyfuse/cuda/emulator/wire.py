"""The emulator's wire format: the request a run writes into shared memory and the messages
on the server's socket. Mirrors ``rt/pf_emu_rt.cpp``; bump :data:`ABI_VERSION` with it."""

from __future__ import annotations

import struct

import numpy as np

ABI_VERSION = 2
RESULT_HEADER = 2048  # bytes of pf_result before counts[]
ORDERS = {"forward": 0, "reverse": 1, "random": 2}

MSG = struct.Struct("<IIqq")
MSG_LOAD, MSG_MAP, MSG_RUN, MSG_DONE = 1, 2, 3, 4
SPEC = np.dtype(
    [
        ("abi", "<u4"),
        ("nbuf", "<u4"),
        ("nlaunch", "<u4"),
        ("order", "<u4"),
        ("seed", "<u8"),
        ("workers", "<u4"),
        ("module", "<u4"),
        ("bufs_off", "<u8"),
        ("launches_off", "<u8"),
        ("result_off", "<u8"),
        ("banks_off", "<u8"),
        ("banks_cap", "<u4"),
        ("pad", "<u4"),
    ]
)
# the shared-memory bank report (pf_bank_table): n, overflow, then n of BANK_STAT
BANK_HEADER = 8
BANK_STAT = np.dtype(
    [
        ("pc", "<u8"),
        ("launch", "<u4"),
        ("access", "<u4"),
        ("width", "<u4"),
        ("pad", "<u4"),
        ("requests", "<u8"),
        ("wavefronts", "<u8"),
        ("ideal", "<u8"),
    ]
)
BANK_CAP = 1024
BUF = np.dtype(
    [
        ("data_off", "<u8"),
        ("nbytes", "<u8"),
        ("itemsize", "<u4"),
        ("pad", "<u4"),
        ("name_off", "<u8"),
    ]
)
LAUNCH = np.dtype(
    [
        ("kernel", "<u4"),
        ("nargs", "<u4"),
        ("grid", "<u4", 3),
        ("block", "<u4", 3),
        ("shared", "<u4"),
        ("pad", "<u4"),
        ("args_off", "<u8"),
    ]
)
ARG = np.dtype([("buf", "<i4"), ("pad", "<u4"), ("value", "<u8")])
assert (SPEC.itemsize, BUF.itemsize, LAUNCH.itemsize, ARG.itemsize) == (72, 32, 48, 16)
assert BANK_STAT.itemsize == 48


def align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a
