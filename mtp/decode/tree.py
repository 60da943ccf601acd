"""Draft trees: which candidates of which heads one self-speculative step verifies, in one forward.

A tree is a list of paths in Medusa's ``medusa_choices`` format: path ``(r1, ..., rd)`` is the node at depth d
whose token is the rank-rd candidate of draft head d + 1 (head 2 drafts depth 1), below the node ``(r1, ...,
r(d-1))``. Every path's parent must be in the tree. A step's input is [the token head 1 chose, the tree's nodes]:
node i attends to the cached context, the root and its own ancestors (:attr:`DraftTree.attends`), at position
(root's position + depth), so one forward gives head 1's distribution after every node, and the longest path whose
every node head 1 accepts wins. A chain of k - 1 drafts is the tree ``[(0,), (0, 0), ...]``.

Trees fitted to a model (:func:`fit_tree`) pick the nodes most likely to be accepted, from how often each path of
candidate ranks matched the model's own continuations of held-out text (Medusa's greedy construction, with the
joint frequency of each rank path instead of a product of per-head accuracies).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

from mtp.errors import UserError


class DraftTree:
    """A static draft tree. Node 0 is the root (the token head 1 chose); nodes 1..N follow ``paths``, parents first."""

    def __init__(self, paths: Iterable[Sequence[int]]) -> None:
        paths = sorted({tuple(int(r) for r in p) for p in paths}, key=lambda p: (len(p), p))
        if not paths:
            raise ValueError("a draft tree needs at least one path")
        index = {(): 0} | {p: i + 1 for i, p in enumerate(paths)}
        for p in paths:
            if not p or min(p) < 0:
                raise ValueError(f"path {list(p)} is not a list of ranks >= 0")
            if p[:-1] not in index:
                raise ValueError(f"path {list(p)} has no parent {list(p[:-1])} in the tree")
        self.paths = paths
        self.size = len(paths)  # nodes besides the root
        self.depth = max(map(len, paths))
        self.node_depth = [0] + [len(p) for p in paths]
        self.node_rank = [0] + [p[-1] for p in paths]
        self.parent = [0] + [index[p[:-1]] for p in paths]
        self.ranks_at_depth = [1 + max(p[-1] for p in paths if len(p) == d) for d in range(1, self.depth + 1)]
        children: list[list[int]] = [[] for _ in range(self.size + 1)]
        for i in range(1, self.size + 1):
            children[self.parent[i]].append(i)  # in rank order: paths are sorted
        self.children = children
        # read at every step: computed once
        self._depth_nodes = tuple((self.nodes_up_to(d - 1), self.nodes_up_to(d)) for d in range(1, self.depth + 1))
        self._max_children = tuple(max(len(children[i]) for i in range(self.size + 1) if self.node_depth[i] == d - 1)
                                   for d in range(1, self.depth + 1))  # fmt: skip
        # ancestors[i][j]: node i's ancestor at depth j (i itself from its own depth on)
        self.ancestors = []
        for i in range(self.size + 1):
            chain = [i]
            while chain[-1]:
                chain.append(self.parent[chain[-1]])
            chain.reverse()
            self.ancestors.append(chain + [i] * (self.depth + 1 - len(chain)))
        self._tensors: dict[torch.device, dict[str, Tensor]] = {}
        self._parents: dict[tuple[int, torch.device], tuple[Tensor, Tensor]] = {}

    @classmethod
    def chain(cls, drafts: int) -> DraftTree:
        return cls([(0,) * d for d in range(1, drafts + 1)])

    @classmethod
    def branches(cls, lengths: Sequence[int]) -> DraftTree:
        """Independent chains from the root, chain i ``lengths[i]`` deep: its first node is the root's child i (rank
        i), every node below it its parent's only child. k chains of one drafter are SpecTr's k draft sequences; a
        hybrid step puts a draft model's chains and the heads' chain side by side."""
        return cls([(i,) + (0,) * (d - 1) for i, length in enumerate(lengths) for d in range(1, length + 1)])

    def branch_order(self) -> list[int]:
        """For a tree of :meth:`branches`: the index of each node (1..N, in node order) among the chains' tokens
        listed chain after chain (chain 0's first to last, then chain 1's, ...)."""
        lengths = Counter(p[0] for p in self.paths)
        offsets = {b: sum(lengths[c] for c in range(b)) for b in lengths}
        assert all(p[1:] == (0,) * (len(p) - 1) for p in self.paths), "not a tree of independent chains"
        return [offsets[p[0]] + len(p) - 1 for p in self.paths]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DraftTree) and self.paths == other.paths

    def __repr__(self) -> str:
        return f"DraftTree({self.size} nodes, depth {self.depth})"

    def depth_nodes(self) -> tuple[tuple[int, int], ...]:
        """For depth d = 1..depth, the range [first, last) of its nodes among nodes 1..N, counted from 0."""
        return self._depth_nodes

    def nodes_up_to(self, depth: int) -> int:
        """How many nodes (root excluded) lie at depths 1..depth: a prefix of the node order."""
        return sum(1 for d in self.node_depth[1:] if d <= depth)

    def tensors(self, device: torch.device) -> dict[str, Tensor]:
        """The tree as index tensors on ``device`` (built once per device)."""
        if device not in self._tensors:
            n = self.size + 1
            attends = torch.zeros(n, n, dtype=torch.bool)
            for i, chain in enumerate(self.ancestors):
                attends[i, chain[: self.node_depth[i] + 1]] = True
            max_children = max(len(c) for c in self.children)
            children = torch.full((n, max_children), -1, dtype=torch.long)
            for i, c in enumerate(self.children):
                children[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            offsets = [sum(self.ranks_at_depth[:d]) for d in range(self.depth)]  # where depth d + 1's candidates start
            columns = [offsets[self.node_depth[i] - 1] + self.node_rank[i] for i in range(1, n)]
            # distinct draws: (depth, W) per row, W the most children of a node; node i takes its depth's draw at its
            # position among its siblings, each depth's draws reading the uniforms of its first nodes
            widths, firsts = self.max_children_at_depth(), [first for first, _ in self.depth_nodes()]
            W = max(widths)
            sibling = [(self.node_depth[i] - 1) * W + self.children[self.parent[i]].index(i) for i in range(1, n)]
            draw_uniforms = [[firsts[d] + min(j, widths[d] - 1) for j in range(W)] for d in range(self.depth)]
            tensors = {
                "columns": torch.tensor(columns),  # node i's column among the concatenated candidates
                "sibling_columns": torch.tensor(sibling),  # node i's column among the (depth, W) draws, flattened
                "draw_uniforms": torch.tensor(draw_uniforms),  # (depth, W): the node uniform each draw reads
                "attends": attends,  # (N + 1, N + 1): node i sees node j
                "depth": torch.tensor(self.node_depth),
                "depth_law": (torch.tensor(self.node_depth) - 1).clamp(min=0),  # the heads draw depth d from law d - 1
                "rank": torch.tensor(self.node_rank),
                "parent": torch.tensor(self.parent),
                "ancestors": torch.tensor(self.ancestors),  # (N + 1, depth + 1)
                "children": children,  # (N + 1, max children), -1 padded, in rank order
            }
            self._tensors[device] = {k: v.to(device) for k, v in tensors.items()}
        return self._tensors[device]

    def parents_within(self, width: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """For a step over the root and the first ``width - 1`` nodes: the nodes with a child among them (P,), the ones
        head 1's distribution is needed after to verify, and each node's index among those (width,), -1 for the rest."""
        key = (width, device)
        if key not in self._parents:
            parents = sorted({self.parent[i] for i in range(1, width)})
            slot = torch.full((width,), -1, dtype=torch.long)
            slot[parents] = torch.arange(len(parents))
            self._parents[key] = (torch.tensor(parents, device=device), slot.to(device))
        return self._parents[key]

    def max_children_at_depth(self) -> tuple[int, ...]:
        """For depth d = 1..depth, the most children a node at depth d - 1 has: sibling tests per level."""
        return self._max_children

    def node_tokens(self, candidates: list[Tensor]) -> Tensor:
        """Node tokens (B, N) from each depth's candidates in rank order (a list of (B, ranks_at_depth[d]))."""
        table = torch.cat(candidates, dim=1)  # (B, sum of ranks)
        return table.index_select(1, self.tensors(table.device)["columns"])

    def sibling_tokens(self, draws: Tensor) -> Tensor:
        """Node tokens (B, N) from each depth's draws in order (B, depth, W), W the most children of a node: a node
        takes the draw of its position among its parent's children (the first child the first draw, whatever its
        rank), so that every node's children are its depth's first draws."""
        return draws.flatten(1).index_select(1, self.tensors(draws.device)["sibling_columns"])

    def to_json(self, **metadata) -> str:
        return json.dumps({"paths": [list(p) for p in self.paths], **metadata}, indent=1)


def read_tree(path: Path, drafts: int, vocab_size: int) -> DraftTree:
    """A tree from a JSON file (``{"paths": [[0], [1], [0, 0], ...]}`` or the bare list), checked against the model:
    at most ``drafts`` deep, every rank below the vocabulary size. Bad files raise one-sentence UserErrors."""
    if not path.is_file():
        raise UserError(f"tree file {path} does not exist; pass a JSON file written by scripts/fit_tree.py or 'auto'.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(
            f'tree file {path} is not valid JSON ({err}); write it as {{"paths": [[0], [0, 0], ...]}}.'
        ) from None
    paths = data.get("paths") if isinstance(data, dict) else data
    if not isinstance(paths, list) or not all(
        isinstance(p, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in p) for p in paths
    ):
        raise UserError(f'tree file {path} must hold a list of paths, each a list of integer ranks, under "paths".')
    try:
        tree = DraftTree(paths)
    except ValueError as err:
        raise UserError(f"tree file {path}: {err}; every path's parent must be listed too.") from None
    if tree.depth > drafts:
        raise UserError(
            f"tree file {path} reaches depth {tree.depth} but the model drafts at most {drafts} tokens with its "
            f"heads; use a tree at most {drafts} deep."
        )
    worst = max(r for p in tree.paths for r in p)
    if worst >= vocab_size:
        raise UserError(
            f"tree file {path} names candidate rank {worst} but the vocabulary has {vocab_size} tokens; "
            f"ranks must lie in 0..{vocab_size - 1}."
        )
    return tree


def full_tree(width: int, depth: int) -> DraftTree:
    """Every path of ranks below ``width`` up to ``depth`` deep: width ** depth nodes at the last depth alone (a bounded
    measuring tree: :func:`ranked_tree`)."""
    paths = [p for d in range(1, depth + 1) for p in itertools.product(range(width), repeat=d)]
    return DraftTree(paths)


def ranked_tree(width: int, depth: int, max_nodes: int) -> DraftTree:
    """A measuring tree of at most ``max_nodes`` nodes: the paths of ranks below ``width``, up to ``depth`` deep, in
    order of their rank sum (then shallower first, then by ranks), as many as the budget holds.

    :func:`full_tree` grows as width ** depth (21,844 nodes for 4 candidates under every node of a 7-deep tree, a step
    too large for memory), while a path's chance of being accepted falls with every lower-ranked candidate on it: the
    rank sum ranks paths the way a product of per-rank acceptance rates would. Each path's parent (the same rank sum
    or less, shorter) and earlier sibling (a smaller rank sum) come before it, so every prefix of this order is a
    tree. When the full tree fits the budget, this is the full tree (all 84 nodes with 4 heads, so that 4-head models'
    fitted trees stay what they were)."""
    if min(width, depth, max_nodes) < 1:
        raise ValueError(f"width {width}, depth {depth} and max_nodes {max_nodes} must all be at least 1")
    paths: list[tuple[int, ...]] = []
    for total in range(depth * (width - 1) + 1):
        for length in range(1, depth + 1):
            for path in _paths_summing_to(total, length, width):
                if len(paths) == max_nodes:
                    return DraftTree(paths)
                paths.append(path)
    return DraftTree(paths)


def _paths_summing_to(total: int, length: int, width: int) -> Iterator[tuple[int, ...]]:
    """Every path of ``length`` ranks below ``width`` whose ranks add up to ``total``, in lexicographic order, one at
    a time (a deep tree's paths are never all listed)."""
    if length == 0:
        if total == 0:
            yield ()
        return
    for first in range(min(width - 1, total) + 1):
        if total - first <= (length - 1) * (width - 1):
            for rest in _paths_summing_to(total - first, length - 1, width):
                yield (first, *rest)


def path_counts(tree: DraftTree, accepted_nodes: Counter) -> Counter:
    """How often each path of ``tree`` was accepted (its node or a descendant ended a step), from how often each node
    ended one (:attr:`mtp.decode.stats.DecodeStats.accepted_nodes`)."""
    counts: Counter = Counter()
    for node, times in accepted_nodes.items():
        if node:
            path = tree.paths[node - 1]
            for d in range(1, len(path) + 1):
                counts[path[:d]] += times
    return counts


def fit_tree(counts: Counter, positions: int, nodes: int, depth: int) -> tuple[DraftTree, float]:
    """The tree of at most ``nodes`` nodes, at most ``depth`` deep, with the most expected accepted drafts per step,
    and that expectation, from how often each path was accepted over ``positions`` row-steps (:func:`path_counts`).

    A node adds its path's probability to the expected accepted length (it is accepted exactly when its path is
    right), and a path is never more probable than its parent's, so taking the most probable paths first is optimal
    for the empirical distribution (ties: shallower, then lower ranks first, which keeps parents before children).
    A node also needs its earlier siblings: children are tried in order, so a candidate's chance depends on them."""
    chosen: list[tuple[int, ...]] = []
    taken = {()}
    candidates = {p for p in counts if len(p) <= depth}
    while len(chosen) < nodes:
        ready = [p for p in candidates if p[:-1] in taken and (p[-1] == 0 or (*p[:-1], p[-1] - 1) in taken)]
        if not ready:
            break
        best = min(ready, key=lambda p: (-counts[p], len(p), p))
        chosen.append(best)
        taken.add(best)
        candidates.discard(best)
    if not chosen:
        chosen = [(0,)]
    expected = sum(counts[p] for p in chosen) / max(1, positions)
    return DraftTree(chosen), expected
