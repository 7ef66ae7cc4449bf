"""The embedded default policy: a small Llama (byte-level BPE made here) trained by SFT on the synthetic task.

``memrl model tiny`` (or the first ``policy.model: tiny``) builds it with no download: synthetic train-split
episodes → prompts exactly as the episode pipeline builds them → gold responses (``<answer>``, python tool calls
for arithmetic) → a seeded SFT run on CPU → held-out exact match on the test split (disjoint names and values),
with and without the gold facts in the prompt. The result lives in ``<cache>/tiny-<recipe digest>/``
(``$MEMRL_CACHE_DIR`` or ``~/.cache/memrl``): HF model + tokenizer (with chat template) + ``metrics.json`` +
``loss.png``. A changed recipe or prompt template is a new digest, hence a new build. The default recipe's build
(~40 CPU-minutes) also ships inside the package (``shipped/``), made here by this same code, so a fresh install
does not wait for it; ``memrl model tiny --force`` rebuilds it into the cache.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import math
import operator
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from memrl.policy.tiny_arch import bpe_tokenizer, byte_tokenizer, tiny_llama_config
from memrl.policy.tiny_data import (
    WORD_MAKERS,
    FactOptions,
    SFTExample,
    build_example,
    choose_facts,
    copy_drill_example,
    encode_text,
    letter_token_ids,
    repeat_drill_example,
    single_fact_example,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TinyRecipe:
    """Everything that determines the tiny model; its digest names the cache directory."""

    seed: int = 0
    train_episodes: int = 3000
    eval_episodes: int = 90
    hidden_size: int = 96
    num_layers: int = 3
    num_heads: int = 3  # head_dim 32: vLLM's CPU attention supports head sizes >= 32
    intermediate_size: int = 256
    max_position_embeddings: int = 4096  # memory prompts are long; contexts of >= 2048 tokens must work
    # ~9000 steps: copying numbers out of the facts appears only after ~2-3k steps (a phase transition).
    steps: int = 9000
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    # A little language modelling of the prompt: its repeated spans (the summary restates fact lines) help
    # attention learn to copy; more drowns the answer tokens (~2% of all tokens).
    prompt_loss_weight: float = 0.1
    # Every training episode renamed (randomize_p=1) with random letters: the train/test pools are disjoint, so
    # the only transferable skill is reading the answer out of the facts.
    facts: FactOptions = field(
        default_factory=lambda: FactOptions(
            min_distractors=1, max_distractors=3, summary_p=0.5, randomize_p=1.0
        )
    )
    tools: tuple[str, ...] = ("python", "search")
    # More questions about the same memory after the first answer: more recall events per (costly) prompt.
    follow_ups: int = 0
    # Stage 1 (0 = none): single-fact recall examples (see tiny_data.single_fact_example) before the pipeline-
    # format SFT; "random" answer words make copying the only way to predict them (see randomize_names).
    recall_steps: int = 0
    recall_batch_size: int = 8
    # Stage 2 keeps single-fact recall in every batch (this many per pipeline example, rounded): copying learnt in
    # stage 1 otherwise fades under the pipeline format's loss (word answers fell back to 0 % in 400 steps).
    recall_mix: float = 0.0
    # Copy drills (tiny_data.copy_drill_example: key/value recall over random letter-token strings) in every SFT
    # batch, round(batch_size * copy_mix) of them, drawn from copy_examples made once: dense practice of the
    # multi-token copy that word answers need (the pipeline data alone never taught it, see README).
    copy_mix: float = 0.0
    copy_examples: int = 20000
    # Stage 0 (0 = none): repeat drills only (tiny_data.repeat_drill_example), short and cheap, so induction (the
    # continuation half of copying a word) exists before the pipeline data and its copy drills start.
    repeat_steps: int = 0
    repeat_batch_size: int = 16
    answer_words: str = "random"
    template: str = "target_turn.j2"
    # "byte" (ByT5) or "bpe": a byte-level BPE of bpe_vocab_size ids trained on synthetic-task text made with a
    # separate seed (see tiny_arch.bpe_tokenizer for why).
    tokenizer: str = "bpe"
    bpe_vocab_size: int = 2048
    # Spaces as tokens of their own, so a word has the same tokens mid-sentence in a fact (" Rocky") as in the
    # answer tag ("<answer>Rocky"): copying is then a pure copy instead of a re-spelling (see bpe_tokenizer).
    bpe_isolate_spaces: bool = True
    version: int = 1

    def digest(self) -> str:
        from memrl.episode.prompt import load_template

        fields = dataclasses.asdict(self)
        # Fields added after version 1 enter the digest only when used, so old builds stay valid.
        defaults = {
            "follow_ups": 0,
            "recall_steps": 0,
            "recall_batch_size": 8,
            "recall_mix": 0.0,
            "copy_mix": 0.0,
            "copy_examples": 20000,
            "repeat_steps": 0,
            "repeat_batch_size": 16,
            "answer_words": "pseudo",
            "tokenizer": "byte",
            "bpe_vocab_size": 2048,
            "bpe_isolate_spaces": False,
        }
        for name, default in defaults.items():
            if fields[name] == default:
                del fields[name]
        payload = json.dumps(fields, sort_keys=True)
        payload += load_template(self.template).render(facts=[], summary="x", tools=["t"])
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def cache_root() -> Path:
    env = os.environ.get("MEMRL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "memrl"


def tiny_model_dir(recipe: TinyRecipe | None = None) -> Path:
    return cache_root() / f"tiny-{(recipe or TinyRecipe()).digest()}"


SHIPPED_DIR = Path(__file__).parent / "shipped"


def shipped_model_dir(recipe: TinyRecipe | None = None) -> Path | None:
    """The copy of this recipe's build shipped inside the package (made here by :func:`build_tiny_model`, so a
    fresh install skips the CPU-heavy build), or None."""
    path = SHIPPED_DIR / f"tiny-{(recipe or TinyRecipe()).digest()}"
    return path if (path / "metrics.json").is_file() else None


def find_tiny_model(recipe: TinyRecipe | None = None) -> Path | None:
    """The recipe's finished build without building: the cache's own build, else the shipped copy, else None."""
    out = tiny_model_dir(recipe)
    return out if (out / "metrics.json").is_file() else shipped_model_dir(recipe)


def ensure_tiny_model(recipe: TinyRecipe | None = None, *, force: bool = False) -> Path:
    """The tiny model's directory: :func:`find_tiny_model`, else a new build (one builder at a time, via a file
    lock). ``force`` always rebuilds into the cache."""
    recipe = recipe or TinyRecipe()
    found = None if force else find_tiny_model(recipe)
    if found is not None:
        return found
    out = tiny_model_dir(recipe)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent builder finishes first; then we reuse its result
        if (out / "metrics.json").is_file() and not force:
            return out
        logger.info("building the tiny model into %s (a few minutes on 2 CPU cores)", out)
        tmp = out.parent / f"{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        build_tiny_model(recipe, tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


# ---------------------------------------------------------------------------------------------- data


def _episodes(split: str, n: int, seed: int):
    from memrl.data.adapters import run_adapter

    episodes, _ = run_adapter("synthetic", None, split=split, options={"num_episodes": n, "seed": seed})
    return episodes


def _prompt_builder(tokenizer, recipe: TinyRecipe):
    from memrl.episode.config import EpisodeConfig
    from memrl.episode.prompt import PromptBuilder

    cfg = EpisodeConfig(prompt_template=recipe.template, prompt_token_budget=recipe.max_position_embeddings)
    return PromptBuilder(cfg, tokenizer)


def make_tokenizer(recipe: TinyRecipe):
    """The recipe's tokenizer. The BPE is trained on the decoded text of SFT examples drawn with another seed, so
    it knows the prompt template and the train pool's words but not the test pool's (held-out words split)."""
    byte_tok = byte_tokenizer()
    if recipe.tokenizer == "byte":
        return byte_tok
    if recipe.tokenizer != "bpe":
        raise ValueError(f"TinyRecipe.tokenizer: unknown {recipe.tokenizer!r}; valid: 'byte', 'bpe'")
    corpus_recipe = dataclasses.replace(recipe, seed=recipe.seed + 1000)
    texts = [
        byte_tok.decode(list(e.prompt_ids) + list(e.response_ids))
        for e in make_sft_examples(corpus_recipe, byte_tok)
    ]
    return bpe_tokenizer(texts, recipe.bpe_vocab_size, isolate_spaces=recipe.bpe_isolate_spaces)


def make_sft_examples(recipe: TinyRecipe, tokenizer) -> list[SFTExample]:
    builder = _prompt_builder(tokenizer, recipe)
    rng = random.Random(recipe.seed)
    eps = _episodes("train", recipe.train_episodes, recipe.seed)
    word = WORD_MAKERS[recipe.answer_words]
    return [
        build_example(ep, builder, rng, recipe.facts, recipe.tools, recipe.follow_ups, word=word)
        for ep in eps
    ]


def make_copy_examples(recipe: TinyRecipe, tokenizer) -> list[SFTExample]:
    """The copy drills of ``recipe.copy_mix`` (their own seed stream)."""
    rng = random.Random(recipe.seed + 2)
    letters = letter_token_ids(tokenizer)
    return [copy_drill_example(letters, tokenizer, rng) for _ in range(recipe.copy_examples)]


def make_repeat_examples(recipe: TinyRecipe, tokenizer) -> list[SFTExample]:
    """Stage-0 repeat drills (their own seed stream), as many as the copy drills."""
    rng = random.Random(recipe.seed + 3)
    letters = letter_token_ids(tokenizer)
    return [repeat_drill_example(letters, tokenizer, rng) for _ in range(recipe.copy_examples)]


def make_recall_examples(recipe: TinyRecipe, tokenizer) -> list[SFTExample]:
    """Stage-1 examples: one per train episode (a separate seed stream from stage 2)."""
    rng = random.Random(recipe.seed + 1)
    eps = _episodes("train", recipe.train_episodes, recipe.seed)
    word = WORD_MAKERS[recipe.answer_words]
    return [single_fact_example(ep, tokenizer, rng, word) for ep in eps]


# ---------------------------------------------------------------------------------------------- training


def _batch(examples: Sequence[SFTExample], pad_id: int, prompt_weight: float):
    """Right-padded ``input_ids``/``attention_mask`` ``[B, L]`` and per-token loss ``weights`` ``[B, L]``.

    ``weights[i, t]`` weighs predicting token ``t``: 1 for model response tokens, ``prompt_weight`` for prompt
    tokens (a little language modelling of the facts teaches a byte-level model words and names faster), 0 for
    tool output and padding."""
    L = max(len(e.prompt_ids) + len(e.response_ids) for e in examples)
    ids = torch.full((len(examples), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), L), dtype=torch.long)
    weights = torch.zeros((len(examples), L))
    for i, e in enumerate(examples):
        seq = list(e.prompt_ids) + list(e.response_ids)
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        p = len(e.prompt_ids)
        weights[i, 1:p] = prompt_weight
        weights[i, p : len(seq)] = torch.tensor(e.response_mask, dtype=torch.float32)
    return ids, attn, weights


def _lr_at(step: int, recipe: TinyRecipe) -> float:
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    frac = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_sft(
    model,
    examples: Sequence[SFTExample],
    recipe: TinyRecipe,
    pad_id: int,
    mixes: Sequence[tuple[Sequence[SFTExample], float]] = (),
) -> list[float]:
    """Seeded SFT (AdamW, warmup + cosine) on weighted token cross-entropy (see :func:`_batch`); for each
    ``(pool, mix)`` of ``mixes`` every batch also draws ``round(batch_size * mix)`` examples from ``pool``."""
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(recipe.seed)
    opt = torch.optim.AdamW(
        model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay, betas=(0.9, 0.98)
    )
    model.train()
    losses = []
    mixes = [
        (pool, round(recipe.batch_size * mix))
        for pool, mix in mixes
        if pool and round(recipe.batch_size * mix)
    ]
    bar = tqdm(range(recipe.steps), desc="tiny sft", mininterval=5)
    for step in bar:
        idx = torch.randint(0, len(examples), (recipe.batch_size,), generator=gen).tolist()
        batch = [examples[i] for i in idx]
        for pool, n_mix in mixes:
            batch += [pool[i] for i in torch.randint(0, len(pool), (n_mix,), generator=gen).tolist()]
        ids, attn, weights = _batch(batch, pad_id, recipe.prompt_loss_weight)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # [B, L-1, V] predicts ids[:, 1:]
        ce = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), ids[:, 1:], reduction="none"
        )  # [B, L-1]
        loss = (ce * weights[:, 1:]).sum() / weights[:, 1:].sum()
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, recipe)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


def build_tiny_model(recipe: TinyRecipe, out_dir: Path) -> dict:
    """Train, evaluate and save the tiny model into ``out_dir``; returns the metrics written there."""
    from transformers import LlamaForCausalLM

    t0 = time.time()
    threads = auto_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(recipe.seed)
    random.seed(recipe.seed)
    tokenizer = make_tokenizer(recipe)
    examples = make_sft_examples(recipe, tokenizer)
    t_data = time.time() - t0
    config = tiny_llama_config(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads,
        intermediate_size=recipe.intermediate_size,
        max_position_embeddings=recipe.max_position_embeddings,
    )
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    losses: list[float] = []
    pad_id = int(tokenizer.pad_token_id)
    if recipe.repeat_steps:
        stage0 = dataclasses.replace(
            recipe, steps=recipe.repeat_steps, batch_size=recipe.repeat_batch_size, prompt_loss_weight=0.0
        )
        losses += train_sft(model, make_repeat_examples(recipe, tokenizer), stage0, pad_id)
    recall = make_recall_examples(recipe, tokenizer) if recipe.recall_steps or recipe.recall_mix else []
    if recipe.recall_steps:
        stage1 = dataclasses.replace(
            recipe, steps=recipe.recall_steps, batch_size=recipe.recall_batch_size, prompt_loss_weight=0.1
        )
        losses += train_sft(model, recall, stage1, pad_id)
    drills = make_copy_examples(recipe, tokenizer) if recipe.copy_mix else []
    losses += train_sft(
        model, examples, recipe, pad_id, [(recall, recipe.recall_mix), (drills, recipe.copy_mix)]
    )
    t_train = time.time() - t0 - t_data
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    evals = evaluate_tiny(model, tokenizer, recipe)
    metrics = {
        "recipe": dataclasses.asdict(recipe),
        "digest": recipe.digest(),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "sft_examples": len(examples),
        "mean_prompt_tokens": sum(len(e.prompt_ids) for e in examples) / len(examples),
        "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "losses": losses,
        "time_s": {"data": t_data, "train": t_train, "total": time.time() - t0},
        "torch_threads": threads,
        **evals,
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    _plot_loss(losses, out_dir / "loss.png")
    return metrics


def auto_threads() -> int:
    """``$MEMRL_TINY_THREADS``, else 1 thread when the machine is oversubscribed (OpenMP threads that wait for a
    descheduled sibling make a step 2-3x slower than one thread), else every core."""
    env = os.environ.get("MEMRL_TINY_THREADS")
    if env:
        return max(1, int(env))
    cores = os.cpu_count() or 1
    return 1 if os.getloadavg()[0] > cores else cores


def _plot_loss(losses: Sequence[float], path: Path) -> None:
    with contextlib.suppress(ImportError):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot(losses)
        ax.set_xlabel("step")
        ax.set_ylabel("response-token loss")
        ax.set_yscale("log")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


# ---------------------------------------------------------------------------------------------- evaluation

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def arithmetic_tool(code: str) -> str:
    """The eval's stand-in for the python tool: runs ``print(<integer arithmetic>)`` and nothing else.

    The real sandboxed python tool lives in :mod:`memrl.tools`; here only the SFT task's one-line programs need
    running, so we evaluate their AST without executing code. Anything else is reported as an error string.
    """

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("unsupported")

    try:
        tree = ast.parse(code.strip(), mode="eval").body
        if not (
            isinstance(tree, ast.Call) and getattr(tree.func, "id", None) == "print" and len(tree.args) == 1
        ):
            raise ValueError("not a print call")
        return str(ev(tree.args[0]))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: {exc}"


def held_out_prompts(
    tokenizer, recipe: TinyRecipe, n: int, *, with_gold: bool = True
) -> tuple[list, list[tuple[int, ...]]]:
    """``n`` test-split episodes and their target-turn prompt ids in the pipeline's format (a few facts, with or
    without the gold evidence among them), seeded: the prompts the build evaluates on."""
    builder = _prompt_builder(tokenizer, recipe)
    eps = _episodes("test", n, recipe.seed + 1)
    rng = random.Random(recipe.seed + 7)
    prompts = [
        builder.build(
            ep.final_query, choose_facts(ep, rng, recipe.facts, with_gold=with_gold), "", recipe.tools
        ).ids
        for ep in eps
    ]
    return eps, prompts


def evaluate_tiny(model, tokenizer, recipe: TinyRecipe) -> dict:
    """Held-out exact match (test split) with and without the gold evidence facts, greedy, with python calls."""
    from memrl.policy.config import PolicyConfig
    from memrl.policy.hf import HFPolicy

    policy = HFPolicy.from_model(model, tokenizer, PolicyConfig(model="tiny", seed=recipe.seed))
    out = {}
    for with_gold in (True, False):
        eps, prompts = held_out_prompts(tokenizer, recipe, recipe.eval_episodes, with_gold=with_gold)
        answers = run_with_tools(policy, prompts)
        hits = [a.strip() == (ep.target_answer or "").strip() for a, ep in zip(answers, eps, strict=True)]
        by_type: dict[str, list[bool]] = {}
        by_kind: dict[str, list[bool]] = {}  # numbers vs words: words are the harder copy (several tokens)
        for ep, hit in zip(eps, hits, strict=True):
            by_type.setdefault(ep.metadata["question_type"], []).append(hit)
            by_kind.setdefault("number" if ep.target_answer.isdigit() else "word", []).append(hit)
        key = "with_gold_facts" if with_gold else "without_gold_facts"
        out[f"eval/em_{key}"] = sum(hits) / len(hits)
        out[f"eval/em_{key}_by_type"] = {k: sum(v) / len(v) for k, v in sorted(by_type.items())}
        out[f"eval/em_{key}_by_answer_kind"] = {k: sum(v) / len(v) for k, v in sorted(by_kind.items())}
        out[f"eval/samples_{key}"] = [
            {"q": ep.final_query, "gold": ep.target_answer, "pred": a}
            for ep, a in list(zip(eps, answers, strict=True))[:5]
        ]
    out["eval/word_copy_token_accuracy"] = word_copy_accuracy(model, tokenizer, recipe)
    return out


def word_copy_accuracy(model, tokenizer, recipe: TinyRecipe, episodes: int = 200) -> dict[str, float]:
    """Teacher-forced next-token accuracy on held-out *word* answers (gold facts shown), per token of the word.

    Tells the two halves of copying apart: token 0 is picking the right fact's value (attention to the right
    place); tokens 1+ are continuing a copy given its start (induction: what followed this token in the fact)."""
    from memrl.formats import ANSWER_OPEN

    builder = _prompt_builder(tokenizer, recipe)
    rng = random.Random(recipe.seed + 7)
    opener = encode_text(tokenizer, ANSWER_OPEN)
    hits: dict[int, list[bool]] = {}
    for ep in _episodes("test", episodes, recipe.seed + 1):
        if (ep.target_answer or "0").isdigit():
            continue
        prompt = builder.build(ep.final_query, choose_facts(ep, rng, recipe.facts), "", recipe.tools)
        word = encode_text(tokenizer, ep.target_answer)
        ids = list(prompt.ids) + opener + word
        with torch.no_grad():
            pred = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1)  # [L]
        start = len(ids) - len(word)
        for k, tok_id in enumerate(word):
            hits.setdefault(min(k, 2), []).append(int(pred[start + k - 1]) == tok_id)
    names = {0: "first", 1: "second", 2: "later"}
    return {names[k]: sum(v) / len(v) for k, v in sorted(hits.items())}


def run_with_tools(
    policy, prompts: Sequence[Sequence[int]], max_calls: int = 2, max_tokens: int = 96
) -> list[str]:
    """Greedy generation with ``<python>`` calls answered by :func:`arithmetic_tool`; returns answer strings."""
    from memrl.formats import ANSWER_STOP_STRINGS, TOOL_STOP_STRINGS, extract_answer, format_result
    from memrl.policy.base import GenerationRequest, SamplingParams

    tok = policy.tokenizer
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, stop=TOOL_STOP_STRINGS + ANSWER_STOP_STRINGS
    )
    contexts = [list(p) for p in prompts]
    texts = [""] * len(prompts)
    live = list(range(len(prompts)))
    for call in range(max_calls + 1):
        outs = policy.generate([GenerationRequest(tuple(contexts[i]), params) for i in live])
        nxt = []
        for i, [o] in zip(live, outs, strict=True):
            contexts[i] += o.token_ids
            piece = tok.decode(o.token_ids, skip_special_tokens=True)
            texts[i] += piece
            if o.stop_reason == "</python>" and call < max_calls:
                code = piece.rsplit("<python>", 1)[-1].removesuffix("</python>")
                result = format_result(arithmetic_tool(code))
                contexts[i] += encode_text(tok, result)
                texts[i] += result
                nxt.append(i)
        live = nxt
        if not live:
            break
    return [extract_answer(t) for t in texts]
