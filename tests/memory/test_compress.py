from __future__ import annotations

import pytest

from memrl.memory.compress import COMPRESSORS, CompressRequest, regex_token_count, salience
from memrl.memory.config import MemoryConfig
from memrl.types import TurnSpec

TURNS = tuple(
    TurnSpec("history", text, f"D1:{i}", speaker, "1 May 2023")
    for i, (speaker, text) in enumerate(
        [
            ("Ann", "Hey! How are you?"),
            ("Bob", "Good, thanks. Yeah."),
            ("Ann", "I moved to Bergen on 3 June and started at Haukeland Hospital."),
            ("Bob", "Wow, cool."),
            ("Bob", "My sister Lena flies to Madrid in 2024 for her PhD."),
        ]
    )
)


def test_salience_prefers_names_and_numbers():
    assert salience("I moved to Bergen on 3 June.") > salience("Wow, that is so cool.")


@pytest.mark.parametrize("budget", [12, 30, 200])
def test_extractive_summary_fits_budget_and_keeps_order(budget):
    comp = COMPRESSORS.get("extractive")(MemoryConfig(summary_token_budget=budget), None, regex_token_count)
    summary = comp.compress([CompressRequest(TURNS)])[0].summary
    assert regex_token_count([summary])[0] <= budget + 2  # + the joining spaces' worth of slack
    if budget == 30:
        assert "Bergen" in summary and "Madrid" in summary and "How are you" not in summary
        assert summary.index("Bergen") < summary.index("Madrid")  # chronological
    if budget == 200:
        assert "Ann: Hey! How are you?" in summary  # one speaker prefix per turn


def test_llm_compressor_uses_prompt_and_reports_failures():
    seen = []

    def gen(prompts):
        seen.extend(prompts)
        return ["Ann moved to Bergen. Lena goes to Madrid in 2024.", "   "]

    comp = COMPRESSORS.get("llm")(
        MemoryConfig(compressor="llm", summary_token_budget=64), gen, regex_token_count
    )
    ok, failed = comp.compress(
        [CompressRequest(TURNS, "old"), CompressRequest(TURNS[:1], "previous summary")]
    )
    assert ok.ok and ok.summary.startswith("Ann moved to Bergen")
    assert "Haukeland Hospital" in seen[0] and "Previous summary: old" in seen[0]
    assert not failed.ok and failed.summary == "previous summary" and "empty" in failed.reason
