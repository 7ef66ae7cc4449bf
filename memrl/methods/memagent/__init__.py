"""MemAgent (Yu et al., 2025, arXiv 2507.02259) as a memrl method: the policy reads the history a chunk at a time
(``episode.ingest_chunk_turns``) and after each chunk overwrites one memory text of at most
``memory.write_max_tokens`` tokens; the answer turn reads that text alone (``memory.top_k: 1``, no kept turns).
Every overwrite is a trainable memory step credited with the episode's final-answer reward (``broadcast`` credit:
MemAgent's multi-conversation RL), and the answer is trained on the same reward.

The memory is one fact in the episode's store: the first write ADDs it, each later one UPDATEs it in place, so
the store, forks, write cache and step recording are the policy writer's (:class:`~memrl.memory.writer.
PolicyWriter`). A reply that is empty keeps the previous memory and counts as a format error.

One difference from the paper: MemAgent's overwrite also reads the question. Here the memory is written once per
history and shared by every question asked over it (LoCoMo asks 150-200 per conversation), which keeps an
evaluation at one memory per conversation instead of one per question.
"""

from __future__ import annotations

from collections.abc import Sequence

from memrl.memory.config import MemoryConfig
from memrl.memory.extract import FactDecision, TextGenerator
from memrl.memory.extractors import EXTRACTORS
from memrl.memory.store import FactRecord
from memrl.memory.writer import FORMAT_REASON, ParsedOps, PolicyWriter, WriteRequest, turn_line
from memrl.types import MemoryOpType

EXTRACTOR = "memagent"


@EXTRACTORS.register(EXTRACTOR)
class OverwriteWriter(PolicyWriter):
    """The ``memagent`` extractor: each write's reply replaces the memory text (module docstring). It is shown
    the episode's current memory as its one neighbour (``memory.write_neighbours: 1``)."""

    write_template = "memrl.methods.memagent:write.j2"

    def __init__(self, cfg: MemoryConfig, generate_text: TextGenerator | None = None) -> None:
        # The memory text is found as the one current fact nearest the chunk: kept turns beside it, or no
        # neighbour shown, would make a turn the "memory" or ADD a second text.
        if cfg.keep_turns or cfg.write_neighbours < 1:
            raise ValueError(
                f"memory.extractor={EXTRACTOR} keeps one memory text and rewrites it: it needs "
                f"memory.keep_turns=false and memory.write_neighbours>=1 (got {cfg.keep_turns}, "
                f"{cfg.write_neighbours})"
            )
        super().__init__(cfg, generate_text)

    def render_user(self, req: WriteRequest) -> str:
        memory = req.neighbours[0].text if req.neighbours else "(empty)"
        return "\n".join(["Memory:", memory, "Section:", *map(turn_line, req.turns), "New memory:"])

    def parse(self, reply: str, neighbours: Sequence[FactRecord]) -> ParsedOps:
        text = " ".join((reply or "").split())
        if not text:
            why = "empty reply: the memory stays as it was"
            return ParsedOps((FactDecision(MemoryOpType.NOOP, reason=f"{FORMAT_REASON}: {why}"),), (why,))
        if not neighbours:
            return ParsedOps((FactDecision(MemoryOpType.ADD, text=text),))
        return ParsedOps((FactDecision(MemoryOpType.UPDATE, text=text, fact_id=neighbours[0].fact_id),))
