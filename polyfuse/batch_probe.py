"""What a Ray worker needs to compile polyfuse models, checked on the worker itself.

Before a batch runs on a Ray cluster, :func:`probe` runs once on every node that can take a
model. Ray pickles it *by value* (:mod:`polyfuse.batch_ray` registers this module so), so it
runs and answers even where polyfuse itself cannot be imported. It reports what that node has:
islpy, polyfuse (its version and the digest of its compiler sources, the model cache key's
salt) and Python. :func:`problems` compares each answer with this process and says, per node,
what is missing or different, and what to install.

This module imports nothing from polyfuse at module level: its functions travel alone.
"""

from __future__ import annotations

from typing import Any

__all__ = ["probe", "problems"]


def probe() -> dict[str, Any]:
    """What this process has: ``islpy``/``polyfuse`` versions (None when they cannot be
    imported, with ``<name>_error`` saying why), the compiler ``digest``, ``python``, ``host``."""
    import importlib
    import platform
    import socket

    out: dict[str, Any] = {"host": socket.gethostname(), "python": platform.python_version()}
    for name in ("islpy", "polyfuse"):
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # missing, or broken: either way the models cannot compile
            out[name] = None
            out[f"{name}_error"] = f"{type(e).__name__}: {' '.join(str(e).split())}"
        else:
            out[name] = str(getattr(mod, "__version__", "unknown"))
    out["digest"] = None
    if out["polyfuse"] is not None:
        try:
            from polyfuse.batch_hash import compiler_digest

            out["digest"] = compiler_digest()
        except Exception as e:
            out["polyfuse_error"] = f"{type(e).__name__}: {' '.join(str(e).split())}"
    return out


def problems(answers: dict[str, dict[str, Any]], here: dict[str, Any]) -> list[str]:
    """One phrase per node (``answers``: node name -> :func:`probe`'s answer there, or
    ``{"error": why}`` when it gave none) that cannot compile what this process (``here``)
    compiles; empty when every node can."""
    want = here.get("polyfuse")
    out = []
    for node, a in answers.items():
        what: list[str] = []
        if "error" in a:
            what.append(a["error"])
        else:
            if a.get("islpy") is None:
                what.append(f"islpy is missing ({a.get('islpy_error')}): pip install islpy")
            if a.get("polyfuse") is None:
                err = a.get("polyfuse_error", "")
                if a.get("islpy") is not None or "islpy" not in err:
                    what.append(f"polyfuse cannot be imported ({err}): install polyfuse {want}")
            elif a["polyfuse"] != want:
                what.append(
                    f"it runs polyfuse {a['polyfuse']}, this machine {want}: install polyfuse "
                    f"{want} there"
                )
            elif a.get("digest") != here.get("digest"):
                what.append(
                    f"its polyfuse {want} is built from other sources (compiler digest "
                    f"{a.get('digest')}, here {here.get('digest')}): install the same polyfuse"
                )
        if what:
            host = f" ({a['host']})" if a.get("host") else ""
            out.append(f"worker on {node}{host}: {'; '.join(what)}")
    return out
