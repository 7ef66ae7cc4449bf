"""``tree``: offline tree search, batched across every tree of every request.

Phase 1 builds one tree per request (a root node = the prompt). Phase 2 grows ``initial_rollouts`` chains per
tree. Phase 3 runs ``expansion_iterations`` rounds: each picks ``nodes_per_expansion`` nodes per tree with the
expansion policy and forks ``beam_size - 1`` new branches from each, which continue from the node's token state
(the backend finds the shared prefix in its cache: it is not recomputed). Phase 4 samples exactly ``n`` leaves per tree
(duplicating, flagged, only when the tree has fewer). All branches run on one generation stream, and a tree
starts its next round as soon as its own branches have ended (no tree waits for another tree's slowest branch);
a tree's choices depend only on its own branches and its own random stream.

A node is a point between two generation segments of a branch (a segment is at most ``segment_tokens`` model
tokens, or ends at a tool call). Branches run to their stop in one call and their segment nodes are laid out
afterwards (:func:`_lay_segment_nodes`). A fork sends the owner's tokens up to the node; the backend continues
from the owner's cached state cropped there (one token is recomputed, to get the logits there).
"""

from __future__ import annotations

import functools
import logging
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memrl.formats import TOOL_TAGS
from memrl.policy.base import PolicyClient
from memrl.rollout.base import STRATEGIES, AgentState, RolloutLeaves, RolloutRequest, ToolRunner
from memrl.rollout.branch import Branch
from memrl.rollout.config import RolloutConfig
from memrl.rollout.engine import Engine, EngineHooks
from memrl.rollout.expansion import ENTROPY_WINDOW, EXPANSION_POLICIES, output_entropies
from memrl.rollout.metrics import RolloutMetrics
from memrl.rollout.toolcalls import token_end
from memrl.types import GenerationOutput, PathNode, StepTrajectory

logger = logging.getLogger(__name__)
_CALL_OPEN_RE = re.compile("|".join(re.escape(f"<{t}>") for t in TOOL_TAGS))


@dataclass(eq=False)
class TreeNode:
    """``response_len`` is the node's position (response tokens before it). ``entropy`` is the mean normalised
    entropy of the first tokens generated after it (over all continuations seen)."""

    uid: str
    parent: TreeNode | None
    owner: Branch | None  # whose tokens hold this node's prefix (None for the root)
    response_len: int
    turn_start: int
    branch_depth: int = 0
    children: list[TreeNode] = field(default_factory=list)
    terminal: bool = False
    expansions: int = 0
    at_call: bool = (
        False  # right after a tool call's opening tag (the ``tool_call`` expansion policy forks here)
    )
    entropy_sum: float = 0.0
    entropy_n: int = 0

    @property
    def entropy(self) -> float:
        return self.entropy_sum / self.entropy_n if self.entropy_n else 0.0

    def path(self) -> tuple[int, ...]:
        """Child indices from the root down to this node."""
        out = []
        node = self
        while node.parent is not None:
            out.append(node.parent.children.index(node))
            node = node.parent
        return tuple(reversed(out))


@dataclass(eq=False)
class Tree:
    tree_id: str
    index: int
    request: RolloutRequest
    root: TreeNode
    nodes: list[TreeNode] = field(default_factory=list)
    branches: list[Branch] = field(default_factory=list)
    # Its own expansion draws (tie-breaks, the random policy), so its shape does not depend on when other trees
    # expand.
    rng: random.Random = field(default_factory=random.Random)
    rounds: int = 0  # expansion rounds started


@dataclass(eq=False)
class _Link:
    tree: Tree
    node: TreeNode  # the node the branch's current segment started from
    depth: int
    # Normalised entropy of each model token this branch sampled itself, by response position: the window
    # entropies of the segment nodes laid out once it has finished.
    entropies: dict[int, float] = field(default_factory=dict)
    laid: bool = False  # lazy segment nodes laid out (see _lay_segment_nodes)


class TreeHooks(EngineHooks):
    """Records nodes as branches pass segment boundaries; keeps the tree valid across rollbacks."""

    def __init__(self, engine_ref: list[Engine]) -> None:
        self._engine = engine_ref

    @functools.cached_property
    def vocab_size(self) -> int:
        """Scales the surprisal fallback of backends without top-k log-probs (:func:`output_entropies`)."""
        return len(self._engine[0].tokenizer)

    def on_output(self, branch: Branch, out: GenerationOutput, start: int) -> None:
        link: _Link = branch.tree
        if not out.token_ids:
            return
        # Every token's entropy: the segment nodes inside this output are laid out from them later.
        hs = output_entropies(out.top_logprobs, out.logprobs, self.vocab_size)
        head = hs[:ENTROPY_WINDOW]
        link.node.entropy_sum += sum(head) / len(head)
        link.node.entropy_n += 1
        link.entropies.update(enumerate(hs, start))

    def on_boundary(self, branch: Branch) -> None:
        link: _Link = branch.tree
        node = TreeNode(
            uid=f"{branch.uid}/s{branch.segments}",
            parent=link.node,
            owner=branch,
            response_len=branch.response_len,
            turn_start=branch.turn_start,
            branch_depth=link.depth,
        )
        link.node.children.append(node)
        link.tree.nodes.append(node)
        link.node = node

    def on_restore(self, branch: Branch, position: int) -> None:
        """Forget this branch's nodes past ``position``; if the rollback reached below the fork point, re-attach
        the branch to the deepest shared ancestor at or before ``position`` (its tokens there are identical)."""
        link: _Link = branch.tree
        for pos in [p for p in link.entropies if p >= position]:
            del link.entropies[pos]
        node = link.node
        while node.parent is not None and node.response_len > position:
            # A tree forks only from nodes whose owner has ended, so a running branch's own nodes have no forks.
            if node.owner is branch:
                node.parent.children.remove(node)
                link.tree.nodes.remove(node)
            node = node.parent
        if node is not link.node and node.owner is not branch:
            self._engine[0].metrics.add("rollout/tree/rollback_reattached", 1)
        if node is not link.node:
            link.node = node
            branch.floor = min(branch.floor, node.response_len)

    def add_leaf(self, branch: Branch) -> TreeNode:
        link: _Link = branch.tree
        leaf = TreeNode(
            uid=f"{branch.uid}/leaf",
            parent=link.node,
            owner=branch,
            response_len=branch.response_len,
            turn_start=branch.turn_start,
            branch_depth=link.depth,
            terminal=True,
        )
        link.node.children.append(leaf)
        link.tree.nodes.append(leaf)
        return leaf


def _new_branch(tree: Tree, uid: str, spawn_key: str) -> Branch:
    b = Branch(
        uid=uid,
        request_index=tree.index,
        request=tree.request,
        tokens=list(tree.request.prompt_ids),
        spawn_key=spawn_key,
    )
    b.tree = _Link(tree, tree.root, 0)
    return b


def _fork(tree: Tree, node: TreeNode, uid: str, spawn_key: str) -> Branch:
    if node.owner is None:  # the root: a fresh chain
        return _new_branch(tree, uid, spawn_key)
    b = node.owner.fork(uid, node.response_len, node.turn_start, spawn_key)
    b.tree = _Link(tree, node, node.branch_depth + 1)
    return b


def _candidates(tree: Tree) -> list[TreeNode]:
    inner = [n for n in tree.nodes if not n.terminal]
    if not inner:  # only response positions branch; the root when a tree has nothing else
        inner = [tree.root, *inner]
    return inner


def _node_at(tree: Tree, b: Branch, pos: int, entropy: float) -> TreeNode:
    """The node at response position ``pos`` of ``b``: an existing node of its branch there, or a new one
    splitting the segment that spans it."""
    link: _Link = b.tree
    child, node = None, link.node
    while node.response_len > pos:  # up the branch's own nodes (its fork point lies below pos)
        child, node = node, node.parent
    if node.response_len < pos:
        new = TreeNode(
            uid=f"{b.uid}/s{pos}",
            parent=node,
            owner=b,
            response_len=pos,
            turn_start=_turn_start(b, pos),
            branch_depth=link.depth,
            entropy_sum=entropy,
            entropy_n=1,
        )
        if child is None:  # in the branch's last segment: its leaf will hang below the new node
            node.children.append(new)
            link.node = new
        else:
            node.children[node.children.index(child)] = new
            child.parent = new
            new.children.append(child)
        tree.nodes.append(new)
        node = new
    return node


def _turn_start(b: Branch, pos: int) -> int:
    """Response index where the model turn containing ``pos`` began (just after the last tool output)."""
    while pos > 0 and b.mask[pos - 1] == 1:
        pos -= 1
    return pos


def _segment_points(b: Branch, seg: int) -> list[int]:
    """Where a segmented run of ``b`` would have stopped and continued: every ``seg`` model tokens from its fork
    point or from the start of each model turn (a tool result ends a segment), strictly inside the branch."""
    points, start = [], b.floor
    for pos in range(b.floor, b.response_len):
        if b.mask[pos] == 0:
            start = pos + 1
        elif pos > start and (pos - start) % seg == 0:
            points.append(pos)
    return points


def _call_points(b: Branch, decode: Callable[[Sequence[int]], str]) -> list[int]:
    """Response positions right after each tool call's opening tag that ``b`` wrote itself (after its fork point;
    injected results are never searched): the first token boundary at or after the tag's end."""
    points, i, end = [], b.floor, b.response_len
    while i < end:
        if b.mask[i] == 0:
            i += 1
            continue
        j = i
        while j < end and b.mask[j] == 1:
            j += 1
        run = b.tokens[b.prompt_len + i : b.prompt_len + j]
        for m in _CALL_OPEN_RE.finditer(decode(run)):
            at = i + token_end(decode, run, m.end())
            if b.floor < at < end:
                points.append(at)
        i = j
    return points


def _lay_segment_nodes(
    tree: Tree, cfg: RolloutConfig, decode: Callable[[Sequence[int]], str] | None = None
) -> None:
    """Give each finished branch of ``tree`` the segment nodes a segment-by-segment run would have recorded, with
    the same entropy (the first ``ENTROPY_WINDOW`` tokens of the segment after the node); with ``decode`` and an
    expansion policy that wants them (``call_nodes``), also a node right after each tool call's opening tag."""
    seg, window = cfg.tree.segment_tokens, ENTROPY_WINDOW
    calls = decode is not None and getattr(
        EXPANSION_POLICIES.get(cfg.tree.expansion_policy), "call_nodes", False
    )
    for b in tree.branches:
        link: _Link = b.tree
        if link.laid or b.state is not AgentState.TERMINATED:
            continue
        link.laid = True
        points = _segment_points(b, seg)
        at_calls = set(_call_points(b, decode)) if calls else set()
        for pos in sorted(set(points) | at_calls):
            own = [link.entropies[q] for q in range(pos, pos + min(window, seg)) if q in link.entropies]
            entropy = sum(own) / len(own) if own else 0.0
            node = _node_at(tree, b, pos, entropy)
            node.at_call = node.at_call or pos in at_calls


def _expand_tree(engine: Engine, tree: Tree, cfg: RolloutConfig) -> list[Branch]:
    """Round ``tree.rounds`` of ``tree``: pick nodes with the expansion policy, fork ``beam_size - 1`` branches
    from each."""
    policy = EXPANSION_POLICIES.get(cfg.tree.expansion_policy)
    it = tree.rounds
    tree.rounds += 1
    _lay_segment_nodes(tree, cfg, engine.tokenizer.decode)
    candidates = _candidates(tree)
    fresh: list[Branch] = []
    for node in policy(candidates, cfg.tree.nodes_per_expansion, tree.rng):
        node.expansions += 1
        key = f"{node.uid}/x{it}.{node.expansions}"
        for _ in range(cfg.tree.beam_size - 1):
            b = _fork(tree, node, f"{tree.tree_id}/x{it}.{len(tree.branches)}", key)
            tree.branches.append(b)
            fresh.append(b)
        engine.metrics.add("rollout/tree/expanded_nodes", 1)
    return fresh


def _sample_leaves(tree: Tree, hooks: TreeHooks, n: int, rng: random.Random) -> list[StepTrajectory]:
    leaves = [(b, hooks.add_leaf(b)) for b in tree.branches]
    picked = sorted(rng.sample(range(len(leaves)), n)) if len(leaves) >= n else list(range(len(leaves)))
    out = []
    for i in range(n):
        b, leaf = leaves[picked[i % len(picked)]]
        dup = i >= len(picked)
        step = b.to_step(
            f"{b.uid}#{i}" if dup else b.uid,
            tree_id=tree.tree_id,
            node_path=leaf.path(),
            branch_depth=leaf.branch_depth,
            is_duplicate=dup,
            tree_path=_tree_path(leaf),
        )
        out.append(step)
    return out


def _tree_path(leaf: TreeNode) -> tuple[PathNode, ...]:
    """The leaf's root-to-leaf nodes (``StepMeta.tree_path``): tree advantages value them, inspectors redraw
    the tree from them."""
    path = []
    node: TreeNode | None = leaf
    while node is not None:
        path.append(PathNode(node.uid, node.response_len, node.entropy, len(node.children)))
        node = node.parent
    return tuple(path[::-1])


@STRATEGIES.register("tree")
def tree_rollout(
    requests: Sequence[RolloutRequest], policy: PolicyClient, tools: ToolRunner | None, cfg: RolloutConfig
) -> RolloutLeaves:
    metrics = RolloutMetrics()
    engine_ref: list[Engine] = []
    hooks = TreeHooks(engine_ref)
    engine = Engine(policy, tools, cfg, metrics, hooks=hooks)
    engine_ref.append(engine)
    rng = random.Random(cfg.seed)
    # Phase 1: one tree per request; phase 2: the initial chains (one n-sample request per tree).
    trees = []
    for k, req in enumerate(requests):
        tree_id = f"{req.request_id}/tree"
        root = TreeNode(uid=f"{tree_id}/root", parent=None, owner=None, response_len=0, turn_start=0)
        tree = Tree(
            tree_id=tree_id, index=k, request=req, root=root, rng=random.Random(f"{cfg.seed}/{tree_id}")
        )
        tree.branches = [
            _new_branch(tree, f"{tree_id}/c{i}", f"{root.uid}/init") for i in range(cfg.tree.initial_rollouts)
        ]
        trees.append(tree)
    # Phase 3: expansion rounds, each tree on its own as soon as its branches have ended.
    _grow_per_tree(engine, trees, cfg)
    # Phase 4: exactly n leaves per tree.
    for t in trees:
        _lay_segment_nodes(t, cfg, engine.tokenizer.decode)
    leaves = [_sample_leaves(t, hooks, cfg.n, rng) for t in trees]
    _tree_metrics(metrics, trees, leaves, cfg)
    return RolloutLeaves(leaves=leaves, metrics=metrics.summary())


def _grow_per_tree(engine: Engine, trees: list[Tree], cfg: RolloutConfig) -> None:
    """One generation stream for every branch of every tree; a tree starts its next round as soon as its own
    branches have all ended, and the new branches join the rows still decoding, so no tree waits for the slowest
    branch of another."""

    def refill(ended: list[Branch]) -> list[Branch]:
        fresh: list[Branch] = []
        for tree in {id(b.tree.tree): b.tree.tree for b in ended}.values():
            if tree.rounds < cfg.tree.expansion_iterations and all(
                b.state is AgentState.TERMINATED for b in tree.branches
            ):
                fresh += _expand_tree(engine, tree, cfg)
        return fresh

    engine.run_streaming([b for t in trees for b in t.branches], refill)


def _tree_metrics(
    metrics: RolloutMetrics, trees: list[Tree], leaves: list[list[StepTrajectory]], cfg
) -> None:
    distinct = sum(len(t.branches) for t in trees)
    metrics.add("rollout/leaves", sum(len(x) for x in leaves))
    metrics.add("rollout/tree/leaves", distinct)
    metrics.add("rollout/tree/duplicates", sum(s.meta.is_duplicate for x in leaves for s in x))
    metrics.add("rollout/tree/nodes", sum(len(t.nodes) for t in trees))
    metrics.maximum(
        "rollout/tree/max_branch_depth", max((s.meta.branch_depth for x in leaves for s in x), default=0)
    )
    short = [t.tree_id for t in trees if len(t.branches) < cfg.n]
    if short:
        logger.warning(
            "%d trees have fewer than n=%d leaves; duplicated leaves are flagged", len(short), cfg.n
        )
