"""Workloads and answer scoring for ``memrl bench rollout``.

A workload is a list of target-turn prompts with their gold answers, built as the episode runner builds them
(:class:`~memrl.episode.prompt.PromptBuilder`, default episode config) from each episode's gold evidence turns
plus its latest other turns (rule-extractor text, oldest first): the facts stand in for retrieval, so the bench
measures generation, not the memory.

- ``synthetic``: test-split synthetic episodes, ``python`` tool listed; ``<python>`` calls are answered by a safe
  arithmetic evaluator (tool turns are real but cost no sandbox process).
- ``locomo``: LoCoMo questions of categories 1-4 that have evidence turns (``--path`` to a ``locomo10.json``;
  default the bundled 8-question fixture), no tools.

:func:`score_groups` scores each arm's leaves with the same rewards as evaluation: strict exact match (the
``<answer>`` tag's content equals the gold) and lenient match (the gold appears in the prose).
"""

from __future__ import annotations

import ast
import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from memrl.rollout import RolloutRequest
from memrl.tools.base import ToolResult

logger = logging.getLogger(__name__)

WORKLOADS = ("locomo", "synthetic")


@dataclass
class Workload:
    """Prompts and, per prompt, the gold answer and the question (for the rewards)."""

    requests: list[RolloutRequest]
    tools: object | None
    golds: list[str]
    questions: list[str]


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def arithmetic_tool(code: str) -> str:
    """Runs ``print(<integer arithmetic>)`` and nothing else, by evaluating its AST (no code is executed): the
    synthetic task's programs are one such line, and the bench times generation, not the sandbox."""

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("unsupported")

    try:
        tree = ast.parse(code.strip(), mode="eval").body
        if not (
            isinstance(tree, ast.Call) and getattr(tree.func, "id", None) == "print" and len(tree.args) == 1
        ):
            raise ValueError("not a print call")
        return str(ev(tree.args[0]))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: {exc}"


class ArithmeticTools:
    """``<python>`` calls answered by :func:`arithmetic_tool`."""

    def record_rollback(self, tool: str) -> None:
        pass

    def execute(self, calls):
        return [ToolResult(text=arithmetic_tool(call.arguments), status="ok") for call, _ in calls]


def evidence_prompts(tok, episodes, tools: Sequence[str], facts_per_prompt: int = 4) -> list[tuple[int, ...]]:
    """Target-turn prompt ids: each episode's gold evidence turns plus its latest other turns up to
    ``facts_per_prompt`` facts, one rule-extractor fact per turn, oldest first."""
    from memrl.episode.config import EpisodeConfig
    from memrl.episode.prompt import PromptBuilder, order_facts
    from memrl.memory.extract import rule_fact_texts

    cfg = EpisodeConfig()
    builder = PromptBuilder(cfg, tok)
    prompts = []
    for ep in episodes:
        gold = set(ep.metadata.get("evidence_turn_ids", ()))
        history = list(enumerate(ep.history))
        picked = [(i, t) for i, t in history if t.turn_id in gold]
        others = [(i, t) for i, t in reversed(history) if t.turn_id not in gold]
        picked += others[: max(0, facts_per_prompt - len(picked))]
        picked.sort(key=lambda x: x[0])
        facts = [
            {"id": i, "text": text, "timestamp": t.timestamp, "speaker": t.speaker, "source_ids": [t.turn_id]}
            for i, t in picked
            for text in rule_fact_texts(t)[:1]
        ]
        prompts.append(builder.build(ep.final_query, order_facts(facts), "", list(tools)).ids)
    return prompts


def _synthetic_episodes(n: int):
    from memrl.data.adapters import run_adapter

    episodes, _ = run_adapter("synthetic", None, split="test", options={"num_episodes": n, "seed": 0})
    return episodes


def _locomo_episodes(path: str | None, n: int):
    """The first ``n`` questions of categories 1-4 with a gold answer and evidence turns in the conversation."""
    from memrl.data.adapters import run_adapter

    if path is None:
        from memrl.adapters import LOCOMO_FIXTURE

        path = str(LOCOMO_FIXTURE)
        logger.warning(
            "bench rollout: no --path, using the bundled LoCoMo fixture (8 questions, a smoke run)"
        )
    episodes, _ = run_adapter("locomo", path, split="all")
    usable = [
        ep
        for ep in episodes
        if ep.metadata.get("category") in (1, 2, 3, 4)
        and ep.target_answer
        and ep.metadata.get("evidence_turn_ids")
    ]
    if len(usable) < n:
        logger.warning(
            "bench rollout: %s has %d usable questions, fewer than --prompts %d", path, len(usable), n
        )
    return usable[:n]


def build_workload(name: str, tok, prompts: int, path: str | None = None) -> Workload:
    """The ``name`` workload with ``prompts`` prompts (``locomo``: at most what the file has)."""
    if name == "synthetic":
        episodes, tools, tool_names = _synthetic_episodes(prompts), ArithmeticTools(), ["python"]
    elif name == "locomo":
        episodes, tools, tool_names = _locomo_episodes(path, prompts), None, []
    else:
        raise ValueError(f"memrl bench rollout --workload: unknown {name!r}; valid: {', '.join(WORKLOADS)}")
    ids = evidence_prompts(tok, episodes, tool_names)
    return Workload(
        requests=[RolloutRequest(p, f"q{i}") for i, p in enumerate(ids)],
        tools=tools,
        golds=[ep.target_answer for ep in episodes],
        questions=[ep.final_query for ep in episodes],
    )


def score_groups(tok, leaves, workload: Workload) -> dict[str, float]:
    """Per arm: best-of-n and mean of strict and lenient reward, distinct answers per group, and the share of
    groups whose rewards differ (the groups that give GRPO a signal); the share of leaves with an answer tag."""
    from memrl.rewards.base import RewardContext, RewardInput
    from memrl.rewards.text import make_exact_match, make_lenient_match, normalize_answer

    fns = {
        "strict": make_exact_match({}, RewardContext()),
        "lenient": make_lenient_match({}, RewardContext()),
    }
    out: dict[str, float] = {}
    groups = []
    for group, gold, question in zip(leaves, workload.golds, workload.questions, strict=True):
        texts = [tok.decode(list(s.response_ids), skip_special_tokens=True) for s in group]
        groups.append([RewardInput.from_response(t, gold, question) for t in texts])
    for name, fn in fns.items():
        scores = [fn(g) for g in groups]
        out[f"{name}_best_of_n"] = sum(max(s) for s in scores) / len(scores)
        out[f"{name}_mean"] = sum(sum(s) for s in scores) / sum(len(s) for s in scores)
        out[f"{name}_mixed_groups"] = sum(len(set(s)) > 1 for s in scores) / len(scores)
    tagged = [[float(x.tagged) for x in g] for g in groups]
    out["answer_tag_mean"] = sum(map(sum, tagged)) / sum(map(len, tagged))  # format-following leaves
    out["distinct_answers_per_group"] = sum(
        len({normalize_answer(x.answer) for x in g}) for g in groups
    ) / len(groups)
    return out
