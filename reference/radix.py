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

from reference.case import OUTPUT_TOKEN, Request, segment_tokens

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
        have = _STREAM_BYTES[name] = have + array("H", segment_tokens(name, grow)[len(have) // TOKEN_BYTES :]).tobytes()
    return have[:need]


def output_bytes(length: int) -> bytes:
    """The first ``length`` tokens of any request's output as bytes."""
    return array("H", [OUTPUT_TOKEN]).tobytes() * length


def prompt_bytes(request: Request) -> bytes:
    """A request's prompt tokens as bytes (its segments' streams joined; an
    output segment's :data:`~reference.tokens.OUTPUT_TOKEN` copies)."""
    return b"".join(
        output_bytes(s.length) if s.output is not None else stream_bytes(s.segment, s.length) for s in request.prompt
    )


@dataclass(eq=False)
class _Node:
    """The end of an edge: ``label`` (bytes) leads here from the parent; the
    node sits at token ``depth``. Per channel (one per simulation sharing
    the tree): ``states[channel][M]`` holds the kept states p (block size M)
    whose mark depth p + L lies on this edge, ``tails[channel]`` the partial
    tails t with t + L on it."""

    label: bytes
    depth: int
    children: dict[bytes, _Node] = field(default_factory=dict)
    states: dict[int, dict[int, set[int]]] = field(default_factory=dict)
    tails: dict[int, set[int]] = field(default_factory=dict)


@dataclass
class Match:
    """What one walk found: ``shared`` (the longest common prefix with any
    cached prompt), per channel the reachable states per Mamba block size
    and the reachable tails, and where the walk stopped (for
    :meth:`PrefixIndex.place`)."""

    shared: int
    channel_states: list[dict[int, set[int]]]
    channel_tails: list[list[int]]
    path: list[_Node]
    #: The edge the walk stopped inside (None: it stopped on a node).
    partial: _Node | None = None

    @property
    def states(self) -> dict[int, set[int]]:
        return self.channel_states[0]

    @property
    def tails(self) -> list[int]:
        return self.channel_tails[0]


@dataclass
class Placed:
    """A prompt's path in the tree once placed: its nodes and their depths."""

    path: list[_Node]
    depths: list[int]
    tokens: int


def common_prefix(a: bytes | list[int], b: bytes | list[int], skip: int = 0) -> int:
    """The length of the longest common prefix of two sequences (byte
    strings or token lists), given that their first ``skip`` items are
    known to be equal, by halving slice comparisons (each done in C)."""
    lo, hi = min(skip, len(a), len(b)), min(len(a), len(b))
    if a[lo:hi] == b[lo:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixIndex:
    """The cached prompts of a serial trace with their marks (module
    docstring), for ``channels`` simulations that share the prompts (e.g. one
    per retention setting) and differ in what they kept."""

    def __init__(self, lookahead: int = 0, channels: int = 1) -> None:
        self.lookahead = lookahead
        self.channels = channels
        self.root = _Node(b"", 0)
        self.prompts = 0

    def query(self, data: bytes) -> Match:
        """Walk ``data`` (a prompt's bytes) down the tree; collect, per
        channel, the marks at depths it shares."""
        node, pos = self.root, 0
        states: list[dict[int, set[int]]] = [{} for _ in range(self.channels)]
        tails: list[list[int]] = [[] for _ in range(self.channels)]
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
            pos += common_prefix(piece, label) // TOKEN_BYTES
            _collect(child, states, tails, pos, L)
            partial = child
            break
        return Match(pos, states, tails, path, partial)

    def place(self, data: bytes, match: Match) -> Placed:
        """Add a prompt (``data``, walked by ``match``) to the tree: split the
        edge the walk stopped inside, hang its own tokens below."""
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
        self.prompts += 1
        return Placed(path, [x.depth for x in path], n)

    def mark(self, placed: Placed, channel: int, states: dict[int, set[int]], tail: int) -> None:
        """Record, in one channel, the states a placed prompt kept and its
        full-attention partial tail (0: none)."""
        path, depths, L = placed.path, placed.depths, self.lookahead
        for M, kept in states.items():
            for p in kept:
                node = path[bisect_left(depths, p + L)]
                node.states.setdefault(channel, {}).setdefault(M, set()).add(p)
        if tail and tail + L <= placed.tokens:
            path[bisect_left(depths, tail + L)].tails.setdefault(channel, set()).add(tail)

    def insert(self, data: bytes, match: Match, states: dict[int, set[int]], tail: int) -> None:
        """:meth:`place` the prompt and :meth:`mark` channel 0."""
        self.mark(self.place(data, match), 0, states, tail)

    def _split(self, parent: _Node, child: _Node, depth: int) -> _Node:
        """Cut the edge parent -> child at token ``depth``; the marks at or
        above it move to the new middle node."""
        cut = (depth - parent.depth) * TOKEN_BYTES
        mid = _Node(child.label[:cut], depth)
        child.label = child.label[cut:]
        parent.children[mid.label[:TOKEN_BYTES]] = mid
        mid.children[child.label[:TOKEN_BYTES]] = child
        L = self.lookahead
        for channel, by_size in child.states.items():
            for M, kept in by_size.items():
                up = {p for p in kept if p + L <= depth}
                if up:
                    mid.states.setdefault(channel, {})[M] = up
                    kept -= up
        for channel, tails in child.tails.items():
            up_tails = {t for t in tails if t + L <= depth}
            if up_tails:
                mid.tails[channel] = up_tails
                tails -= up_tails
        return mid

    def state_count(self, channel: int = 0) -> dict[int, int]:
        """Distinct kept states per Mamba block size in one channel."""
        out: dict[int, int] = {}
        stack = [self.root]
        while stack:
            node = stack.pop()
            for M, kept in node.states.get(channel, {}).items():
                out[M] = out.get(M, 0) + len(kept)
            stack.extend(node.children.values())
        return out


def _collect(node: _Node, states: list[dict[int, set[int]]], tails: list[list[int]], limit: int | None, L: int) -> None:
    """Add a node's marks to the walk's collection, per channel: all of
    them, or, when the walk stopped inside the node's edge at token
    ``limit``, those whose mark depth (p + L, t + L) is at most ``limit``."""
    for channel, by_size in node.states.items():
        into = states[channel]
        for M, kept in by_size.items():
            reach = kept if limit is None else {p for p in kept if p + L <= limit}
            if reach:
                into.setdefault(M, set()).update(reach)
    for channel, marks in node.tails.items():
        tails[channel].extend(marks if limit is None else (t for t in marks if t + L <= limit))
