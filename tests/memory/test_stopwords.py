"""The stop words of memory (memrl.memory.stopwords): one list of function words, cut for BM25 and for salience."""

from __future__ import annotations

from memrl.memory.compress import salience
from memrl.memory.retrieval import tokenize_stemmed
from memrl.memory.stopwords import QUERY_STOP_WORDS, SALIENCE_STOP_WORDS


def test_both_cuts_drop_the_core_function_words():
    assert {"the", "did", "what", "my"} <= QUERY_STOP_WORDS & SALIENCE_STOP_WORDS
    # BM25 drops the full English set; salience also ignores the fillers of chat.
    assert "would" in QUERY_STOP_WORDS - SALIENCE_STOP_WORDS
    assert {"yeah", "i'm"} <= SALIENCE_STOP_WORDS - QUERY_STOP_WORDS


def test_retrieval_and_compression_read_their_cut():
    assert tokenize_stemmed("Where would she go?") == ["go"]
    assert salience("yeah okay wow") == 0.0
