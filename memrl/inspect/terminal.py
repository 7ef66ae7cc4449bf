"""Rich terminal view of one :class:`~memrl.inspect.model.EpisodeView` (``memrl inspect RUN --episode ID``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from memrl.inspect.model import EpisodeView, LeafView, TreeNodeView
from memrl.types import MemoryOp

OP_STYLE = {
    "ADD": "green",
    "UPDATE": "yellow",
    "DELETE": "red",
    "NOOP": "dim",
    "COMPRESS": "magenta",
    "RETRIEVE": "cyan",
}


def _reward_style(reward: float | None) -> str:
    if reward is None:
        return "white"
    return "bold green" if reward >= 0.75 else "yellow" if reward > 0.25 else "bold red"


def _op_text(op: MemoryOp) -> Text:
    t = Text(f"{op.op.value:<8}", style=OP_STYLE.get(op.op.value, ""))
    ids = ",".join(str(i) for i in op.fact_ids)
    if ids:
        t.append(f" #{ids}", style="bold")
    if op.text:
        t.append(f" {op.text}")
    return t


def header(view: EpisodeView) -> Panel:
    t = Text()
    t.append("question  ", style="bold")
    t.append(f"{view.question or '-'}\n")
    t.append("gold      ", style="bold")
    t.append(
        f"{view.gold_answer!s}   category={view.category or '-'}   evidence={', '.join(view.gold_evidence) or '-'}\n"
    )
    t.append("rewards   ", style="bold")
    for r in view.rewards:
        t.append(f"{r:.2f} ", style=_reward_style(r))
    if view.failure_reason:
        t.append(f"\nFAILED: {view.failure_reason}", style="bold red")
    return Panel(t, title=f"episode {view.episode_id}  (group {view.group_id}, {view.status})", expand=True)


def history_table(view: EpisodeView) -> Table:
    table = Table(title="History turns → memory ops", show_lines=False, expand=True)
    table.add_column("turn", style="bold", no_wrap=True)
    table.add_column("speaker: text", ratio=3)
    table.add_column("memory ops", ratio=3)
    table.add_column("facts", justify="right")
    for turn in view.history:
        ops = Text("\n").join(_op_text(op) for op in turn.ops) if turn.ops else Text("-", style="dim")
        said = f"{turn.speaker}: {turn.text}" if turn.speaker else turn.text
        table.add_row(turn.turn_id, said, ops, str(turn.facts_after))
    return table


def memory_panel(view: EpisodeView) -> Panel:
    table = Table(expand=True, show_header=True)
    table.add_column("id", justify="right")
    table.add_column("fact", ratio=4)
    table.add_column("sources")
    for f in view.facts:
        style = "strike dim" if f.deleted else ""
        table.add_row(str(f.fact_id), Text(f.text, style=style), ",".join(f.source_ids))
    summary = Text(f"summary: {view.summary or '(none)'}", style="magenta")
    n_live = sum(not f.deleted for f in view.facts)
    return Panel(Group(table, summary), title=f"Final memory ({n_live} live facts)")


def retrieved_table(view: EpisodeView) -> Table:
    table = Table(title="Retrieved for the question", expand=True)
    for col, kw in (
        ("#", {"justify": "right"}),
        ("id", {"justify": "right"}),
        ("score", {"justify": "right"}),
    ):
        table.add_column(col, **kw)
    table.add_column("fact", ratio=4)
    table.add_column("sources")
    table.add_column("gold")
    table.add_column("prompt")
    for f in view.retrieved:
        table.add_row(
            str(f.rank),
            str(f.fact_id),
            f"{f.score:.4f}",
            f.text,
            ",".join(f.source_ids),
            Text("HIT", style="bold green") if f.gold_hit else Text("-", style="dim"),
            "in" if f.in_prompt else Text("cut", style="red"),
        )
    return table


def leaf_text(leaf: LeafView) -> Text:
    """Model tokens plain, tool results / feedback highlighted (they are masked out of the loss)."""
    t = Text()
    for span in leaf.spans:
        t.append(span.text, style="" if span.is_model else "black on bright_cyan")
    return t


def leaf_panel(leaf: LeafView) -> Panel:
    parts: list[Any] = [leaf_text(leaf)]
    for call in leaf.tool_calls:
        parts.append(
            Text(f"tool {call.name} [{call.status}] @{call.position}: {call.arguments!r} → {call.result!r}")
        )
    for rb in leaf.rollbacks:
        parts.append(
            Text(
                f"rollback @{rb.position}: {rb.error} (attempts {rb.attempts}, removed {rb.tokens_removed} tokens, "
                f"{'repaired' if rb.repaired else 'not repaired'})",
                style="red",
            )
        )
    title = (
        f"leaf {leaf.leaf_index}  reward {leaf.reward:.2f}  finish={leaf.finish or '-'}  "
        f"model/tool tokens {leaf.model_tokens}/{leaf.tool_tokens}"
        + ("  DUPLICATE" if leaf.is_duplicate else "")
    )
    return Panel(Group(*parts), title=title, border_style=_reward_style(leaf.reward))


def tree_view(view: EpisodeView) -> Tree | Text:
    root = view.root
    if root is None:
        return Text("(no generation tree)", style="dim")

    def label(node: TreeNodeView) -> Text:
        t = Text()
        if node.parent is None:
            t.append("root", style="bold")
        else:
            snippet = "".join(s.text for s in node.spans).replace("\n", " ")
            t.append(f"[{node.start}:{node.end}] ", style="dim")
            t.append(snippet[:60] + ("…" if len(snippet) > 60 else ""))
        if node.is_branch_point:
            ent = "" if node.entropy is None else f" entropy {node.entropy:.2f}"
            t.append(f"  ⑂{ent}", style="bold magenta")
        if node.is_leaf:
            r = node.reward(view.leaves)
            t.append(f"  → leaf {node.leaves} reward {r:.2f}", style=_reward_style(r))
        return t

    tree = Tree(label(root))

    def grow(branch: Tree, node: TreeNodeView) -> None:
        for uid in node.children:
            child = view.tree[uid]
            grow(branch.add(label(child)), child)

    grow(tree, root)
    return tree


def writes_table(view: EpisodeView) -> Table:
    """The policy's memory writes: what it read, its operations, the current facts after, its credit."""
    table = Table(title="Memory writes (the policy's own)", expand=True, show_lines=True)
    table.add_column("write", justify="right")
    table.add_column("read", ratio=3)
    table.add_column("wrote", ratio=3)
    table.add_column("current facts after", ratio=3)
    table.add_column("credit", justify="right")
    for w in view.writes:
        read = Text("\n".join(w.read_facts or ["(no facts shown)"]), style="dim")
        read.append("\n" + "\n".join(w.read_turns))
        wrote = Text()
        for op in w.ops:
            wrote.append_text(_op_text(op))
            wrote.append("\n")
        if not w.applied:
            wrote.append("not applied (snapshot alternative): " + "; ".join(w.decisions), style="dim")
        for err in w.errors:
            wrote.append(f"\n✗ {err}", style="red")
        for note in w.resolved:
            wrote.append(f"\n→ {note}", style="cyan")
        if w.op_right is not None:
            score = "" if w.op_score is None else f" (F1 {w.op_score:.2f})"
            wrote.append(f"\nops right: {w.op_right}{score}", style="green" if w.op_right else "yellow")
        credit = "-" if w.credit is None else f"{w.credit:.2f}"
        if w.snapshot_reward is not None:
            credit += f"\n(answer {w.snapshot_reward:.2f})"
        label = f"{w.index}" + (f".{w.alternative}" if w.alternatives > 1 else "")
        after = "\n".join(w.store_after) or "(empty)"
        table.add_row(label, read, wrote, Text(after), Text(credit, style=_reward_style(w.credit)))
    return table


def render(view: EpisodeView, console: Console | None = None) -> None:
    """Print the whole episode view."""
    console = console or Console()
    console.print(header(view))
    if view.writes:
        console.print(writes_table(view))
    if view.history:
        console.print(history_table(view))
    console.print(memory_panel(view))
    if view.retrieved:
        console.print(retrieved_table(view))
    console.print(Panel(tree_view(view), title="Generation tree (segments; ⑂ = branch point)"))
    for leaf in view.leaves:
        console.print(leaf_panel(leaf))


def render_run_table(
    rows: list[dict[str, Any]], console: Console | None = None, tool_use: dict[str, float] | None = None
) -> None:
    """One line per episode (see :func:`memrl.inspect.summary.episode_table`), then the run's tool use."""
    console = console or Console()
    table = Table(title="Episodes", expand=True)
    cols = (
        "episode",
        "category",
        "leaves",
        "reward",
        "gold hit",
        "calls",
        "failed",
        "rollbacks",
        "gold calls",
    )
    for col in (*cols, "copied", "status"):
        table.add_column(col)
    for r in rows:
        hit = r["gold_hit"]
        table.add_row(
            r["episode_id"],
            str(r["category"]),
            str(r["leaves"]),
            f"{r['reward_mean']:.2f}",
            "-" if hit is None else ("yes" if hit else "no"),
            str(r["tool_calls"]),
            str(r["failed_calls"]),
            str(r["rollbacks"]),
            str(r["gold_calls"]),
            str(r["copied_results"]),
            r["status"],
        )
    console.print(table)
    if tool_use:
        console.print(tool_use_line(tool_use))


def tool_use_line(m: dict[str, float]) -> str:
    """The run's tool use in one line (:func:`memrl.inspect.summary.run_tool_use`)."""
    return (
        f"tool use over {m['tooluse/answers']:.0f} answers: {m['tooluse/calls_per_answer']:.2f} calls per answer, "
        f"{m['tooluse/failed_calls']:.0f} failed calls, {m['tooluse/rollbacks']:.0f} rollbacks, "
        f"{m['tooluse/gold_calls']:.0f} calls printed the gold answer, "
        f"{m['tooluse/copied_results']:.0%} of answers with a successful call copied its result"
    )
