"""Self-contained HTML page of one episode (inline CSS and SVG, no scripts, no network).

The generation tree is drawn left to right: a node is a generation segment (its text is in the tooltip and
abridged in the box), branch points carry their entropy, leaves are coloured by reward (red 0 → green 1).
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from memrl.inspect.model import EpisodeView, LeafView, TreeNodeView

BOX_W, BOX_H, GAP_X, GAP_Y = 220, 36, 60, 16

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#1d2430;background:#fafbfc}
h1{font-size:20px;margin:0 0 6px}h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #dde3ea}
.card{background:#fff;border:1px solid #dde3ea;border-radius:8px;padding:12px 16px;margin-bottom:14px}
table{border-collapse:collapse;width:100%;font-size:13px}td,th{padding:4px 8px;border-bottom:1px solid #eef1f4;
text-align:left;vertical-align:top}th{background:#f3f5f8}.mono{font-family:ui-monospace,Menlo,monospace}
.op{display:inline-block;border-radius:4px;padding:0 5px;margin:1px 4px 1px 0;font-size:11px;font-weight:600}
.ADD{background:#d9f2e1;color:#1b6b36}.UPDATE{background:#fff1c2;color:#7a5800}.DELETE{background:#fbd5d5;
color:#8a1c1c}.NOOP{background:#eceff3;color:#6b7785}.COMPRESS{background:#ecdcf7;color:#5b2a86}
.RETRIEVE{background:#d6eef8;color:#155e80}ul#facts{columns:2;padding-left:18px;font-size:13px;margin:4px 0}
li.fact{margin:2px 0;break-inside:avoid}li.fact.deleted{text-decoration:line-through;color:#98a2ad}
.src{color:#7b8794;font-size:11px}.hit{background:#1b8a4b;color:#fff;border-radius:4px;padding:0 5px;font-size:11px}
.cut{color:#b42318;font-size:11px}.bar{display:inline-block;height:8px;background:#5b8def;border-radius:2px}
.leaf{border-left:6px solid #999;padding:8px 12px}.resp{white-space:pre-wrap;font-family:ui-monospace,Menlo,
monospace;font-size:12.5px;line-height:1.5}.tool{background:#d7f0f7;color:#0b5565;border-radius:3px}
.rb{color:#b42318;font-size:12.5px}.summary{color:#5b2a86;font-size:13px}.legend span{margin-right:14px;font-size:12px}
svg text{font-family:ui-monospace,Menlo,monospace}
"""


def reward_colour(r: float | None) -> str:
    """Red (0) → amber (0.5) → green (1); grey when unknown."""
    if r is None:
        return "#b8c0c8"
    r = min(1.0, max(0.0, float(r)))
    red, green = (int(214 - 170 * r), int(69 + 120 * r)) if r > 0.5 else (214, int(69 + 140 * r))
    return f"#{red:02x}{green:02x}{60:02x}"


def _layout(view: EpisodeView) -> dict[str, tuple[float, float]]:
    """(x, y) of every node: x by depth, leaves stacked in DFS order, inner nodes centred on their children."""
    pos: dict[str, tuple[float, float]] = {}
    next_row = [0]

    def place(uid: str, depth: int) -> float:
        node = view.tree[uid]
        if node.children:
            ys = [place(c, depth + 1) for c in node.children]
            y = sum(ys) / len(ys)
        else:
            y = next_row[0] * (BOX_H + GAP_Y)
            next_row[0] += 1
        pos[uid] = (depth * (BOX_W + GAP_X), y)
        return y

    if view.root is not None:
        place(view.root.uid, 0)
    return pos


def _node_svg(view: EpisodeView, node: TreeNodeView, x: float, y: float) -> str:
    text = "".join(s.text for s in node.spans).replace("\n", " ")
    label = "prompt" if node.parent is None else (text[:24] + ("…" if len(text) > 24 else "") or "∅")
    reward = node.reward(view.leaves) if node.is_leaf else None
    fill = reward_colour(reward) if node.is_leaf else ("#eef2f7" if node.parent else "#dfe6ee")
    has_tool = any(not s.is_model for s in node.spans)
    stroke = "#0b7285" if has_tool else "#6b7785"
    title = escape(f"[{node.start}:{node.end}] {text}" if node.parent else "root (the prompt)")
    parts = [
        f'<g class="node{" leafnode" if node.is_leaf else ""}" data-uid="{escape(node.uid)}">',
        f"<title>{title}</title>",
        f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="{fill}" stroke="{stroke}"'
        f' stroke-width="{2 if has_tool else 1}"/>',
        f'<text x="{x + 7}" y="{y + 14}" font-size="11" fill="#1d2430">{escape(label)}</text>',
        f'<text x="{x + 7}" y="{y + 27}" font-size="9.5" fill="#4a5562">'
        + escape(f"tok {node.start}–{node.end}" + (f"  R={reward:.2f}" if reward is not None else ""))
        + "</text>",
    ]
    if node.is_branch_point:
        cx, cy = x + BOX_W, y + BOX_H / 2
        parts.append(
            f'<g class="branch"><circle cx="{cx}" cy="{cy}" r="9" fill="#7b2cbf"/>'
            f'<text x="{cx + 12}" y="{cy - 10}" font-size="10.5" fill="#7b2cbf">'
            f"{'' if node.entropy is None else f'H={node.entropy:.2f}'}</text></g>"
        )
    parts.append("</g>")
    return "".join(parts)


def tree_svg(view: EpisodeView) -> str:
    if view.root is None:
        return '<p class="src">no generation tree (the episode failed before generating)</p>'
    pos = _layout(view)
    width = max(x for x, _ in pos.values()) + BOX_W + 30
    height = max(y for _, y in pos.values()) + BOX_H + 30
    edges, nodes = [], []
    for uid, node in view.tree.items():
        x, y = pos[uid]
        x, y = x + 10, y + 20
        nodes.append(_node_svg(view, node, x, y))
        if node.parent is not None:
            px, py = pos[node.parent]
            px, py = px + 10 + BOX_W, py + 20 + BOX_H / 2
            mid = (px + x) / 2
            edges.append(
                f'<path d="M{px},{py} C{mid},{py} {mid},{y + BOX_H / 2} {x},{y + BOX_H / 2}" fill="none"'
                ' stroke="#9aa5b1" stroke-width="1.5"/>'
            )
    return (
        f'<svg id="tree" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}">' + "".join(edges) + "".join(nodes) + "</svg>"
    )


def _ops_html(ops) -> str:
    out = []
    for op in ops:
        ids = ("#" + ",".join(str(i) for i in op.fact_ids) + " ") if op.fact_ids else ""
        out.append(f'<div><span class="op {op.op.value}">{op.op.value}</span>{escape(ids + op.text)}</div>')
    return "".join(out) or '<span class="src">–</span>'


def _history_html(view: EpisodeView) -> str:
    rows = "".join(
        f'<tr><td class="mono">{escape(t.turn_id)}</td><td>{escape(t.speaker)}</td><td>{escape(t.text)}</td>'
        f"<td>{_ops_html(t.ops)}</td><td>{t.facts_after}</td></tr>"
        for t in view.history
    )
    head = "<tr><th>turn</th><th>speaker</th><th>text</th><th>memory ops</th><th>facts</th></tr>"
    return f'<table id="history">{head}{rows}</table>'


def _facts_html(view: EpisodeView) -> str:
    items = "".join(
        f'<li class="fact{" deleted" if f.deleted else ""}"><span class="mono">#{f.fact_id}</span> '
        f'{escape(f.text)} <span class="src">{escape(",".join(f.source_ids))}'
        f"{f' · updated ×{f.updates}' if f.updates else ''}</span></li>"
        for f in view.facts
    )
    summary = escape(view.summary) if view.summary else "<i>(no summary)</i>"
    return f'<ul id="facts">{items}</ul><p class="summary"><b>Summary:</b> {summary}</p>'


def _retrieved_html(view: EpisodeView) -> str:
    top = max((f.score for f in view.retrieved if f.score == f.score), default=1.0) or 1.0
    rows = "".join(
        f'<tr class="retrieved"><td>{f.rank}</td><td class="mono">#{f.fact_id}</td>'
        f'<td><span class="bar" style="width:{max(2, int(60 * f.score / top))}px"></span> {f.score:.4f}</td>'
        f'<td>{escape(f.text)}</td><td class="src">{escape(",".join(f.source_ids))}</td>'
        f"<td>{'<span class=hit>gold</span>' if f.gold_hit else ''}"
        f"{'' if f.in_prompt else ' <span class=cut>cut from prompt</span>'}</td></tr>"
        for f in view.retrieved
    )
    head = "<tr><th>#</th><th>id</th><th>score</th><th>fact</th><th>sources</th><th></th></tr>"
    return f'<table id="retrieved">{head}{rows}</table>'


def _leaf_html(leaf: LeafView) -> str:
    body = "".join(
        f'<span class="{"model" if s.is_model else "tool"}">{escape(s.text)}</span>' for s in leaf.spans
    ) or escape(leaf.response_text)
    events = "".join(
        f'<div class="rb">⟲ rollback at token {rb.position}: {escape(rb.error)} — {rb.attempts} attempt(s),'
        f" {rb.tokens_removed} tokens removed, {'repaired' if rb.repaired else 'not repaired'}</div>"
        for rb in leaf.rollbacks
    )
    calls = "".join(
        f'<div class="src">tool <b>{escape(c.name)}</b> [{escape(c.status)}] at token {c.position}:'
        f" <span class=mono>{escape(c.arguments)}</span> → <span class=mono>{escape(c.result[:200])}</span></div>"
        for c in leaf.tool_calls
    )
    dup = " · duplicate" if leaf.is_duplicate else ""
    return (
        f'<div class="card leaf" style="border-left-color:{reward_colour(leaf.reward)}">'
        f"<b>leaf {leaf.leaf_index}</b> · reward <b>{leaf.reward:.2f}</b> · finish {escape(leaf.finish or '-')}"
        f" · model/tool tokens {leaf.model_tokens}/{leaf.tool_tokens} · depth {leaf.branch_depth}{dup}"
        f'<div class="resp">{body}</div>{calls}{events}</div>'
    )


def _lines(items) -> str:
    return "<br>".join(escape(x) for x in items) or '<span class="src">–</span>'


def _writes_html(view: EpisodeView) -> str:
    """The policy's memory writes: what it read, its reply and ops, the current facts before and after, credit."""
    rows = []
    for w in view.writes:
        label = f"{w.index}" + (f".{w.alternative}" if w.alternatives > 1 else "")
        wrote = (
            _ops_html(w.ops) if w.applied else '<span class="src">not applied (snapshot alternative)</span>'
        )
        errors = "".join(f'<div class="rb">✗ {escape(e)}</div>' for e in w.errors)
        errors += "".join(f'<div class="src">→ {escape(n)}</div>' for n in w.resolved)
        score = "" if w.op_score is None else f" (F1 {w.op_score:.2f})"
        right = "" if w.op_right is None else f'<div class="src">ops right: {w.op_right}{score}</div>'
        gold = f'<div class="src">gold: {escape(w.gold_ops)}</div>' if w.gold_ops else ""
        credit = "–" if w.credit is None else f"{w.credit:.2f}"
        if w.snapshot_reward is not None:
            credit += f'<div class="src">answer {w.snapshot_reward:.2f}</div>'
        rows.append(
            f'<tr><td class="mono">{label}</td><td><div class="src">{_lines(w.read_facts)}</div>'
            f'{_lines(w.read_turns)}</td><td><div class="resp">{escape(w.reply)}</div>{wrote}{errors}{right}{gold}</td>'
            f"<td>{_lines(w.store_before)}</td><td>{_lines(w.store_after)}</td><td>{credit}</td></tr>"
        )
    head = (
        "<tr><th>write</th><th>read (facts shown, new turns)</th><th>reply and operations</th>"
        "<th>current facts before</th><th>after</th><th>credit</th></tr>"
    )
    return f'<table id="writes">{head}{"".join(rows)}</table>'


def render_html(view: EpisodeView) -> str:
    """The whole page as one string."""
    rewards = " ".join(
        f'<span class="op" style="background:{reward_colour(r)};color:#fff">{r:.2f}</span>'
        for r in view.rewards
    )
    failed = f'<p class="rb">FAILED: {escape(view.failure_reason)}</p>' if view.failure_reason else ""
    writes = (
        f'<h2>Memory writes (the policy\'s own)</h2><div class="card">{_writes_html(view)}</div>'
        if view.writes
        else ""
    )
    legend = (
        '<div class="legend"><span><span class="op" style="background:#7b2cbf;color:#fff">H</span>branch point,'
        " entropy after it</span><span>box = generation segment (teal border: has tool output)</span>"
        f'<span>leaf colour = reward <span class="op" style="background:{reward_colour(0)};color:#fff">0</span>'
        f'<span class="op" style="background:{reward_colour(1)};color:#fff">1</span></span></div>'
    )
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>memrl episode {escape(view.episode_id)}</title><style>{CSS}</style></head><body>
<h1>Episode {escape(view.episode_id)}</h1>
<div class="card"><b>Question:</b> {escape(view.question)}<br><b>Gold:</b> {escape(str(view.gold_answer))}
 · category {escape(view.category or "-")} · evidence <span class="mono">{escape(", ".join(view.gold_evidence) or "-")}</span>
<br><b>Leaf rewards:</b> {rewards} · group <span class="mono">{escape(view.group_id)}</span>{failed}</div>
<h2>Generation tree</h2><div class="card">{legend}{tree_svg(view)}</div>
<h2>Retrieved facts</h2><div class="card">{_retrieved_html(view)}</div>
<h2>Final memory ({sum(not f.deleted for f in view.facts)} live facts)</h2><div class="card">{_facts_html(view)}</div>
<h2>Leaves</h2>{"".join(_leaf_html(leaf) for leaf in view.leaves)}
{writes}<h2>History turns and the memory ops they caused</h2><div class="card">{_history_html(view)}</div>
</body></html>"""


def write_html(view: EpisodeView, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(view), encoding="utf-8")
    return path
