"""The one visitor base: dispatch on a node's class through a table built once per subclass.

Expression walkers (:class:`polyfuse.graph.expr.ExprVisitor`) and kernel-IR walkers
(:class:`polyfuse.cuda.codegen.kernel_ast.KVisitor`) both derive from :class:`Visitor`; each names
its
node classes in :attr:`Visitor.node_classes`, so a walker is a set of ``visit_<Node>`` methods
instead of an isinstance chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

R = TypeVar("R")


class Visitor(Generic[R]):
    """``visit(n, *args)`` calls ``visit_<Node>(n, *args)`` for ``n``'s exact class.

    The class → method table is built once per subclass from :attr:`node_classes`, so dispatch
    is one dict lookup per node; a node class without a ``visit_<Node>`` method goes to
    :meth:`visit_default`, which raises. Walkers override only the nodes they handle.
    """

    #: the node classes this family of walkers dispatches on
    node_classes: ClassVar[tuple[type, ...]] = ()
    _dispatch: ClassVar[dict[type, Callable[..., Any]]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls._dispatch = {
            node: getattr(cls, f"visit_{node.__name__}")
            for node in cls.node_classes
            if hasattr(cls, f"visit_{node.__name__}")
        }

    def visit(self, n: Any, *args: Any) -> R:
        fn = self._dispatch.get(type(n))
        if fn is None:
            return self.visit_default(n, *args)
        return fn(self, n, *args)

    def visit_default(self, n: Any, *args: Any) -> R:
        raise TypeError(f"{type(self).__name__} has no rule for {type(n).__name__} ({n!r})")
