"""Model arguments: what a user names on the command line, resolved and loaded in one place.

``polyfuse zoo``, ``polyfuse viz`` and ``polyfuse explain`` all take model arguments. A model
argument is one of

* a built-in zoo model name (:data:`polyfuse.zoo.MODELS`), built at a size (``full``/``tiny``);
* a built-in example name (:data:`polyfuse.examples.EXAMPLES`);
* an ``.onnx`` file, or a directory searched recursively for ``.onnx`` files;
* a ``.py`` file defining ``inputs`` and ``outputs`` (and optional ``constants``);
* ``module:function``, a builder returning ``(inputs, outputs[, constants])``.

:func:`resolve_models` turns arguments into :class:`ModelSource` records (an argument that
names nothing becomes an ``invalid`` source with the reason, so a batch can report it as a
failed model); :func:`load_model` builds the graph of one source.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import runpy
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyfuse.errors import PolyfuseError

__all__ = ["LoadedModel", "ModelSource", "load_model", "resolve_model", "resolve_models"]

log = logging.getLogger(__name__)

#: ModelSource.kind values.
KINDS = ("zoo", "example", "onnx", "pyfile", "python", "invalid")


@dataclass(frozen=True)
class ModelSource:
    """One resolved model argument: ``label`` names it in reports, ``spec`` is what loads it."""

    label: str
    kind: str  # one of KINDS
    spec: str
    reason: str = ""  # why an ``invalid`` source names nothing


@dataclass
class LoadedModel:
    """A model's graph: its input and output tensors and the constants bound to inputs."""

    name: str
    inputs: list[Any]
    outputs: list[Any]
    constants: dict[Any, Any] = field(default_factory=dict)


def _known() -> str:
    from polyfuse import zoo
    from polyfuse.examples import EXAMPLES

    return (
        f"a zoo model ({', '.join(zoo.MODELS)}), an example ({', '.join(EXAMPLES)}), an .onnx "
        "file or a directory of them, a .py file defining inputs/outputs, or module:function"
    )


def resolve_models(args: Sequence[str]) -> list[ModelSource]:
    """Model arguments → sources (no argument: the whole built-in zoo); a directory expands
    to its ``.onnx`` files; an argument that names nothing becomes an ``invalid`` source."""
    from polyfuse import zoo
    from polyfuse.examples import EXAMPLES

    out: list[ModelSource] = []
    for s in args or list(zoo.MODELS):
        p = Path(s)
        if p.is_dir() and s not in zoo.MODELS and s not in EXAMPLES:
            files = sorted(p.rglob("*.onnx"))
            if not files:
                out.append(ModelSource(s, "invalid", s, f"no .onnx files in {s}"))
            for f in files:
                label = str(f.relative_to(p).with_suffix("")) if f.parent != p else f.stem
                out.append(ModelSource(f"{p.name}/{label}", "onnx", str(f)))
        else:
            out.append(resolve_model(s))
    return out


def resolve_model(s: str) -> ModelSource:
    """One model argument (not a directory) → its source; ``invalid`` when it names nothing."""
    from polyfuse import zoo
    from polyfuse.examples import EXAMPLES

    p = Path(s)
    if s in zoo.MODELS:
        return ModelSource(s, "zoo", s)
    if s in EXAMPLES:
        return ModelSource(s, "example", s)
    if s.endswith((".onnx", ".py")):
        kind = "onnx" if s.endswith(".onnx") else "pyfile"
        if p.is_file():
            return ModelSource(p.stem, kind, str(p))
        return ModelSource(p.stem, "invalid", s, f"no such file: {s}")
    if ":" in s and not p.exists():
        mod, _, fn = s.partition(":")
        try:
            if not mod or not fn:
                raise PolyfuseError(f"'{s}': write module:function")
            _builder(s)
        except PolyfuseError as e:
            return ModelSource(s, "invalid", s, str(e))
        return ModelSource(fn, "python", s)
    return ModelSource(s, "invalid", s, f"unknown model '{s}': not {_known()}")


@contextlib.contextmanager
def _cwd_importable() -> Iterator[None]:
    """The current directory importable, as under ``python -m`` (the ``polyfuse`` script
    alone would not find a ``module:function`` next to the user)."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _run_pyfile(path: str) -> dict[str, Any]:
    """Run a ``.py`` model; its mistakes become one-line :class:`PolyfuseError` s."""
    try:
        return runpy.run_path(path)
    except PolyfuseError:
        raise
    except SyntaxError as e:
        raise PolyfuseError(f"'{path}' line {e.lineno}: syntax error: {e.msg}") from e
    except Exception as e:
        raise PolyfuseError(f"'{path}' raised {_what(e)}") from e


def _builder(spec: str) -> Callable[[], Any]:
    """The function of ``module:function`` (its module imported, from the current directory
    too); a missing or broken module or function is a one-line error."""
    mod_name, _, fn_name = spec.partition(":")
    try:
        with _cwd_importable():
            mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name is None or not f"{mod_name}.".startswith(f"{e.name}."):
            raise PolyfuseError(f"'{spec}': cannot import '{mod_name}' ({_what(e)})") from e
        where = "here or on the Python path"
        raise PolyfuseError(f"'{spec}': no module named '{e.name}' ({where})") from e
    except SyntaxError as e:
        where = f"{e.filename} line {e.lineno}"
        raise PolyfuseError(f"'{spec}': {where}: syntax error: {e.msg}") from e
    except Exception as e:
        raise PolyfuseError(f"'{spec}': cannot import module '{mod_name}' ({_what(e)})") from e
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise PolyfuseError(f"'{spec}': module '{mod_name}' has no function '{fn_name}'")
    return fn


def _call_builder(spec: str) -> tuple:
    """Call ``module:function``; its mistakes become one-line errors."""
    fn = _builder(spec)
    try:
        result = fn()
    except PolyfuseError:
        raise
    except Exception as e:
        raise PolyfuseError(f"'{spec}' raised {_what(e)}") from e
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise PolyfuseError(
            f"'{spec}' must return (inputs, outputs) or (inputs, outputs, constants)"
        )
    return tuple(result)


def _what(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}".rstrip(": ")


def load_model(
    source: ModelSource | str,
    size: str = "full",
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> LoadedModel:
    """Build the graph of ``source`` (a :class:`ModelSource` or a model argument). Zoo models
    get zero weights (compiling needs shapes only); ``shapes`` fixes an ONNX model's dynamic
    input dims. Raises :class:`PolyfuseError` for an invalid source or a bad file."""
    src = resolve_model(source) if isinstance(source, str) else source
    name = os.path.splitext(os.path.basename(src.spec))[0]
    if src.kind != "invalid":
        log.info("loading %s model '%s' (size %s)", src.kind, src.spec, size)
    if src.kind == "zoo":
        from polyfuse import zoo

        m = zoo.build(src.spec, size, weights="zeros")
        return LoadedModel(name, list(m.inputs), list(m.outputs), dict(m.constants or {}))
    if src.kind == "example":
        from polyfuse.examples import EXAMPLES

        inputs, outputs, _ = EXAMPLES[src.spec].build()
        return LoadedModel(name, list(inputs), list(outputs))
    if src.kind == "onnx":
        try:
            import polyfuse.onnx as pf_onnx
        except ImportError as e:
            raise PolyfuseError(f"ONNX import not available ({e})") from None
        m = pf_onnx.load(src.spec, shapes=shapes or None)
        return LoadedModel(name, list(m.inputs), list(m.outputs), dict(m.constants or {}))
    if src.kind == "pyfile":
        ns = _run_pyfile(src.spec)
        if "inputs" not in ns or "outputs" not in ns:
            raise PolyfuseError(f"'{src.spec}' must define 'inputs' and 'outputs'")
        return _checked(name, src.spec, ns["inputs"], ns["outputs"], ns.get("constants"))
    if src.kind == "python":
        inputs, outputs, *rest = _call_builder(src.spec)
        return _checked(src.label, src.spec, inputs, outputs, rest[0] if rest else None)
    raise PolyfuseError(src.reason or f"cannot load model '{src.spec}'")


def _checked(name: str, spec: str, inputs: Any, outputs: Any, constants: Any) -> LoadedModel:
    """A user's model as :class:`LoadedModel`, once its parts are what they must be: a te
    tensor or a list of them (inputs, outputs), a dict tensor -> array (constants)."""
    from polyfuse.graph.expr import Tensor

    def tensors(value: Any, what: str) -> list[Any]:
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        bad = [t for t in items if not isinstance(t, Tensor)]
        if bad:
            raise PolyfuseError(
                f"'{spec}': {what} must be a te tensor or a list of them, not "
                f"{type(bad[0]).__name__}"
            )
        return items

    if constants is not None and not isinstance(constants, dict):
        raise PolyfuseError(
            f"'{spec}': constants must be a dict (input tensor -> array), not "
            f"{type(constants).__name__}"
        )
    return LoadedModel(
        name, tensors(inputs, "inputs"), tensors(outputs, "outputs"), dict(constants or {})
    )
