"""A persistent cache of greedy memory writes: a frozen writer writes each prompt once, across runs.

A policy writer (:mod:`memrl.memory.writer`) writes LoCoMo's ~600 turns per conversation one call at a time:
~80 min for the eight test conversations on 2 CPU cores. Greedy writes are a function of the writer's weights and
its prompt, so evaluating another answer policy over the same writer, training the answer role over the memory a
frozen writer builds (``train.roles: [answer]`` writes greedily), or a rerun, writes nothing new.

A reply is stored under SHA-256 of (writer digest, max tokens, stop ids, prompt ids) in
``$MEMRL_CACHE_DIR/writes/<writer digest>.sqlite``. The digest (:func:`writer_digest`) hashes the writer's
LoRA tensors as they are at the call, so a writer being trained never reads a stale reply, plus the base model's
config and a slice of its embeddings. Sampled writes (temperature > 0) are never cached. A backend without
in-process weights (a server) has no digest and is not cached.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from memrl.blob_cache import BlobCache

_BASE_SLICE = 1 << 16  # embedding values hashed to tell base models apart (the whole matrix is ~100 MB)


def _tensor_bytes(t) -> bytes:
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()


def writer_digest(model, adapter: str | None) -> str | None:
    """Hex digest of what a greedy write depends on in ``model``: its base (config + an embedding slice) and the
    LoRA tensors of ``adapter`` (None: no adapter). None for an object that is not a torch module."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return None
    h = hashlib.sha256()
    config = getattr(model, "config", None)
    h.update(config.to_json_string().encode() if hasattr(config, "to_json_string") else repr(config).encode())
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None:
        h.update(_tensor_bytes(embeddings.weight.reshape(-1)[:_BASE_SLICE]))
    if adapter is not None:
        marker = f".{adapter}."
        for name, param in sorted(model.named_parameters()):
            if "lora_" in name and marker in name:
                h.update(name.encode())
                h.update(_tensor_bytes(param))
    return h.hexdigest()


class WriteCache:
    """Greedy replies of one writer (``digest``): prompt ids → (response ids, their log-probs)."""

    def __init__(self, root: Path, digest: str) -> None:
        self.digest = digest
        self._blobs = BlobCache(Path(root) / "writes" / f"{digest[:32]}.sqlite", "memory write cache")

    def key(self, prompt: Sequence[int], max_tokens: int, stop_ids: Sequence[int]) -> bytes:
        head = json.dumps([self.digest, int(max_tokens), [int(s) for s in stop_ids]]).encode()
        return hashlib.sha256(head + b"|" + ",".join(map(str, prompt)).encode()).digest()

    def get(self, keys: Sequence[bytes]) -> dict[bytes, tuple[tuple[int, ...], tuple[float, ...]]]:
        out = {}
        for key, blob in self._blobs.get_many(keys).items():
            row = json.loads(blob)
            out[key] = (tuple(row["ids"]), tuple(row["logprobs"]))
        return out

    def put(self, items: dict[bytes, tuple[Sequence[int], Sequence[float]]]) -> None:
        self._blobs.put_many(
            {
                k: json.dumps({"ids": [int(i) for i in ids], "logprobs": [float(x) for x in lps]}).encode()
                for k, (ids, lps) in items.items()
            }
        )

    def close(self) -> None:
        self._blobs.close()
