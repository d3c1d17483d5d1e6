"""Token sequences under keys in a radix tree: :class:`PrefixIndex`.

:class:`~offgraph_kv.hf.BatchGenerator` keeps one over the sequences its cache holds (running
and cached finished ones) and one over the prompts being prefilled, so finding the sequence that
holds the longest prefix of a prompt walks the prompt once (as vLLM's and SGLang's prefix caches
do) instead of comparing it with every held sequence.

Each node holds the tokens of the edge from its parent and the keys whose sequences cover that
edge whole; a key's sequence ends exactly at a node (insertion splits an edge where needed), and
a node's keys include its children's. Walking a prompt, the keys of the deepest node reached hold
the longest shared prefix; the keys of each shallower node on the way hold shorter ones.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

__all__ = ["PrefixIndex", "common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix: a binary search over slice comparisons (C speed)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class _Node:
    __slots__ = ("children", "edge", "keys", "parent")

    def __init__(self, edge: list[int], parent: _Node | None):
        self.edge = edge
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.keys: dict[Hashable, None] = {}  # insertion-ordered set


class PrefixIndex:
    """Token sequences under hashable keys; longest-prefix queries in time linear in the query.

    ``insert``, ``extend`` and ``remove`` cost the tokens they add (plus the tree's depth along
    the key's path); ``longest`` the prompt's length, plus one step per candidate taken.
    """

    def __init__(self) -> None:
        self._root = _Node([], None)
        self._end: dict[Hashable, _Node] = {}  # the node where each key's sequence ends
        self._len: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._end)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._end

    def length(self, key: Hashable) -> int:
        """Tokens held under ``key``."""
        return self._len[key]

    def insert(self, key: Hashable, tokens: Sequence[int]) -> None:
        """Hold ``tokens`` under a new ``key``."""
        if key in self._end:
            raise KeyError(f"key {key!r} is already indexed")
        self._root.keys[key] = None
        self._end[key] = self._root
        self._len[key] = 0
        self.extend(key, tokens)

    def extend(self, key: Hashable, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the sequence held under ``key``."""
        node = self._end[key]
        toks = list(tokens)
        i = 0
        while i < len(toks):
            child = node.children.get(toks[i])
            if child is None:
                if node is not self._root and not node.children and len(node.keys) == 1:
                    node.edge.extend(toks[i:])  # the key's own leaf: grow it in place
                else:
                    leaf = _Node(toks[i:], node)
                    leaf.keys[key] = None
                    node.children[toks[i]] = leaf
                    node = leaf
                break
            m = common_prefix(child.edge, toks[i : i + len(child.edge)])
            if m < len(child.edge):
                child = self._split(child, m)
            child.keys[key] = None
            node = child
            i += m
        self._end[key] = node
        self._len[key] += len(toks)

    def _split(self, node: _Node, m: int) -> _Node:
        """Cut ``node``'s edge after ``m`` tokens; returns the new upper node."""
        parent = node.parent
        assert parent is not None and 0 < m < len(node.edge)
        upper = _Node(node.edge[:m], parent)
        upper.keys = dict(node.keys)
        parent.children[node.edge[0]] = upper
        node.edge = node.edge[m:]
        node.parent = upper
        upper.children[node.edge[0]] = node
        return upper

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` (no-op when absent); prunes the nodes no key covers any more."""
        node = self._end.pop(key, None)
        if node is None:
            return
        del self._len[key]
        while node is not None:
            node.keys.pop(key, None)
            parent = node.parent
            if parent is not None and not node.keys:
                del parent.children[node.edge[0]]
            node = parent

    def truncate(self, key: Hashable, n: int) -> None:
        """Keep the first ``n`` tokens held under ``key``."""
        toks = self.tokens(key)[:n]
        self.remove(key)
        self.insert(key, toks)

    def tokens(self, key: Hashable) -> list[int]:
        """The sequence held under ``key``."""
        parts = []
        node: _Node | None = self._end[key]
        while node is not None:
            parts.append(node.edge)
            node = node.parent
        return [t for edge in reversed(parts) for t in edge]

    def longest(
        self, prompt: Sequence[int], limit: int | None = None
    ) -> Iterator[tuple[Hashable, int]]:
        """``(key, n)`` for every key sharing ``n >= 1`` leading tokens with ``prompt`` (``n``
        capped at ``limit``), longest first; newest key first among equals. Lazy: stop before
        changing the index."""
        limit = len(prompt) if limit is None else min(limit, len(prompt))
        node, depth = self._root, 0
        path: list[tuple[_Node, int]] = []
        while depth < limit:
            child = node.children.get(prompt[depth])
            if child is None:
                break
            span = min(len(child.edge), limit - depth)
            m = common_prefix(child.edge[:span], prompt[depth : depth + span])
            if m < len(child.edge):  # the prompt (or the limit) leaves mid-edge
                path.append((child, depth + m))
                break
            node, depth = child, depth + m
            path.append((node, depth))
        deeper: dict[Hashable, None] = {}
        for node, n in reversed(path):
            for key in reversed(node.keys):
                if key not in deeper:
                    yield key, n
            deeper = node.keys
