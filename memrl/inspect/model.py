"""The view model of one episode: everything a terminal, HTML or notebook view shows, as plain dataclasses.

Built from the step rows of one source episode (every leaf of its tree). The memory is replayed from the logged
``MemoryOp`` records (ADD / UPDATE / DELETE / COMPRESS in history-turn order, then the write-back of the answer),
so the final fact store, the summary and the text of every retrieved fact are known without the FAISS files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memrl.episode.rows import step_meta_of_row
from memrl.types import MemoryOp, MemoryOpType, PathNode, RollbackRecord, StepMeta, StepRole, ToolCallRecord


@dataclass
class FactView:
    """One long-term fact after replaying the memory ops. ``deleted`` facts stay listed (struck through)."""

    fact_id: int
    text: str
    source_ids: tuple[str, ...]
    written_at: str  # turn id of the last ADD/UPDATE
    updates: int = 0
    deleted: bool = False
    superseded: bool = False  # an UPDATE of the policy writer replaced it; kept as history


@dataclass
class HistoryTurnView:
    index: int
    turn_id: str
    speaker: str
    text: str
    timestamp: str | None
    ops: tuple[MemoryOp, ...]
    memory_credit: float | None  # step_rewards_ext of this history step
    facts_after: int  # live facts once this turn's ops are applied


@dataclass
class MemoryWriteView:
    """One memory write of the policy (``memory.extractor: policy``): what it read, what it wrote, the current
    facts before and after (applied replies only) and its credit. Snapshot writes have one view per alternative."""

    index: int
    alternative: int
    alternatives: int
    applied: bool
    read_turns: list[str]
    read_facts: list[str]
    reply: str
    decisions: list[str]
    errors: list[str]
    ops: tuple[MemoryOp, ...]
    op_right: bool | None
    op_score: float | None  # F1 of the operations against the gold ones (memrl.memory.gold.ops_score)
    gold_ops: str | None
    credit: float | None
    snapshot_reward: float | None
    store_before: list[str]
    store_after: list[str]
    resolved: list[str] = field(default_factory=list)  # what the store changed (memrl.memory.write_target)


@dataclass
class RetrievedFactView:
    rank: int
    fact_id: int
    score: float
    text: str
    source_ids: tuple[str, ...]
    gold_hit: bool  # one of its source turns is gold evidence
    in_prompt: bool  # False when the prompt budget cut it


@dataclass
class SpanView:
    start: int
    end: int
    is_model: bool  # policy tokens (trained on) vs tool results / injected feedback
    text: str


@dataclass
class LeafView:
    episode_id: str
    leaf_index: int
    reward: float
    status: str
    finish: str
    spans: list[SpanView]
    tool_calls: tuple[ToolCallRecord, ...]
    rollbacks: tuple[RollbackRecord, ...]
    node_uids: list[str]
    branch_depth: int
    is_duplicate: bool
    response_text: str
    model_tokens: int
    tool_tokens: int


@dataclass
class TreeNodeView:
    """A generation segment: tokens ``[start, end)`` of every leaf passing through it. ``entropy`` is the mean
    normalised entropy of the tokens generated right after the node (what the entropy expansion policy ranks)."""

    uid: str
    parent: str | None
    start: int
    end: int
    entropy: float | None  # None when the strategy records no tree (chain)
    children: list[str] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)
    spans: list[SpanView] = field(default_factory=list)
    is_leaf: bool = False

    @property
    def is_branch_point(self) -> bool:
        return len(self.children) > 1

    def reward(self, leaves: list[LeafView]) -> float | None:
        got = [leaves[i].reward for i in self.leaves]
        return sum(got) / len(got) if got else None


@dataclass
class EpisodeView:
    episode_id: str
    group_id: str
    status: str
    failure_reason: str | None
    question: str
    gold_answer: str | None
    gold_evidence: tuple[str, ...]
    category: str
    history: list[HistoryTurnView]
    facts: list[FactView]
    summary: str
    retrieved: list[RetrievedFactView]
    leaves: list[LeafView]
    tree: dict[str, TreeNodeView]  # uid → node; the root has parent None
    answer_ops: tuple[MemoryOp, ...]  # what the answer wrote back into memory
    writes: list[MemoryWriteView] = field(default_factory=list)  # the policy's own memory writes, in order

    @property
    def root(self) -> TreeNodeView | None:
        return next((n for n in self.tree.values() if n.parent is None), None)

    @property
    def rewards(self) -> list[float]:
        return [leaf.reward for leaf in self.leaves]

    @property
    def rollbacks(self) -> list[tuple[int, RollbackRecord]]:
        """``(leaf_index, record)`` for every rollback of every leaf (forked leaves repeat their parent's)."""
        return [(leaf.leaf_index, rb) for leaf in self.leaves for rb in leaf.rollbacks]

    @property
    def gold_hit(self) -> bool:
        return any(f.gold_hit for f in self.retrieved)

    @property
    def evidence_recall(self) -> float | None:
        """Fraction of gold evidence turns covered by some retrieved fact (None without gold evidence)."""
        if not self.gold_evidence:
            return None
        covered = {s for f in self.retrieved for s in f.source_ids}
        return sum(1 for g in self.gold_evidence if g in covered) / len(self.gold_evidence)


class _Memory:
    """Replays memory ops into a fact table (ids are unique within an episode's namespace)."""

    def __init__(self) -> None:
        self.facts: dict[int, FactView] = {}
        self.summary = ""

    def apply(self, op: MemoryOp) -> None:
        if op.op is MemoryOpType.ADD:
            for fid in op.fact_ids:
                self.facts[fid] = FactView(fid, op.text, tuple(op.source_ids), op.turn_id)
        elif op.op is MemoryOpType.UPDATE and len(op.fact_ids) == 2:
            # A superseding UPDATE (fact ids: old, new): the old fact stays as history.
            old, new = op.fact_ids
            if old in self.facts:
                self.facts[old].superseded = True
            self.facts[new] = FactView(new, op.text, tuple(op.source_ids), op.turn_id)
        elif op.op is MemoryOpType.UPDATE:
            for fid in op.fact_ids:
                old = self.facts.get(fid)
                n = old.updates + 1 if old else 1
                self.facts[fid] = FactView(fid, op.text, tuple(op.source_ids), op.turn_id, updates=n)
        elif op.op is MemoryOpType.DELETE:
            for fid in op.fact_ids:
                if fid in self.facts:
                    self.facts[fid].deleted = True
        elif op.op is MemoryOpType.COMPRESS:
            self.summary = op.text

    @property
    def live(self) -> int:
        return sum(not f.deleted for f in self.facts.values())

    def current(self) -> list[str]:
        return [
            f.text
            for f in sorted(self.facts.values(), key=lambda f: f.fact_id)
            if not (f.deleted or f.superseded)
        ]


def _credit(row: dict[str, Any]) -> float | None:
    credit = row.get("step_reward_ext")
    return None if credit is None or credit != credit else float(credit)  # NaN = None


def _writes(rows: list[tuple[dict, StepMeta]], memory: _Memory) -> list[MemoryWriteView]:
    """Replay the applied writes' ops in order, recording the current facts around each write."""
    out = []
    writes = [(row, meta, meta.write) for row, meta in rows if meta.write is not None]
    for row, meta, w in sorted(writes, key=lambda rmw: (rmw[2].index, rmw[2].alternative)):
        x = dict(meta.extra)
        before = memory.current()
        if w.applied:
            for op in meta.memory_ops:
                memory.apply(op)
        out.append(
            MemoryWriteView(
                index=w.index,
                alternative=w.alternative,
                alternatives=w.alternatives,
                applied=w.applied,
                read_turns=list(x.get("read_turns", [])),
                read_facts=list(x.get("read_facts", [])),
                reply=meta.response_text,
                decisions=list(x.get("decisions", [])),
                errors=list(w.format_errors),
                ops=meta.memory_ops,
                op_right=w.op_right,
                op_score=w.op_score,
                gold_ops=w.gold_ops,
                credit=_credit(row),
                snapshot_reward=w.snapshot_reward,
                store_before=before,
                store_after=memory.current() if w.applied else before,
                resolved=list(x.get("resolved", [])),
            )
        )
    return out


def _spans(extra: dict[str, Any]) -> list[SpanView]:
    return [SpanView(int(a), int(b), bool(m), str(t)) for a, b, m, t in extra.get("response_spans", [])]


def _leaf(row: dict[str, Any], meta: StepMeta) -> LeafView:
    mask = row["response_mask"]
    return LeafView(
        episode_id=row["episode_id"],
        leaf_index=meta.leaf_index,
        reward=float(row["reward"]),
        status=str(row["status"]),
        finish="" if meta.finish is None else meta.finish.value,
        spans=_spans(dict(meta.extra)),
        tool_calls=meta.tool_calls,
        rollbacks=meta.rollbacks,
        node_uids=[n.uid for n in meta.tree_path],
        branch_depth=meta.branch_depth,
        is_duplicate=meta.is_duplicate,
        response_text=meta.response_text,
        model_tokens=sum(mask),
        tool_tokens=len(mask) - sum(mask),
    )


def _history(rows: list[tuple[dict, StepMeta]], memory: _Memory) -> list[HistoryTurnView]:
    out = []
    for i, (row, meta) in enumerate(rows):
        for op in meta.memory_ops:
            memory.apply(op)
        credit = _credit(row)
        out.append(
            HistoryTurnView(
                index=i,
                turn_id=meta.turn_id,
                speaker=str(meta.extra.get("speaker", "")),
                text=str(meta.extra.get("text", "")),
                timestamp=meta.extra.get("timestamp"),
                ops=meta.memory_ops,
                memory_credit=credit,
                facts_after=memory.live,
            )
        )
    return out


def _retrieved(meta: StepMeta, memory: _Memory, gold: set[str]) -> list[RetrievedFactView]:
    op = next((o for o in meta.memory_ops if o.op is MemoryOpType.RETRIEVE), None)
    if op is None:
        return []
    cut = set(meta.cut_fact_ids)
    out = []
    for rank, fid in enumerate(op.fact_ids):
        fact = memory.facts.get(fid)
        score = float(op.scores[rank]) if rank < len(op.scores) else float("nan")
        sources = fact.source_ids if fact else ()
        out.append(
            RetrievedFactView(
                rank=rank + 1,
                fact_id=fid,
                score=score,
                text=fact.text if fact else f"<fact {fid}: not in the replayed memory>",
                source_ids=sources,
                gold_hit=bool(gold & set(sources)),
                in_prompt=fid not in cut,
            )
        )
    return out


def build_tree(leaves: list[LeafView], paths: list[tuple[PathNode, ...]]) -> dict[str, TreeNodeView]:
    """Merge root-to-leaf paths into one tree. A leaf without a recorded path (chain strategy) hangs off a
    synthetic root as one segment."""
    nodes: dict[str, TreeNodeView] = {}
    for leaf, path in zip(leaves, paths, strict=True):
        if not path:
            end = leaf.spans[-1].end if leaf.spans else 0
            path = (PathNode("root", 0), PathNode(f"leaf{leaf.leaf_index}", end))
        parent = None
        for depth, node in enumerate(path):
            uid = node.uid
            start = nodes[parent].end if parent else 0
            view = nodes.get(uid)
            if view is None:
                view = TreeNodeView(uid, parent, start, node.pos, node.entropy)
                view.spans = [s for s in leaf.spans if s.start >= start and s.end <= view.end]
                view.is_leaf = depth == len(path) - 1 and depth > 0
                nodes[uid] = view
                if parent is not None:
                    nodes[parent].children.append(uid)
            view.leaves.append(leaf.leaf_index)
            parent = uid
    return nodes


def build_episode_view(manifest: list[dict[str, Any]], rows: list[dict[str, Any]]) -> EpisodeView:
    """One :class:`EpisodeView` from the manifest entries and parsed step rows of one source episode."""
    first = manifest[0] if manifest else rows[0]
    typed = [(r, step_meta_of_row(r)) for r in rows]
    hist = [(r, m) for r, m in typed if r["turn_role"] == "history" and m.role is not StepRole.MEMORY]
    write_rows = [(r, m) for r, m in typed if r["turn_role"] == "history" and m.role is StepRole.MEMORY]
    targets = sorted(
        [(r, m) for r, m in typed if r["turn_role"] == "target"], key=lambda rm: rm[1].leaf_index
    )
    memory = _Memory()
    writes = _writes(write_rows, memory)
    # With policy writes, the turns' ops are the writes' (already replayed): show the turns, replay nothing twice.
    history = _history(hist, _Memory() if writes else memory)
    extra = dict(targets[0][1].extra) if targets else {}
    gold = tuple(str(g) for g in extra.get("gold_evidence", ()))
    retrieved = _retrieved(targets[0][1], memory, set(gold)) if targets else []
    answer_ops = tuple(
        op for _, m in targets[:1] for op in m.memory_ops if op.op is not MemoryOpType.RETRIEVE
    )
    for op in answer_ops:
        memory.apply(op)
    leaves = [_leaf(r, m) for r, m in targets]
    paths = [m.tree_path for _, m in targets]
    failed = [e for e in manifest if e.get("status") == "failed"]
    return EpisodeView(
        episode_id=str(first["source_episode_id"]),
        group_id=str(first["group_id"]),
        status="failed" if failed and not targets else str(first.get("status", "")),
        failure_reason=failed[0].get("failure_reason") if failed else None,
        question=str(extra.get("question", "")),
        gold_answer=targets[0][1].gold_answer if targets else None,
        gold_evidence=gold,
        category=str(extra.get("category", "")),
        history=history,
        facts=sorted(memory.facts.values(), key=lambda f: f.fact_id),
        summary=memory.summary,
        retrieved=retrieved,
        leaves=leaves,
        tree=build_tree(leaves, paths) if leaves else {},
        answer_ops=answer_ops,
        writes=writes,
    )
