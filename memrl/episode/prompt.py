"""Target-turn prompts: retrieved facts + short-term summary + tool list → chat messages → token ids.

Training and evaluation both prompt the policy with exactly what :meth:`PromptBuilder.build` produces, so its
output format is a contract: system message = ``memrl/prompts/target_turn.j2`` rendered with ``facts`` (oldest
first), ``summary`` and ``tools``; messages ``[system, user=question]``; ids from
``tokenizer.apply_chat_template(..., add_generation_prompt=True)``. A tokenizer without a chat template gets
:data:`memrl.templates.PLAIN_CHAT_FORMAT`.

The budget is never met by silent truncation: a summary that does not fit even without facts is dropped first;
then facts are cut lowest score first (ties: oldest first) and the cut ids are returned; if the prompt still does
not fit, the summary is dropped; if even that does not fit, :class:`PromptTooLongError` is raised.

>>> builder = PromptBuilder(EpisodeConfig(), tokenizer)
>>> built = builder.build("Where does Ann live?", facts=[{"id": 3, "text": "Ann lives in Oslo", ...}])
>>> built.ids, built.included_fact_ids, built.cut_fact_ids
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memrl.episode.config import EpisodeConfig
from memrl.templates import encode_chat, load_template

# Upper bound on the template markup around one fact line ("- [date] " etc.), in tokens.
_FACT_MARKUP_TOKENS = 48


class PromptTooLongError(ValueError):
    """The prompt exceeds its token budget even with every fact and the summary removed."""


@dataclass(frozen=True)
class PromptFact:
    """One retrieved fact as the template sees it."""

    id: int
    text: str
    timestamp: str | None = None
    speaker: str = ""
    source_ids: tuple[str, ...] = ()
    score: float = 0.0

    def as_template_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "timestamp": self.timestamp,
            "speaker": self.speaker,
            "source_ids": list(self.source_ids),
            "score": self.score,
        }


def as_prompt_fact(fact: Any) -> PromptFact:
    """Accept a mapping or an object with attributes (``id``/``fact_id``, ``text``, ``timestamp``, ...)."""
    if isinstance(fact, PromptFact):
        return fact
    get = fact.get if isinstance(fact, Mapping) else lambda k, d=None: getattr(fact, k, d)
    fid = get("id", None)
    if fid is None:
        fid = get("fact_id", None)
    if fid is None or get("text", None) is None:
        raise ValueError(f"fact {fact!r}: expected fields 'id' (or 'fact_id') and 'text'")
    return PromptFact(
        id=int(fid),
        text=str(get("text")),
        timestamp=get("timestamp", None),
        speaker=str(get("speaker", "") or ""),
        source_ids=tuple(str(s) for s in (get("source_ids", ()) or ())),
        score=float(get("score", 0.0) or 0.0),
    )


@dataclass(frozen=True)
class BuiltPrompt:
    """``ids`` is the full prompt (generation starts right after it); ``text`` is the system message."""

    ids: tuple[int, ...]
    text: str
    messages: tuple[Mapping[str, str], ...]
    included_fact_ids: tuple[int, ...]
    cut_fact_ids: tuple[int, ...]
    summary_cut: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.ids)


def order_facts(facts: Sequence[Any]) -> list[Any]:
    """Retrieved facts in prompt order, oldest first: fact ids grow with ingest order, so the latest value of an
    attribute comes last."""

    def fid(f: Any) -> Any:
        return f.get("id") if isinstance(f, Mapping) else getattr(f, "fact_id", getattr(f, "id", None))

    return sorted(facts, key=fid)


class PromptBuilder:
    """Renders target-turn prompts within ``cfg.prompt_token_budget`` tokens."""

    def __init__(self, cfg: EpisodeConfig, tokenizer: Any) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.template = load_template(cfg.prompt_template)

    def render_system(self, facts: Sequence[PromptFact], summary: str, tools: Sequence[str]) -> str:
        return self.template.render(
            facts=[f.as_template_dict() for f in facts],
            summary=summary or "",
            tools=list(tools),
            tool_example=self.cfg.tool_example,
        ).strip()

    def _encode(self, question: str, facts: Sequence[PromptFact], summary: str, tools: Sequence[str]):
        system = self.render_system(facts, summary, tools)
        messages = ({"role": "system", "content": system}, {"role": "user", "content": question})
        return encode_chat(self.tokenizer, messages), system, messages

    def build(
        self,
        question: str,
        facts: Sequence[Any] = (),
        summary: str = "",
        tools: Sequence[str] = (),
    ) -> BuiltPrompt:
        """``facts`` are rendered in the order given (see :func:`order_facts`); the budget cuts by score."""
        kept = [as_prompt_fact(f) for f in facts]
        budget = self.cfg.prompt_token_budget
        # Cut order: lowest score first; among equal scores the oldest (earliest in the list) goes first.
        cut_order = sorted(range(len(kept)), key=lambda i: (kept[i].score, i))
        cut: list[int] = []
        ids, system, messages = self._encode(question, kept, summary, tools)
        summary_cut = False
        if len(ids) > budget and summary and len(self._encode(question, (), summary, tools)[0]) > budget:
            # A summary that does not fit even alone goes first: cutting facts for it would empty the memory.
            summary, summary_cut = "", True
            ids, system, messages = self._encode(question, kept, summary, tools)
        while len(ids) > budget and len(cut) < len(cut_order):
            # Drop several facts at once when far over budget (each re-render costs a tokenisation), then
            # re-check; the estimate uses the rendered length of the facts still in.
            over = len(ids) - budget
            n_drop = self._facts_to_drop(over, [kept[i] for i in cut_order[len(cut) :]])
            cut.extend(cut_order[len(cut) : len(cut) + n_drop])
            cut_set = set(cut)
            ids, system, messages = self._encode(
                question, [f for i, f in enumerate(kept) if i not in cut_set], summary, tools
            )
        cut_set = set(cut)
        remaining = [f for i, f in enumerate(kept) if i not in cut_set]
        if len(ids) > budget and summary:
            summary_cut = True
            ids, system, messages = self._encode(question, remaining, "", tools)
        if len(ids) > budget:
            raise PromptTooLongError(
                f"prompt needs {len(ids)} tokens without any memory but episode.prompt_token_budget is {budget};"
                " raise the budget or shorten the question"
            )
        return BuiltPrompt(
            ids=tuple(ids),
            text=system,
            messages=messages,
            included_fact_ids=tuple(f.id for f in remaining),
            cut_fact_ids=tuple(kept[i].id for i in cut),
            summary_cut=summary_cut,
        )

    def _facts_to_drop(self, over_tokens: int, candidates: Sequence[PromptFact]) -> int:
        """How many of ``candidates`` (in cut order) must go to shed ``over_tokens``; at least 1.

        Uses an *over*estimate of each fact line (its text tokens + a markup margin): if the first ``n`` facts
        shed less than needed even by the overestimate, all ``n`` and one more must go. So we never cut more
        than the minimal prefix of the cut order, and each loop iteration costs one re-tokenisation.
        """
        shed, n = 0, 0
        for fact in candidates:
            shed += (
                len(self.tokenizer(fact.text, add_special_tokens=False)["input_ids"]) + _FACT_MARKUP_TOKENS
            )
            if shed >= over_tokens:
                break
            n += 1
        return min(len(candidates), n + 1)
