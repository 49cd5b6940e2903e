"""The options of ``torch.compile(model, backend="polyfuse", options={...})``, validated.

PyTorch hands a backend ``options=`` as one keyword (and ``mode=`` when one is given); a
backend that reads neither silently ignores what the user asked for. :func:`parse_options`
reads both (and keywords given directly, ``functools.partial(polyfuse_backend, arch=...)``),
checks every key and value, and raises :class:`BackendOptionError` naming the bad key or
value and listing the valid ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polyfuse.cuda.toolchain.compiler import SUPPORTED_ARCHS
from polyfuse.errors import PolyfuseError

__all__ = ["OPTIONS", "BackendOptionError", "BackendOptions", "parse_options"]

#: Default bound on the static specializations kept per graph with dynamic shapes.
DEFAULT_MAX_SPECIALIZATIONS = 8

#: Every option the backend reads, with what it means (the error lists these).
OPTIONS: dict[str, str] = {
    "arch": f"CUDA architecture to compile for, one of {', '.join(SUPPORTED_ARCHS)} "
    "(default: the GPU's own for CUDA inputs, else sm_90)",
    "cache": "a polyfuse.cache.CompileCache shared across compiles",
    "max_specializations": "static compiles kept per graph with dynamic shapes (LRU; "
    f"an int >= 1, default {DEFAULT_MAX_SPECIALIZATIONS})",
}


class BackendOptionError(PolyfuseError, ValueError):
    """An option of ``torch.compile(backend="polyfuse")`` is unknown or has a bad value."""


@dataclass(frozen=True)
class BackendOptions:
    """The backend's validated options (see :data:`OPTIONS`). ``arch`` None: chosen from
    the inputs' device."""

    arch: str | None = None
    cache: Any = None
    max_specializations: int = DEFAULT_MAX_SPECIALIZATIONS


def _fail(what: str) -> BackendOptionError:
    return BackendOptionError(f'torch.compile(backend="polyfuse"): {what}')


def parse_options(
    options: Mapping[str, Any] | None = None, mode: str | None = None, **kwargs: Any
) -> BackendOptions:
    """Validate ``options`` (and keywords) into :class:`BackendOptions`.

    ``mode`` is Inductor's (``"max-autotune"``, ``"reduce-overhead"``…): polyfuse has no modes,
    so any mode other than ``"default"`` is an error rather than silently ignored.
    """
    if mode not in (None, "default"):
        raise _fail(
            f"mode={mode!r} is an Inductor mode; polyfuse takes none (pass options= with "
            f"{', '.join(OPTIONS)})"
        )
    if options is not None and not isinstance(options, Mapping):
        raise _fail(f"options must be a dict, not {type(options).__name__}")
    merged = {**(options or {}), **kwargs}
    unknown = sorted(k for k in merged if k not in OPTIONS)
    if unknown:
        listed = "; ".join(f"{k} ({v})" for k, v in OPTIONS.items())
        raise _fail(f"unknown option {unknown[0]!r}; valid options: {listed}")
    arch = merged.get("arch")
    if arch is not None and arch not in SUPPORTED_ARCHS:
        valid = ", ".join(SUPPORTED_ARCHS)
        raise _fail(f"option arch={arch!r} is not supported; use one of {valid}")
    cache = merged.get("cache")
    if cache is not None:
        from polyfuse.cache import CompileCache

        if not isinstance(cache, CompileCache):
            raise _fail(
                f"option cache= must be a polyfuse.cache.CompileCache, not {type(cache).__name__}"
            )
    limit = merged.get("max_specializations", DEFAULT_MAX_SPECIALIZATIONS)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise _fail(f"option max_specializations={limit!r} must be an int >= 1")
    return BackendOptions(arch=arch, cache=cache, max_specializations=limit)
