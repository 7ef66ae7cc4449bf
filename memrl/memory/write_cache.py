"""A persistent cache of greedy memory writes: a frozen writer writes each prompt once, across runs.

A policy writer (:mod:`memrl.memory.writer`) writes a long conversation one call at a time, which takes long on
CPU cores. Greedy writes are a function of the writer's weights and
its prompt, so evaluating another answer policy over the same writer, training the answer role over the memory a
frozen writer builds (``train.roles: [answer]`` writes greedily), or a rerun, writes nothing new.

A reply is stored under SHA-256 of (writer digest, max tokens, stop ids, prompt ids) in
``$MEMRL_CACHE_DIR/writes/<writer digest>.sqlite``. The digest (the policy's ``weights_digest``) hashes the writer's
LoRA tensors as they are at the call, so a writer being trained never reads a stale reply, plus the base model's
config and a slice of its embeddings. Sampled writes (temperature > 0) are never cached. A backend without
in-process weights (a server) has no digest and is not cached.

**Drafts.** Every greedy reply, decoded or read from the cache, is also kept under its prompt alone in
``writes/drafts.sqlite``: the last reply a writer gave that prompt. A writer whose weights changed a little (a
writer being trained, its checkpoint evaluated) misses its own cache but mostly writes what the writer before it
wrote. So a miss with a draft checks it in one teacher-forced forward
(the policy's ``greedy_logprobs``, :class:`memrl.policy.base.Capability`): where every draft token is the new writer's argmax and the
draft ends as greedy decoding ends (its stop token, or ``max_tokens`` tokens), the draft *is* the new writer's
greedy reply and is taken without decoding. Otherwise the forward still gives the greedy reply up to and including
the first token where the two differ, and only the rest is decoded. The forward and the decode
can differ in the last bits of a logit, so a draft can be taken over a reply that decoding would have broken off
at an exact tie; the same holds between two batch sizes of decoding itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from memrl.blob_cache import BlobCache

Reply = tuple[tuple[int, ...], tuple[float, ...]]  # response ids, their log-probs


def _blob(reply: tuple[Sequence[int], Sequence[float]]) -> bytes:
    ids, lps = reply
    return json.dumps({"ids": [int(i) for i in ids], "logprobs": [float(x) for x in lps]}).encode()


class WriteCache:
    """Greedy replies of one writer (``digest``) at one ``max_tokens`` and stop ids: prompt ids → :data:`Reply`,
    and the drafts every writer shares (module docstring)."""

    def __init__(self, root: Path, digest: str, max_tokens: int, stop_ids: Sequence[int]) -> None:
        self.digest = digest
        self.max_tokens, self.stop_ids = int(max_tokens), tuple(int(s) for s in stop_ids)
        self._blobs = BlobCache(Path(root) / "writes" / f"{digest[:32]}.sqlite", "memory write cache")
        self._drafts = BlobCache(Path(root) / "writes" / "drafts.sqlite", "memory write drafts")

    def _key(self, prompt: Sequence[int], digest: str) -> bytes:
        head = json.dumps([digest, self.max_tokens, list(self.stop_ids)]).encode()
        return hashlib.sha256(head + b"|" + ",".join(map(str, prompt)).encode()).digest()

    def get(self, prompts: Sequence[Sequence[int]]) -> dict[int, Reply]:
        """This writer's cached replies, by index into ``prompts``."""
        return self._read(self._blobs, [self._key(p, self.digest) for p in prompts])

    def drafts(self, prompts: Sequence[Sequence[int]]) -> dict[int, Reply]:
        """The last reply any writer cached for each prompt (unchecked), by index into ``prompts``."""
        return self._read(self._drafts, [self._key(p, "") for p in prompts])

    @staticmethod
    def _read(blobs: BlobCache, keys: list[bytes]) -> dict[int, Reply]:
        found = blobs.get_many(keys)
        out = {}
        for i, key in enumerate(keys):
            if key in found:
                row = json.loads(found[key])
                out[i] = (tuple(row["ids"]), tuple(row["logprobs"]))
        return out

    def put(self, prompts: Sequence[Sequence[int]], replies: Sequence[Reply]) -> None:
        """Cache this writer's greedy ``replies`` (one per prompt); each is also its prompt's draft."""
        blobs = [_blob(r) for r in replies]  # encoded once for both tables
        self._blobs.put_many({self._key(p, self.digest): b for p, b in zip(prompts, blobs, strict=True)})
        self._drafts.put_many({self._key(p, ""): b for p, b in zip(prompts, blobs, strict=True)})

    def set_drafts(self, prompts: Sequence[Sequence[int]], replies: Sequence[Reply]) -> None:
        """Make ``replies`` the drafts of ``prompts`` (replies this writer read from its cache, too)."""
        self._drafts.put_many({self._key(p, ""): _blob(r) for p, r in zip(prompts, replies, strict=True)})

    def greedy_ending(self, ids: Sequence[int]) -> bool:
        """Whether greedy decoding would stop where ``ids`` ends: at a stop token, or at ``max_tokens``."""
        if not ids or any(t in self.stop_ids for t in ids[:-1]):
            return False
        return ids[-1] in self.stop_ids or len(ids) == self.max_tokens

    def close(self) -> None:
        self._blobs.close()
        self._drafts.close()
