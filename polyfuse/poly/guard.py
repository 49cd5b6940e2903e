"""Bounded isl calls: an operation budget that decides, and a deadline that always holds.

Why both (issue 19). isl's operation budget (``Context.set_max_operations``) does count the
scheduler's work: every tableau pivot and every allocation asks ``isl_ctx_next_operation``.
It does not bound its *time*. In the integer lexmin that builds a band
(``isl_tab_basic_set_non_trivial_lexmin``, which adds cuts), the tableau's integers grow with
every cut, and a pivot that took half a microsecond takes milliseconds. Measured on the
scheduler inputs of issue 19: swin_t's LayerNorm→Pad→roll group spent 13 s on its first
100k operations (the 2M default budget would have taken hours); Conv1d→ReLU→MaxPool1d's
whole-component retry spent 3 s on 10k operations and 200 s on its 60k budget; every scheduler
call of the examples, the suite, the test cases and the tiny zoo needs at most 97k operations
(median 14k) and 50 ms. Nor can Python interrupt an isl call: islpy holds the GIL, and isl
reads its abort flag only when it asks for the next operation.

Policy. A call that can blow up runs under both bounds:

- the **operation budget**, which is deterministic (the same call always passes or fails the
  same way) and decides whenever isl's operations stay cheap;
- a **deadline**, which holds whatever isl does: the call runs in a forked child process (it
  inherits the isl objects, so nothing is serialised on the way in) that sends its result back
  as isl text, and the parent kills the child at the deadline. The deadline is a safety net far
  above any normal call (normal calls end on their result or their budget long before).

Cost. A fork is not free for a Python process: besides the fork itself, the parent then takes
a page fault on every page it writes (10-20 ms per call measured, against a few ms for a
typical scheduler call). So a call first runs in-process for a small number of operations
(``Limits.inline``, chosen where isl's operations were cheap on every input measured) and
only a call that needs more starts over in the child. The outcome does not depend on where
the call ran; only the deadline, which a normal call never meets, can change it.

Where ``fork`` is unavailable (or fails) the call runs in-process under the budget alone. The
child writes to a pipe and leaves with ``os._exit``; it runs isl code and nothing else of the
parent's. A child that dies without a result (killed, or crashed inside isl) is an ``error``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import islpy as isl

T = TypeVar("T")

#: Whether bounded calls run in a child process that can be stopped (tests may switch it off).
FORK = hasattr(os, "fork")
_QUOTA = "maximal number of operations exceeded"


@dataclass(frozen=True)
class Limits:
    """The bounds of one isl call.

    ``operations``: isl's operation budget of the whole call; ``seconds``: its deadline (None:
    none, the call runs in-process); ``inline``: operations tried in-process first. A call
    that ends within ``inline`` operations costs no process; one that needs more starts over
    in a child under the full budget and the deadline, so the outcome does not depend on
    where the call ran (only a deadline can change it).
    """

    operations: int
    seconds: float | None
    inline: int = 0

    def __str__(self) -> str:
        dl = "no deadline" if self.seconds is None else f"{self.seconds:g} s"
        return f"{self.operations} operations, {dl}"


class Exhausted(Exception):
    """An isl call ran out of one of its :class:`Limits` (or isl reported an error).

    ``limit``: ``"operations"`` (the budget), ``"deadline"`` (wall clock) or ``"error"``
    (isl failed otherwise: ``detail`` has its message).
    """

    def __init__(self, limit: str, limits: Limits, detail: str = "", seconds: float = 0.0):
        self.limit = limit
        self.limits = limits
        self.detail = detail
        self.seconds = seconds
        super().__init__(self.reason)

    @property
    def reason(self) -> str:
        if self.limit == "operations":
            return f"isl budget of {self.limits.operations} operations exhausted"
        if self.limit == "deadline":
            return f"isl call stopped at its deadline of {self.limits.seconds:g} s"
        return f"isl failed: {self.detail}"


@dataclass
class Outcome(Generic[T]):
    """What a bounded call returned and how long it took (wall clock, fork included)."""

    value: T | None
    seconds: float
    forked: bool


@contextlib.contextmanager
def operation_budget(ctx: isl.Context, operations: int) -> Iterator[None]:
    """Run the body under ``operations`` isl operations of ``ctx`` (counted from zero);
    the budget is lifted afterwards. isl raises ``islpy.Error`` when it runs out."""
    ctx.set_max_operations(operations)
    ctx.reset_operations()
    try:
        yield
    finally:
        ctx.set_max_operations(0)


def over_budget(err: Exception | str) -> bool:
    """Whether isl's error ``err`` is its operation budget running out."""
    return _QUOTA in str(err)


def _classify(err: Exception | str) -> str:
    return "operations" if over_budget(err) else "error"


def bounded(
    ctx: isl.Context,
    call: Callable[[], T | None],
    limits: Limits,
    to_text: Callable[[T], str],
    from_text: Callable[[str], T],
) -> Outcome[T]:
    """``call()`` under ``limits``; raises :class:`Exhausted` when a limit is reached.

    ``to_text``/``from_text`` carry the result from the child (isl objects cross processes as
    isl strings, read back on ``ctx``). ``call`` returning None is passed on as None.
    """
    t0 = time.perf_counter()
    whole = not FORK or limits.seconds is None or limits.inline >= limits.operations
    if not whole and limits.inline > 0:
        try:
            return _in_process(ctx, call, limits.inline, t0)
        except Exhausted as e:
            if e.limit != "operations":
                raise Exhausted(e.limit, limits, e.detail, e.seconds) from None
        # more than ``inline`` operations: the call starts over where the deadline holds
    status, payload = ("nofork", "") if whole else _in_child(ctx, call, limits, to_text)
    took = time.perf_counter() - t0
    if status == "nofork":  # no fork, no deadline (or none could be started)
        try:
            return _in_process(ctx, call, limits.operations, t0)
        except Exhausted as e:
            raise Exhausted(e.limit, limits, e.detail, e.seconds) from None
    if status == "ok":
        return Outcome(from_text(payload), time.perf_counter() - t0, True)
    if status == "none":
        return Outcome(None, took, True)
    if status == "deadline":
        raise Exhausted("deadline", limits, seconds=took)
    if status == "isl":
        raise Exhausted(_classify(payload), limits, payload, took)
    if status == "died":
        raise Exhausted("error", limits, payload, took)
    raise RuntimeError(f"bounded isl call failed in its child process:\n{payload}")


def _in_process(
    ctx: isl.Context, call: Callable[[], T | None], operations: int, t0: float
) -> Outcome[T]:
    try:
        with operation_budget(ctx, operations):
            value = call()
    except isl.Error as e:
        limits = Limits(operations, None)
        raise Exhausted(_classify(e), limits, str(e), time.perf_counter() - t0) from None
    return Outcome(value, time.perf_counter() - t0, False)


def _in_child(
    ctx: isl.Context, call: Callable[[], T | None], limits: Limits, to_text: Callable[[T], str]
) -> tuple[str, str]:
    """(status, payload) of ``call`` run in a forked child; status ``deadline`` when the
    child was stopped. The parent only waits: it never touches isl meanwhile."""
    assert limits.seconds is not None
    r, w = os.pipe()
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork in a process with threads; the child only runs
            # isl (plain C with its own state) and os.write, and leaves with os._exit.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:  # no process to be had (limits on processes or memory)
        os.close(r)
        os.close(w)
        return "nofork", ""
    if pid == 0:  # the child: compute, write, leave without running any of the parent's exits
        try:
            os.close(r)
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
            try:
                with operation_budget(ctx, limits.operations):
                    value = call()
                msg = "none\n" if value is None else "ok\n" + to_text(value)
            except isl.Error as e:
                msg = "isl\n" + str(e)
            _write_all(w, msg.encode())
            os.close(w)  # EOF now, not after the kernel has torn down the address space
        except BaseException:  # noqa: BLE001 - reported to the parent, never raised here
            with contextlib.suppress(BaseException):
                _write_all(w, ("crash\n" + traceback.format_exc()).encode())
        finally:
            os._exit(0)
    os.close(w)
    done = False
    try:
        data = _read_until(r, time.monotonic() + limits.seconds)
        done = data is not None
    finally:
        os.close(r)
        if not done:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap(pid, wait=not done)
    if data is None:
        return "deadline", ""
    status, _, payload = data.decode().partition("\n")
    if not status:  # killed (the kernel's OOM killer) or crashed inside isl
        return "died", "the child process running isl ended without a result"
    return status, payload


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_until(fd: int, end: float) -> bytes | None:
    """Everything until EOF on ``fd``, or None when ``end`` (monotonic) passes first."""
    chunks: list[bytes] = []
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


_EXITING: list[int] = []  # children that sent their result and are still exiting


def _reap(pid: int, wait: bool) -> None:
    """Collect ``pid`` (and earlier children that have exited since). A child that sent its
    result is not waited for: the kernel tearing down its copy of the address space takes
    longer than the call itself; it is collected by a later call or at exit."""
    _EXITING.append(pid)
    for p in list(_EXITING):
        try:
            done, _ = os.waitpid(p, 0 if wait and p == pid else os.WNOHANG)
        except ChildProcessError:
            done = p
        except InterruptedError:
            continue
        if done:
            _EXITING.remove(p)


@atexit.register
def _reap_all() -> None:
    for p in _EXITING:
        with contextlib.suppress(ChildProcessError, InterruptedError):
            os.waitpid(p, 0)
