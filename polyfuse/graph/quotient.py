"""The merge engine behind Algorithm 1 (partition) and Algorithm 2 (stitching).

Both algorithms repeatedly contract a producer→consumer pair of a quotient DAG whose nodes are
groups of primitives (micrographs, kernel groups), refusing a pair whose contraction would
close a cycle. Doing that with graph copies and whole-graph path searches costs quadratic time
or worse in the model depth. :class:`QuotientDag` instead

* contracts in place: each edge carries the list of underlying edges (payloads), and the
  loser's adjacency is moved into the survivor;
* keeps membership in a union-find (``owner_of``) plus member lists merged small-into-large;
* maintains a topological order ``pos`` under contraction (Pearce–Kelly style): a pair p→c
  closes a cycle only through nodes placed strictly between ``pos[p]`` and ``pos[c]``, so the
  cycle check searches that interval only, and the nodes that must move after the contraction
  are exactly the ones that search visited plus the ancestors of ``c`` inside the interval.

Nodes are integers ``0..n-1`` given in a topological order of the initial graph.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Protocol


class MergeRule(Protocol):
    """What the merge loop needs of a rule: which kinds it fuses and the kind it yields."""

    result: Any

    def matches(self, p: Any, c: Any) -> bool: ...


class QuotientDag:
    """A DAG over groups that can be contracted in place along producer→consumer edges."""

    def __init__(self, n: int, kinds: Sequence[Any]) -> None:
        self.kind: list[Any] = list(kinds)
        self.members: list[list[int]] = [[i] for i in range(n)]
        self.first: list[int] = list(range(n))  # smallest member (initial position)
        self.pos: list[int] = list(range(n))  # a topological order of the live nodes
        self.alive: list[bool] = [True] * n
        self.version: list[int] = [0] * n  # bumped whenever a node's content changes
        self.succ: list[dict[int, list[Hashable]]] = [{} for _ in range(n)]
        self.pred: list[dict[int, list[Hashable]]] = [{} for _ in range(n)]
        self._parent: list[int] = list(range(n))
        self._label: list[int] = list(range(n))  # union-find root -> live node id
        self._sep: list[set[int]] | None = None
        self._forward: tuple[int, int, int, int, set[int]] | None = None

    # ---- building ---------------------------------------------------------------------
    def add_edge(self, u: int, v: int, payload: Hashable) -> None:
        """Record the underlying edge ``payload`` between the groups of ``u`` and ``v``."""
        u, v = self.owner_of(u), self.owner_of(v)
        if u == v:
            return
        lst = self.succ[u].get(v)
        if lst is None:
            lst = self.succ[u][v] = []
            self.pred[v][u] = lst
        lst.append(payload)

    def separate(self, a: int, b: int) -> None:
        """Members ``a`` and ``b`` must never end up in one group."""
        if self._sep is None:
            self._sep = [set() for _ in self.kind]
        self._sep[self.owner_of(a)].add(b)
        self._sep[self.owner_of(b)].add(a)

    # ---- the merge loop ----------------------------------------------------------------
    def contract_by_rules(
        self,
        rules: Sequence[MergeRule],
        accept: Callable[[Any, int, int], bool],
        by_first: bool = True,
        keep_producer: bool = False,
    ) -> None:
        """The loop both algorithms run: rules in priority order; under each, the first
        matching pair (by :meth:`edge_key`) that ``accept(rule, p, c)`` agrees to is
        contracted into one node of kind ``rule.result`` (the consumer survives, or the
        producer with ``keep_producer``), until no pair is left. ``accept`` checks legality
        (e.g. :meth:`cycle_via`) and records the decision either way."""
        for rule in rules:
            heap = [self.edge_key(p, c, by_first) for p, c in self.edges()]
            heapq.heapify(heap)
            while heap:
                entry = heapq.heappop(heap)
                if not self.current(entry):
                    continue
                p, c = entry[2], entry[3]
                if not rule.matches(self.kind[p], self.kind[c]) or not accept(rule, p, c):
                    continue
                keep = self.merge(p, c, rule.result, keep=p if keep_producer else c)
                for u, v in self.incident_edges(keep):
                    heapq.heappush(heap, self.edge_key(u, v, by_first))

    # ---- queries ----------------------------------------------------------------------
    def owner_of(self, member: int) -> int:
        """The live node holding ``member`` (union-find with path halving)."""
        parent = self._parent
        while parent[member] != member:
            parent[member] = parent[parent[member]]
            member = parent[member]
        return self._label[member]

    def edges(self) -> Iterator[tuple[int, int]]:
        for u, out in enumerate(self.succ):
            if self.alive[u]:
                for v in out:
                    yield u, v

    def incident_edges(self, n: int) -> list[tuple[int, int]]:
        return [(u, n) for u in self.pred[n]] + [(n, s) for s in self.succ[n]]

    def payloads(self, p: int, c: int) -> list[Hashable]:
        """The underlying edges from group ``p`` to group ``c``."""
        return self.succ[p].get(c, [])

    def edge_key(self, p: int, c: int, by_first: bool = True) -> tuple[int, ...]:
        """Heap entry for edge p→c: ordered by the groups' first members (or ids), tagged
        with versions so that an entry made stale by a later merge can be recognised."""
        a, b = (self.first[p], self.first[c]) if by_first else (p, c)
        return (a, b, p, c, self.version[p], self.version[c])

    def current(self, entry: tuple[int, ...]) -> bool:
        """Whether a heap entry from :meth:`edge_key` still describes a live edge."""
        p, c, vp, vc = entry[2], entry[3], entry[4], entry[5]
        return (
            self.alive[p]
            and self.alive[c]
            and self.version[p] == vp
            and self.version[c] == vc
            and c in self.succ[p]
        )

    def separated(self, p: int, c: int) -> bool:
        if self._sep is None:
            return False
        sp, sc = self._sep[p], self._sep[c]
        if not sp and not sc:
            return False
        return not sp.isdisjoint(self.members[c])

    def cycle_via(self, p: int, c: int) -> int | None:
        """A successor of ``p`` (other than ``c``) from which ``c`` is reachable, i.e. a node
        that contracting p→c would put on a cycle; None when the contraction is safe.

        Only nodes placed between ``p`` and ``c`` in the topological order can lie on such a
        path, so the search stays inside that interval.
        """
        pos, succ = self.pos, self.succ
        limit = pos[c]
        seen: set[int] = set()
        for s in sorted(succ[p], key=pos.__getitem__):
            if s == c or pos[s] >= limit or s in seen:
                continue
            seen.add(s)
            stack = [s]
            while stack:
                x = stack.pop()
                for y in succ[x]:
                    if y == c:
                        return s
                    if pos[y] < limit and y not in seen:
                        seen.add(y)
                        stack.append(y)
        self._forward = (p, c, self.version[p], self.version[c], seen)
        return None

    # ---- contraction ------------------------------------------------------------------
    def merge(self, p: int, c: int, kind: Any, keep: int | None = None) -> int:
        """Contract edge p→c (checked acyclic by :meth:`cycle_via`) into node ``keep``
        (default: the consumer ``c``); the merged node gets ``kind``. Returns ``keep``."""
        keep = c if keep is None else keep
        gone = p if keep == c else c
        fw = self._forward
        if fw is not None and fw[:4] == (p, c, self.version[p], self.version[c]):
            forward = fw[4]
        else:
            if self.cycle_via(p, c) is not None:
                raise ValueError(f"contracting {p}->{c} would create a cycle")
            forward = self._forward[4]  # type: ignore[index]
        self._forward = None
        if forward:
            self._reorder(c, forward)
        merged_pos = self.pos[c]
        # Move the edges of `gone` onto `keep`.
        del self.succ[p][c]
        del self.pred[c][p]
        for u, lst in self.pred[gone].items():
            del self.succ[u][gone]
            self._join(u, keep, lst)
        for s, lst in self.succ[gone].items():
            del self.pred[s][gone]
            self._join(keep, s, lst)
        self.pred[gone], self.succ[gone] = {}, {}
        # Membership: union-find by size, member lists small-into-large.
        mk, mg = self.members[keep], self.members[gone]
        if len(mg) > len(mk):
            mk, mg = mg, mk
        ra, rb = self._root(mk[0]), self._root(mg[0])
        self._parent[rb] = ra
        self._label[ra] = keep
        mk.extend(mg)
        self.members[keep], self.members[gone] = mk, []
        if self._sep is not None:
            sk, sg = self._sep[keep], self._sep[gone]
            if len(sg) > len(sk):
                sk, sg = sg, sk
            sk |= sg
            self._sep[keep], self._sep[gone] = sk, set()
        self.first[keep] = min(self.first[p], self.first[c])
        self.kind[keep] = kind
        self.pos[keep] = merged_pos
        self.alive[gone] = False
        self.version[keep] += 1
        self.version[gone] += 1
        return keep

    def _root(self, member: int) -> int:
        parent = self._parent
        while parent[member] != member:
            parent[member] = parent[parent[member]]
            member = parent[member]
        return member

    def _join(self, u: int, v: int, lst: list[Hashable]) -> None:
        have = self.succ[u].get(v)
        if have is None:
            self.succ[u][v] = lst
            self.pred[v][u] = lst
        else:
            have.extend(lst)

    def _reorder(self, c: int, forward: set[int]) -> None:
        """Make room for edges c→forward: ``forward`` (closed under successors below
        ``pos[c]``) moves after ``c`` and the ancestors of ``c`` above it (Pearce–Kelly)."""
        pos, pred = self.pos, self.pred
        lb = min(pos[x] for x in forward)
        back = {c}
        stack = [c]
        while stack:
            x = stack.pop()
            for u in pred[x]:
                if pos[u] > lb and u not in back:
                    back.add(u)
                    stack.append(u)
        b_nodes = sorted(back, key=pos.__getitem__)
        f_nodes = sorted(forward, key=pos.__getitem__)
        pool = sorted(pos[x] for x in b_nodes + f_nodes)
        for x, slot in zip(b_nodes + f_nodes, pool, strict=True):
            pos[x] = slot

    # ---- results ----------------------------------------------------------------------
    def live(self) -> list[int]:
        return [n for n, a in enumerate(self.alive) if a]

    def lexicographic_order(self, by_first: bool = True) -> list[int]:
        """Live nodes in dependence order, ties broken by first member (or by id)."""
        key = self.first if by_first else list(range(len(self.alive)))
        indeg = {n: len(self.pred[n]) for n in self.live()}
        heap = [(key[n], n) for n, d in indeg.items() if d == 0]
        heapq.heapify(heap)
        out = []
        while heap:
            _, n = heapq.heappop(heap)
            out.append(n)
            for s in self.succ[n]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(heap, (key[s], s))
        return out
