"""``memrl bench extract``: how right the fact extractors' ADD / UPDATE / DELETE / NOOP decisions are.

The synthetic task (:mod:`memrl.adapters.synthetic`) states attributes of persons among chit-chat, and changes some
of them in a later session, so every history turn has a known right decision
(:func:`~memrl.adapters.synthetic.parse_statement` reads its templated turns):

* the first statement of a (person, attribute) → ``ADD``;
* a later statement with another value (the "now" turns) → ``UPDATE`` of the fact that holds the earlier value:
  the right op **and** the right target fact (a fact naming the person and the stale value);
* anything else (chit-chat, a repeated value) → ``NOOP``. An ADD for chit-chat is a false ADD (reported
  separately as ``chitchat_add_rate``: noise in the store rather than a lost fact);
* the task has no retractions, so every ``DELETE`` is wrong (``delete_ops``).

Each extractor ingests the same episodes the way the product does (real MiniLM embedder, real FAISS store,
``MemorySystem.extract_facts_batch``), one history turn of every episode per call, so a turn is decided against
the memory the turns before it left (one call decides all its turns against the memory at its start). The
``llm`` extractor asks the embedded policy (``PolicyConfig()``: SmolLM2-135M-Instruct, greedy) through
:func:`~memrl.memory.llm.policy_text_generator`. Reported per extractor: the turn-level confusion of expected vs
decided op (a turn's op is its UPDATE, else DELETE, else ADD, else NOOP), per-op precision and recall, UPDATE
target accuracy, malformed replies (the extractor turns them into NOOPs) by reason, an end-state check for every
changed (person, attribute) — the active facts hold the latest value and no longer the stale one — also for the
update questions alone, wall seconds and (llm) prompt / completion tokens per turn, and a few raw replies.

Every report also has ``faithfulness`` (:mod:`memrl.memory.faithfulness`): per write, whether each fact it wrote
is supported by the turns it read (a name or value a turn does not contain makes it invented), as an invented
rate split by the kind of turn read (``small_talk`` / ``first`` / ``change`` / ``repeat``).

``--dataset chats`` runs on the held-out free-form chats (:mod:`memrl.adapters.chats`, generated from ``--seed``;
``--episodes`` counts chats, all 24 by default) instead of the synthetic task: natural small talk around personal
facts that change between sessions, each turn tagged with its kind and gold operation, so the same scores (and
the invented-fact rate on small talk) are read on conversations no writer trained on. ``--kinds novel``: chats
whose attribute kinds (a car, an allergy, a sibling, ...) no training chat states.

Options: ``--episodes N`` (test split, 4 by default), ``--extractor rule|llm|policy|gold|both`` (both, the default:
rule and llm side by side in one JSON; gold writes the dataset's own operations, the scoring's ceiling),
``--seed``, ``--config FILE`` (a run's config: its memory section, phrasing and write chunk, e.g. the writer's
settings of ``configs/synthetic_memory_eval.yaml``), and ``key=value`` MemoryConfig overrides over them
(``write_neighbours=3``). Replies of the llm extractor are capped at :data:`LLM_MAX_TOKENS` tokens for CPU time.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence

from memrl.adapters.chats import KINDS
from memrl.adapters.synthetic_phrasing import PHRASINGS
from memrl.bench import BENCHES
from memrl.bench.memory import memory_overrides
from memrl.memory.config import MemoryConfig
from memrl.memory.embedder import Embedder, build_embedder
from memrl.memory.extract import TextGenerator
from memrl.memory.manager import MemorySystem
from memrl.memory.write_scores import score_writes
from memrl.policy.base import Capability, capabilities
from memrl.types import BatchInput

logger = logging.getLogger(__name__)

EXTRACTOR_CHOICES = ("rule", "llm", "policy", "gold", "both")
DATASETS = ("synthetic", "chats")
CHATS = 24  # held-out chats scored by default (memrl.adapters.chats)

# ---------------------------------------------------------------------------------------------------------
# Running an extractor over the episodes


class CountingClient:
    """A PolicyClient wrapper that counts prompt and completion tokens (what ``policy_text_generator`` uses)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.prompt_tokens = 0
        self.completion_tokens = 0
        # The writer switches to its own adapter through this (a per-role run's adapter/memory/); the counts
        # would miss a draft check's forward, so the wrapper offers adapters only.
        self.capabilities = capabilities(inner) & {Capability.ADAPTERS}
        if self.capabilities:
            self.use_adapter = inner.use_adapter

    def generate(self, requests):
        outputs = self.inner.generate(requests)
        self.prompt_tokens += sum(len(r.prompt_ids) for r in requests)
        self.completion_tokens += sum(len(outs[0].token_ids) for outs in outputs)
        return outputs


class _Recorder:
    """Keeps the replies of the latest ``generate_text`` call (one per turn of the extraction call)."""

    def __init__(self, generate_text: TextGenerator) -> None:
        self.generate_text = generate_text
        self.client = getattr(generate_text, "client", None)  # what the policy extractor generates with
        self.last: list[str] = []

    def __call__(self, prompts: list[str]) -> list[str]:
        self.last = self.generate_text(prompts)
        return self.last


def run_extractor(
    episodes: Sequence[BatchInput],
    cfg: MemoryConfig,
    *,
    embedder: Embedder,
    generate_text: TextGenerator | None = None,
    desc: str = "",
    chunk: int = 1,
) -> dict:
    """Ingest ``episodes`` with ``cfg.extractor`` and score every history turn's decisions (see the module doc and
    :func:`~memrl.memory.write_scores.score_writes`)."""
    recorder = _Recorder(generate_text) if generate_text is not None else None
    system = MemorySystem(cfg, embedder=embedder, generate_text=recorder)
    return score_writes(system, episodes, chunk=chunk, desc=desc, recorder=recorder)


def _policy_generator(cfg: MemoryConfig, overrides: dict) -> tuple[TextGenerator, CountingClient, str]:
    import torch

    from memrl.memory.llm import policy_text_generator
    from memrl.policy import PolicyConfig, make_policy
    from memrl.threads import auto_threads

    torch.set_num_threads(auto_threads())  # on a busy machine one thread decodes faster than two that wait

    # The embedded default policy (SmolLM2-135M-Instruct), built as `memrl run` builds it.
    policy_cfg = PolicyConfig(**overrides)
    client = CountingClient(make_policy(policy_cfg))
    generate_text = policy_text_generator(client, max_tokens=cfg.llm_max_tokens)
    model = policy_cfg.model + (f" + LoRA {policy_cfg.lora_path}" if policy_cfg.lora_path else "")
    return generate_text, client, model


def _policy_overrides(p: argparse.ArgumentParser, items: Sequence[str]) -> dict:
    """``policy.KEY=VALUE`` items → PolicyConfig kwargs (strings; the bench's model settings are all paths/names)."""
    import dataclasses

    from memrl.policy import PolicyConfig

    valid = {f.name for f in dataclasses.fields(PolicyConfig)}
    out = {}
    for item in items:
        key, sep, value = item[len("policy.") :].partition("=")
        if not sep or key not in valid:
            p.error(f"override {item!r}: expected policy.KEY=VALUE with KEY in {sorted(valid)}")
        out[key] = value
    return out


LLM_MAX_TOKENS = 64  # reply cap of the llm extractor here (MemoryConfig's own default: 256)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options; ``overrides`` comes back as MemoryConfig keyword arguments over the bench's defaults."""
    p = argparse.ArgumentParser(prog="memrl bench extract", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--episodes",
        type=int,
        help=f"synthetic test-split episodes (18 history turns each; default 4), or chats ({CHATS} by default)",
    )
    p.add_argument(
        "--dataset",
        choices=DATASETS,
        default="synthetic",
        help="the synthetic task, or the held-out free-form chats (memrl.adapters.chats)",
    )
    p.add_argument(
        "--split",
        choices=("test", "validation"),
        default="test",
        help="test: held-out episodes (default); validation: the task's training distribution, for choosing "
        "settings (the chats' training pool)",
    )
    p.add_argument(
        "--kinds",
        choices=KINDS,
        default="seen",
        help="chats: the training chats' attribute kinds (default), or held-out kinds no training chat states",
    )
    p.add_argument("--extractor", choices=EXTRACTOR_CHOICES, default="both")
    p.add_argument("--seed", type=int, default=0, help="the synthetic adapter's data seed")
    p.add_argument(
        "--config",
        help="take the memory settings, phrasing and write chunk from this run config (overrides and the "
        "options above win)",
    )
    p.add_argument(
        "--chunk",
        type=int,
        help="turns per policy write (episode.ingest_chunk_turns of the training; default 1)",
    )
    p.add_argument(
        "--phrasing",
        choices=PHRASINGS,
        help="how the synthetic task words facts and changes (default fixed)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help=f"MemoryConfig key=value overrides (default llm_max_tokens={LLM_MAX_TOKENS}), and policy.KEY=VALUE "
        "for the llm / policy extractors' model (policy.lora_path=runs/x/checkpoints/step_000010/adapter)",
    )
    args = p.parse_args(argv)
    args.policy_overrides = _policy_overrides(p, [o for o in args.overrides if o.startswith("policy.")])
    memory = memory_overrides(p, [o for o in args.overrides if not o.startswith("policy.")])
    base = _config_defaults(p, args) if args.config else {}
    args.phrasing = args.phrasing or "fixed"
    args.chunk = args.chunk or 1
    args.overrides = {**base, "llm_max_tokens": LLM_MAX_TOKENS, **memory}
    if "extractor" in args.overrides:
        p.error("name the extractor with --extractor rule|llm|both, not extractor=...")
    if args.kinds != "seen" and args.dataset != "chats":
        p.error("--kinds chooses the chats' attribute kinds; give --dataset chats")
    if args.kinds == "novel" and args.split != "test":
        p.error("--kinds novel is held out: it has --split test only")
    if args.episodes is None:
        args.episodes = CHATS if args.dataset == "chats" else 4
    if args.episodes < 1:
        p.error(f"--episodes must be >= 1, got {args.episodes}")
    return args


def _config_defaults(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """A run config's memory settings as MemoryConfig kwargs (its extractor aside: ``--extractor`` names that);
    fills ``--phrasing`` and ``--chunk`` from it where not given."""
    import dataclasses

    from memrl.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except (ConfigError, ValueError) as exc:
        p.error(str(exc))
    args.phrasing = args.phrasing or cfg.data.options.get("phrasing")
    args.chunk = args.chunk or cfg.episode.ingest_chunk_turns or None
    return {k: v for k, v in dataclasses.asdict(cfg.memory).items() if k != "extractor"}


def _episodes(args: argparse.Namespace) -> list[BatchInput]:
    """The episodes to write: synthetic test episodes, or one per held-out chat (its history; the chat's
    questions share it)."""
    from memrl.data.adapters import run_adapter

    if args.dataset == "chats":
        per_question, _ = run_adapter(
            "chats", None, split=args.split,
            options={"num_chats": args.episodes, "seed": args.seed, "kinds": args.kinds},
        )  # fmt: skip
        return list({ep.metadata["sample_id"]: ep for ep in per_question}.values())
    options = {"num_episodes": args.episodes, "seed": args.seed, "phrasing": args.phrasing}
    return run_adapter("synthetic", None, split=args.split, options=options)[0]


@BENCHES.register("extract")
def bench_extract(argv: list[str]) -> dict:
    args = parse_args(argv)
    overrides, policy_overrides = args.overrides, args.policy_overrides
    episodes = _episodes(args)
    names = ("rule", "llm") if args.extractor == "both" else (args.extractor,)
    embedder = build_embedder(MemoryConfig(**overrides))
    result: dict = {
        "dataset": args.dataset,
        **({"kinds": args.kinds} if args.dataset == "chats" else {}),
        "split": args.split,
        "episodes": len(episodes),
        "history_turns": sum(len(ep.history) for ep in episodes),
        "seed": args.seed,
        "phrasing": args.phrasing,
        "chunk": args.chunk,
        "overrides": {**overrides, **{f"policy.{k}": v for k, v in policy_overrides.items()}},
    }
    for name in names:
        cfg = MemoryConfig(**{**overrides, "extractor": name})
        generate_text, client, model = (
            _policy_generator(cfg, policy_overrides) if name in ("llm", "policy") else (None, None, "")
        )
        t0 = time.perf_counter()
        # The bench counts malformed replies itself; one warning per reply would bury the progress bar.
        extract_log = logging.getLogger("memrl.memory.extract")
        level = extract_log.level
        extract_log.setLevel(logging.ERROR)
        try:
            scores = run_extractor(
                episodes,
                cfg,
                embedder=embedder,
                generate_text=generate_text,
                desc=f"bench extract ({name})",
                chunk=args.chunk,
            )
        finally:
            extract_log.setLevel(level)
        if client is not None:
            turns = result["history_turns"]
            scores["model"] = f"{model} (greedy)"
            scores["prompt_tokens_per_turn"] = round(client.prompt_tokens / turns, 1)
            scores["completion_tokens_per_turn"] = round(client.completion_tokens / turns, 1)
        scores["total_seconds"] = round(time.perf_counter() - t0, 3)  # with model loading
        result[name] = scores
    return result
