"""A radix tree of the cached prompts: what ``serial.simulate`` asks of the
cache in one walk down the request's own tokens.

The serial model needs, for a request R, three things from the prompts
cached before it:

* ``shared``: the longest common prefix of R with any cached prompt;
* the Mamba states a cached prompt e kept at p that R can reach: those with
  ``p + L <= lcp(e, R)`` (L = hash lookahead tokens);
* the full-attention partial tails t of the cached prompts with
  ``t + L <= lcp(e, R)``.

Each kept state (and each tail) is a *mark* stored at token depth ``p + L``
on the path of the prompt that kept it. A mark at depth d on e's path lies
on R's path exactly when e and R share their first d tokens, so the marks met
while walking R's tokens down the tree are exactly the reachable ones, and
the depth the walk reaches is ``shared``. Comparing R with every earlier
prompt costs time linear in the number of earlier prompts (quadratic over a
trace whose requests share a system prompt); the walk costs the number of
branch points on R's path.

Tokens are held as bytes (two per token: ids are below 65,536), so an edge
is compared with one slice comparison. Marks are kept in sets, so a state
kept by many prompts at the same prefix is one mark: :meth:`PrefixIndex.state_count`
is the number of distinct cached states (a state's prefix, lookahead
included, names it, as vLLM's block hash does).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from dataclasses import dataclass, field

from reference.case import Request, segment_tokens

#: Bytes per token in the tree's keys.
TOKEN_BYTES = 2
_STREAM_BYTES: dict[str, bytes] = {}


def stream_bytes(name: str, length: int) -> bytes:
    """The first ``length`` tokens of stream ``name`` as bytes (two per
    token, machine order): :func:`reference.case.segment_tokens`, packed. The
    packed stream is kept and grown by doubling, so packing costs time linear
    in the longest length asked."""
    have = _STREAM_BYTES.get(name, b"")
    need = length * TOKEN_BYTES
    if len(have) < need:
        grow = max(length, 2 * len(have) // TOKEN_BYTES)
        have = _STREAM_BYTES[name] = array("H", segment_tokens(name, grow)).tobytes()
    return have[:need]


def prompt_bytes(request: Request) -> bytes:
    """A request's prompt tokens as bytes (its segments' streams joined)."""
    return b"".join(stream_bytes(s.segment, s.length) for s in request.prompt)


@dataclass(eq=False)
class _Node:
    """The end of an edge: ``label`` (bytes) leads here from the parent; the
    node sits at token ``depth``. ``states[M]`` holds the kept states p
    (block size M) whose mark depth p + L lies on this edge, ``tails`` the
    partial tails t with t + L on it."""

    label: bytes
    depth: int
    children: dict[bytes, _Node] = field(default_factory=dict)
    states: dict[int, set[int]] = field(default_factory=dict)
    tails: set[int] = field(default_factory=set)


@dataclass
class Match:
    """What one walk found: ``shared`` (the longest common prefix with any
    cached prompt), the reachable ``states`` per Mamba block size, the
    reachable ``tails``, and where the walk stopped (for :meth:`PrefixIndex.insert`)."""

    shared: int
    states: dict[int, set[int]]
    tails: list[int]
    path: list[_Node]
    #: The edge the walk stopped inside (None: it stopped on a node).
    partial: _Node | None = None


def _lcp_bytes(a: bytes, b: bytes) -> int:
    """The longest common prefix of two byte strings, by halving slice
    comparisons (each done in C)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixIndex:
    """The cached prompts of a serial trace with their marks (module docstring)."""

    def __init__(self, lookahead: int = 0) -> None:
        self.lookahead = lookahead
        self.root = _Node(b"", 0)
        self.prompts = 0

    def query(self, data: bytes) -> Match:
        """Walk ``data`` (a prompt's bytes) down the tree; collect the marks
        at depths it shares."""
        node, pos = self.root, 0
        states: dict[int, set[int]] = {}
        tails: list[int] = []
        path = [node]
        partial = None
        L = self.lookahead
        while True:
            at = pos * TOKEN_BYTES
            child = node.children.get(data[at : at + TOKEN_BYTES])
            if child is None:
                break
            label = child.label
            piece = data[at : at + len(label)]
            if piece == label:
                _collect(child, states, tails, None, L)
                node, pos = child, child.depth
                path.append(child)
                continue
            shared = _lcp_bytes(piece, label) // TOKEN_BYTES
            pos += shared
            _collect(child, states, tails, pos, L)
            partial = child
            break
        return Match(pos, states, tails, path, partial)

    def insert(self, data: bytes, match: Match, states: dict[int, set[int]], tail: int) -> None:
        """Add a prompt (``data``, walked by ``match``) with the states it
        kept and its full-attention partial tail (0: none)."""
        n = len(data) // TOKEN_BYTES
        path = list(match.path)
        parent = path[-1]
        pos = match.shared
        if match.partial is not None and pos > parent.depth:
            parent = self._split(parent, match.partial, pos)
            path.append(parent)
        if pos < n:
            leaf = _Node(data[pos * TOKEN_BYTES :], n)
            parent.children[leaf.label[:TOKEN_BYTES]] = leaf
            path.append(leaf)
        depths = [x.depth for x in path]
        L = self.lookahead
        for M, kept in states.items():
            for p in kept:
                node = path[bisect_left(depths, p + L)]
                node.states.setdefault(M, set()).add(p)
        if tail and tail + L <= n:
            path[bisect_left(depths, tail + L)].tails.add(tail)
        self.prompts += 1

    def _split(self, parent: _Node, child: _Node, depth: int) -> _Node:
        """Cut the edge parent -> child at token ``depth``; the marks at or
        above it move to the new middle node."""
        cut = (depth - parent.depth) * TOKEN_BYTES
        mid = _Node(child.label[:cut], depth)
        child.label = child.label[cut:]
        parent.children[mid.label[:TOKEN_BYTES]] = mid
        mid.children[child.label[:TOKEN_BYTES]] = child
        L = self.lookahead
        for M, kept in child.states.items():
            up = {p for p in kept if p + L <= depth}
            if up:
                mid.states[M] = up
                kept -= up
        up_tails = {t for t in child.tails if t + L <= depth}
        mid.tails = up_tails
        child.tails -= up_tails
        return mid

    def state_count(self) -> dict[int, int]:
        """Distinct kept states per Mamba block size, over the whole tree."""
        out: dict[int, int] = {}
        stack = [self.root]
        while stack:
            node = stack.pop()
            for M, kept in node.states.items():
                out[M] = out.get(M, 0) + len(kept)
            stack.extend(node.children.values())
        return out


def _collect(node: _Node, states: dict[int, set[int]], tails: list[int], limit: int | None, L: int) -> None:
    """Add a node's marks to the walk's collection: all of them, or, when
    the walk stopped inside the node's edge at token ``limit``, those whose
    mark depth (p + L, t + L) is at most ``limit``."""
    if limit is None:
        for M, kept in node.states.items():
            if kept:
                states.setdefault(M, set()).update(kept)
        tails.extend(node.tails)
        return
    for M, kept in node.states.items():
        reach = {p for p in kept if p + L <= limit}
        if reach:
            states.setdefault(M, set()).update(reach)
    tails.extend(t for t in node.tails if t + L <= limit)
