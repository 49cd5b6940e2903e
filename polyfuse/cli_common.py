"""Conventions every ``polyfuse`` subcommand shares, defined once.

* errors: a bad argument is one ``polyfuse VERB: error: ...`` line on stderr and exit status 2
  (:class:`ArgumentParser`; numeric options are checked by :func:`positive_int` and
  :func:`non_negative_int`), never a traceback;
* ``-q/--quiet`` (no progress, warnings and errors only) and ``-v/--verbose`` (repeatable: INFO,
  then DEBUG logging of the ``polyfuse`` loggers; the traceback behind an error) on every verb;
* ``--size {tiny,full}`` on every verb that loads a model; ``--arch`` on every verb that
  compiles;
* ``--json PATH`` on every verb with a report; ``--json -`` writes the JSON to stdout and
  *nothing else*: while the verb runs, whatever it would print on stdout goes to stderr
  (:func:`json_stdout`), and :func:`write_json` writes the document to the real stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn, TextIO

__all__ = [
    "SIZES",
    "ArgumentParser",
    "add_arch",
    "add_common",
    "add_json",
    "add_size",
    "json_stdout",
    "json_to_stdout",
    "non_negative_int",
    "cli_logging",
    "positive_int",
    "write_json",
]

#: The model sizes of ``--size`` (zoo models; other models have one size).
SIZES = ("tiny", "full")

#: ``--json`` values that mean "standard output".
_STDOUT = ("-", "/dev/stdout")


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line naming the mistake, with exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _int(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int(text, 0, "an integer >= 0")


def add_size(p: argparse.ArgumentParser, *, tiny_alias: bool = False) -> None:
    """``--size {tiny,full}`` (default full); ``--tiny``, a deprecated alias, when asked."""
    p.add_argument(
        "--size",
        choices=SIZES,
        default="full",
        help="size of the built-in zoo models (default: full; other models have one size)",
    )
    if tiny_alias:
        p.add_argument(
            "--tiny",
            dest="size",
            action="store_const",
            const="tiny",
            help="deprecated: the same as --size tiny",
        )


def add_arch(p: argparse.ArgumentParser) -> None:
    """``--arch``: the GPU architecture a verb compiles for (one of the supported ones)."""
    from polyfuse.cuda.toolchain.compiler import SUPPORTED_ARCHS

    p.add_argument(
        "--arch",
        default="sm_80",
        choices=SUPPORTED_ARCHS,
        help="GPU architecture to compile for (default: sm_80)",
    )


def add_json(p: argparse.ArgumentParser, what: str = "the report") -> None:
    """``--json PATH``; ``-`` is stdout (then stdout carries the JSON only)."""
    p.add_argument(
        "--json",
        metavar="PATH",
        help=f"write {what} as JSON to PATH; '-' writes it to stdout, and then stdout carries "
        "nothing else (tables and progress go to stderr)",
    )


def add_common(
    p: argparse.ArgumentParser,
    *,
    size: bool = False,
    tiny_alias: bool = False,
    json: str | None = None,
) -> argparse.ArgumentParser:
    """``-q/-v`` on ``p``; ``--size`` when ``size`` (and ``--tiny`` when ``tiny_alias``);
    ``--json`` when ``json`` says what the JSON holds."""
    g = p.add_argument_group("output")
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print no progress; only results, warnings and errors",
    )
    g.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more detail: -v logs what polyfuse does (INFO), -vv everything (DEBUG) and "
        "prints the traceback behind an error",
    )
    if size:
        add_size(p, tiny_alias=tiny_alias)
    if json is not None:
        add_json(p, json)
    return p


@contextlib.contextmanager
def cli_logging(args: argparse.Namespace) -> Iterator[None]:
    """While a verb runs, the level of the ``polyfuse`` loggers from ``-q``/``-v`` (messages
    on stderr); restored afterwards, so a caller in the same process keeps its own."""
    verbose = getattr(args, "verbose", 0) or 0
    if not verbose and not getattr(args, "quiet", False):
        yield  # the default: warnings and errors, as Python shows them
        return
    log = logging.getLogger("polyfuse")
    level = logging.ERROR if not verbose else logging.INFO if verbose == 1 else logging.DEBUG
    saved = log.level
    log.setLevel(level)
    handler = None
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
        log.addHandler(handler)
    try:
        yield
    finally:
        log.setLevel(saved)
        if handler is not None:
            log.removeHandler(handler)


def json_to_stdout(args: argparse.Namespace) -> bool:
    """Whether ``--json`` names stdout."""
    return getattr(args, "json", None) in _STDOUT


def _stdout_is_fd1() -> bool:
    try:
        return sys.stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):  # replaced (captured, redirected) streams
        return False


@contextlib.contextmanager
def json_stdout(args: argparse.Namespace) -> Iterator[None]:
    """Run a verb: with ``--json -``, what it prints on stdout goes to stderr, and the real
    stdout is kept (``args.json_stream``) for :func:`write_json`. When stdout is the process's
    file descriptor 1, that descriptor is pointed at stderr too, so worker processes and
    native code cannot write there either."""
    args.json_stream = sys.stdout
    if not json_to_stdout(args):
        yield
        return
    if not _stdout_is_fd1():
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    args.json_stream = os.fdopen(os.dup(saved), "w", encoding="utf-8")
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        args.json_stream.close()
        args.json_stream = sys.stdout


def write_json(args: argparse.Namespace, doc: Any) -> None:
    """Write ``doc`` where ``--json`` says (nothing without ``--json``)."""
    target = getattr(args, "json", None)
    if not target:
        return
    text = json.dumps(doc, indent=1) + "\n"
    if target in _STDOUT:
        stream: TextIO = getattr(args, "json_stream", None) or sys.stdout
        stream.write(text)
        stream.flush()
        return
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
