"""The stop words of memory: words that say nothing about what a fact or a question is about.

One list of function words, in two cuts: BM25 retrieval (:mod:`memrl.memory.retrieval`) drops the full English
set from facts and queries, and the extractive compressor's salience (:mod:`memrl.memory.compress`) counts
everything but the shorter core and the fillers of chat.
"""

from __future__ import annotations

# fmt: off
# Function words both cuts drop.
_CORE = frozenset(
    [
        "a", "an", "and", "are", "as", "at", "be", "been", "but", "by", "can", "could", "did", "do", "does",
        "for", "from", "had", "has", "have", "how", "i", "if", "in", "is", "it", "just", "me", "my", "no",
        "not", "of", "on", "or", "so", "that", "the", "then", "there", "they", "this", "to", "too", "was",
        "we", "were", "what", "when", "with", "you", "your"
    ]
)

# BM25 would otherwise reward matching "the"/"did" in long turns. Tokens are ``[a-z0-9]+`` pieces, so a
# contraction never reaches this list whole.
QUERY_STOP_WORDS = _CORE | frozenset(
    [
        "about", "after", "again", "all", "am", "any", "before", "being", "both", "doing", "down", "during",
        "each", "further", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his",
        "into", "its", "itself", "more", "most", "myself", "nor", "now", "off", "once", "only", "other",
        "our", "ours", "out", "over", "own", "same", "she", "should", "some", "such", "than", "their",
        "theirs", "them", "these", "those", "through", "under", "until", "up", "very", "where", "which",
        "while", "who", "whom", "why", "will", "would", "yours", "yourself"
    ]
)

# Frequent words of chat that carry no memory; salience counts the rest. Tokens keep their apostrophes.
SALIENCE_STOP_WORDS = _CORE | frozenset(["hey", "hi", "i'm", "it's", "like", "oh", "ok", "okay", "wow", "yeah", "yes"])
# fmt: on
