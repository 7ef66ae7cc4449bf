"""Memory-R1 (Yan et al., 2025, arXiv 2508.19828) as a memrl method, from parts memrl registers:

* **Memory manager**: the policy writer (``memory.extractor: policy``, :mod:`memrl.memory.writer`) choosing
  ``ADD`` / ``UPDATE id`` / ``DELETE id`` / ``NOOP`` for each new turn against the current facts nearest it
  (``memory.write_neighbours``), its memory holding what it writes and nothing else (``memory.keep_turns:
  false``). Outcome reward alone: ``snapshot`` step credit (:mod:`memrl.episode.snapshot`) samples
  ``snapshot_k`` operations from one store state, applies each to its own copy of the store, and scores it by
  the answer agent's exact match on that copy (``snapshot_score: answer``, ``episode.reward: exact_match``).
* **Answer agent**: the target-turn template of this package (``episode.prompt_template:
  memrl.methods.memory_r1:answer.j2``): the retrieved memories, then *memory distillation*, copying the ones
  that answer the question between ``<memories>`` tags before the short ``<answer>``; GRPO on exact match.
* **Data**: LoCoMo on Memory-R1's split (``data.options.split_scheme: memory_r1``: train ``conv-26``, validate
  ``conv-30``, test the other eight).

Two differences from the paper: the manager reads a turn, not a fact an extraction model took from it (a
135 M-parameter model is both here), and both agents train in one run, each on its own LoRA adapter
(``train.role_adapters: per_role``), where the paper trains the manager under a frozen answer agent first.
Recipes: ``configs/memory_r1*.yaml`` (docs/methods.md).
"""

ANSWER_TEMPLATE = "memrl.methods.memory_r1:answer.j2"
