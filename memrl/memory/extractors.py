"""The fact extractor registry: ``memory.extractor`` names an extractor class, built as ``cls(cfg, generate_text)``.

* ``rule`` — every turn's speaker-attributed text, no model (:class:`~memrl.memory.extract.RuleExtractor`);
* ``llm`` — mem0-style decisions from a text generator (:class:`~memrl.memory.extract.LlmExtractor`);
* ``gold`` — the dataset's own operations where it knows them (:class:`~memrl.memory.gold.GoldExtractor`);
* ``policy`` — the policy writes its memory, each write a trainable step (:class:`~memrl.memory.writer.PolicyWriter`).

The registry sits above the extractors it lists, so none of them imports another through it. What the memory
system does around an extractor is in its class attributes (``needs_neighbours``, ``writes_steps``), readable
before it is built.
"""

from __future__ import annotations

from memrl.memory.extract import ExtractorFactory, LlmExtractor, RuleExtractor
from memrl.memory.gold import GoldExtractor
from memrl.memory.writer import PolicyWriter
from memrl.registry import Registry

EXTRACTORS: Registry[ExtractorFactory] = Registry("fact extractor")
EXTRACTORS.register("rule")(RuleExtractor)
EXTRACTORS.register("llm")(LlmExtractor)
EXTRACTORS.register("gold")(GoldExtractor)
EXTRACTORS.register("policy")(PolicyWriter)


def writes_steps(name: str) -> bool:
    """Whether extractor ``name`` records each write as a trainable step (the policy writer)."""
    return bool(EXTRACTORS.get(name).writes_steps)
