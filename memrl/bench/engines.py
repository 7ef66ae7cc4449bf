"""``memrl bench engines``: the same workloads through memrl's ``hf`` engine (float32 and ``hf-bf16``, bfloat16) and
``vllm``, greedy and sampled.

Workloads (token ids built here, once, so both engines read the very same prompts):

- ``writes_8`` / ``writes_32``: memory writes, LoCoMo-like: one per-turn write prompt per row, built by the real
  writer (:meth:`memrl.memory.writer.PolicyWriter.prompt_ids`) over the bundled LoCoMo fixture conversation, the
  memory shown being the rule facts of the turns before (``--write-neighbours``; ~420 tokens a prompt), replies
  capped at ``--write-max-tokens`` (8: the trained writer's replies are ~7 tokens), in one ``generate`` of 8 / 32;
- ``answers_chain`` / ``answers_tree``: answer turns, 16 synthetic episodes x 8 leaves (the prompts of
  ``memrl bench rollout``), independent chains and tree search (tree: sampled only; a greedy tree forks
  duplicates);
- ``train_step``: one training step's rollouts of ``configs/synthetic_memory.yaml`` (4 prompts x 8 episodes with
  per-turn memory writes and the answer turns) with the recipe's two adapters, one per role (random ``B``),
  published as training does after an update: HF generates with them folded in, vLLM loads the saved adapters as
  new LoRA requests (``publish_s``), the writes carrying the writer's and the answers the answer adapter's; the
  on-disk write cache off (``memory.write_cache=false``), in both arms.

Each engine runs in a process of its own (:mod:`memrl.bench.engines_arm`): ``hf`` under this interpreter, ``vllm``
under the vLLM environment's (``--vllm-python``, default ``$MEMRL_VLLM_PYTHON`` or ``.venv-vllm/bin/python``, which
``.ci/vllm.sh`` builds). Where that interpreter is missing or cannot import vllm, the vllm arm is reported
``unavailable`` with the reason, and the hf arm still runs.

Per workload and engine: wall seconds, generated tokens, tokens/s (generated / wall), peak RSS of the engine's
process tree during the workload; ``over_hf`` = each other arm's tokens/s over float32 HF's (> 1: faster); for
greedy workloads ``agree_with_hf`` (of ``rows``): that arm's generated rows equal to float32 HF's token for token
(bfloat16 rounds differently, so its greedy rows may part). ``faster_than_hf`` lists, per arm, the workloads where
it was faster. ``hf-bf16`` runs the HF engine with ``policy.dtype=bfloat16``, whatever the CPU: where the CPU lacks
bf16 instructions it shows what emulation costs. ``hf-plain`` and ``hf-bf16-plain`` are those two without
prompt-lookup speculative decoding (``policy.speculative_tokens=0``; :mod:`memrl.policy.engine.speculative`): in one run,
the speed-up it brings and, in float32, whether its greedy rows equal plain decoding's. Engine start-up (model
load, vLLM's compile) is reported apart (``startup_s``), never inside a workload. Every arm gets the same torch
thread count (``--threads``, default chosen from the load).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from memrl.bench import BENCHES

logger = logging.getLogger(__name__)

ARMS = {
    "hf": ("hf", "float32", None),
    "hf-bf16": ("hf", "bfloat16", None),
    "hf-plain": ("hf", "float32", 0),
    "hf-bf16-plain": ("hf", "bfloat16", 0),
    "vllm": ("vllm", "float32", None),
}  # (backend, dtype, policy.speculative_tokens: None = the default; 0 = no speculative decoding)
ENGINES = tuple(ARMS)
WORKLOADS = ("writes_8", "writes_32", "answers_chain", "answers_tree", "train_step")
MODES = ("greedy", "sampled")
TRAIN_CONFIG = "configs/synthetic_memory.yaml"
TRAIN_OVERRIDES = ("memory.write_cache=false", "train.warm_start.episodes=0")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="memrl bench engines", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="a model alias or a model directory")
    p.add_argument(
        "--engines", default="hf,vllm", help=f"comma-separated, of {', '.join(ENGINES)} (the others: opt-in)"
    )
    p.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}"
    )
    p.add_argument("--modes", default=",".join(MODES), help="greedy, sampled or both")
    p.add_argument(
        "--vllm-python", default=None, help="the vLLM environment's python (see the module docstring)"
    )
    p.add_argument(
        "--write-neighbours",
        type=int,
        default=4,
        help="facts shown in each write prompt (the recipe's memory.write_neighbours)",
    )
    p.add_argument("--write-max-tokens", type=int, default=8)
    p.add_argument("--episodes", type=int, default=16, help="answer prompts")
    p.add_argument("--leaves", type=int, default=8, help="answer leaves per prompt")
    p.add_argument("--answer-max-tokens", type=int, default=96)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--vllm-kv-cache-gb", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=0, help="torch threads of both arms (0: from the load)")
    p.add_argument("--arm-timeout-s", type=float, default=1800.0, help="an arm still running then is stopped")
    p.add_argument("--log-dir", default=None, help="keep each arm's stderr there (the engines' own logs)")
    return p.parse_args(argv)


def _choices(value: str, valid: tuple[str, ...], flag: str) -> list[str]:
    got = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in got if v not in valid]
    if bad or not got:
        raise ValueError(f"memrl bench engines {flag}: unknown {bad or value!r}; valid: {', '.join(valid)}")
    return got


def write_prompts(tok, count: int, neighbours: int) -> list[list[int]]:
    """``count`` per-turn write prompts over the LoCoMo fixture conversation, one turn each (its last ``count``
    turns), each written with the rule facts of the ``neighbours`` turns before it as the memory shown, by the
    writer's own prompt code."""
    from types import SimpleNamespace

    from memrl.adapters import LOCOMO_FIXTURE
    from memrl.data.adapters import run_adapter
    from memrl.memory.config import MemoryConfig
    from memrl.memory.extract import rule_fact_texts
    from memrl.memory.store import FactRecord
    from memrl.memory.writer import PolicyWriter, WriteRequest

    episodes, _ = run_adapter("locomo", str(LOCOMO_FIXTURE), split="all")
    history = [t for t in episodes[0].history if t.text.strip()]
    writer = PolicyWriter(
        MemoryConfig(extractor="policy"), SimpleNamespace(client=SimpleNamespace(tokenizer=tok))
    )
    prompts = []
    start = max(0, len(history) - count)  # the conversation's last turns: each row a turn of its own
    for k in range(count):
        i = start + k % (len(history) - start)
        facts = tuple(
            FactRecord(j, "bench", rule_fact_texts(t)[0].split(": ", 1)[-1], timestamp=t.timestamp, order=j)
            for j, t in enumerate(history[max(0, i - neighbours) : i])
        )
        prompts.append(list(writer.prompt_ids(WriteRequest((history[i],), facts))))
    return prompts


def answer_prompts(tok, episodes: int) -> list[list[int]]:
    from memrl.bench.rollout_workloads import build_workload

    return [list(r.prompt_ids) for r in build_workload("synthetic", tok, episodes).requests]


def build_specs(args, model_dir: str, tok, stop_ids: list[int]) -> tuple[list[dict], list[dict]]:
    """The workloads as the arms read them: (generation workloads, training-step workloads)."""
    workloads = _choices(args.workloads, WORKLOADS, "--workloads")
    modes = _choices(args.modes, MODES, "--modes")
    temps = {"greedy": 0.0, "sampled": 1.0}
    gen, train = [], []
    writes = {n: write_prompts(tok, n, args.write_neighbours) for n in (8, 32) if f"writes_{n}" in workloads}
    answers = answer_prompts(tok, args.episodes) if any(w.startswith("answers") for w in workloads) else []
    for mode in modes:
        t = temps[mode]
        for n, prompts in writes.items():
            gen.append(dict(name=f"writes_{n}/{mode}", kind="generate", prompts=prompts, temperature=t,
                            max_tokens=args.write_max_tokens))  # fmt: skip
        for strategy in ("chain", "tree"):
            if f"answers_{strategy}" in workloads and not (strategy == "tree" and mode == "greedy"):
                gen.append(dict(name=f"answers_{strategy}/{mode}", kind="rollout", strategy=strategy,
                                prompts=answers, leaves=args.leaves, temperature=t,
                                max_tokens=args.answer_max_tokens))  # fmt: skip
        if "train_step" in workloads:
            train.append(dict(name=f"train_step/{mode}", kind="train_step", config=TRAIN_CONFIG,
                              overrides=list(TRAIN_OVERRIDES), temperature=t))  # fmt: skip
    base = dict(model_dir=model_dir, max_model_len=args.max_model_len, vllm_kv_cache_gb=args.vllm_kv_cache_gb,
                stop_ids=stop_ids)  # fmt: skip
    return [dict(base, workloads=gen)] if gen else [], [dict(base, workloads=train)] if train else []


def vllm_python(arg: str | None) -> str:
    return arg or os.environ.get("MEMRL_VLLM_PYTHON") or str(Path(".venv-vllm") / "bin" / "python")


def check_engine(engine: str, python: str) -> str | None:
    """Why ``engine`` cannot run under ``python`` (None: it can)."""
    if ARMS[engine][0] != "vllm":
        return None
    if not Path(python).is_file():
        return (
            f"no vLLM environment: {python} does not exist (build it with .ci/vllm.sh, or pass --vllm-python / "
            "set MEMRL_VLLM_PYTHON)"
        )
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True, timeout=600)
    if probe.returncode:
        tail = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"{python} cannot import vllm: {tail}"
    return None


def child_env(tmp: str) -> dict[str, str]:
    """The environment of a child process under another interpreter: this checkout first on its path; vLLM's
    sockets, compile caches and temp files in ``tmp`` (removed afterwards, so a run leaves nothing behind)."""
    import memrl

    src = str(Path(memrl.__file__).resolve().parents[1])
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    )
    env.update(VLLM_RPC_BASE_PATH=tmp, VLLM_CACHE_ROOT=f"{tmp}/vllm-cache",
               TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor", TMPDIR=tmp)  # fmt: skip
    return env


def arm_failure(stderr: str, tail: int = 12) -> str:
    """What a failed arm said: its error lines (vLLM's engine core reports its root cause long before the
    client's ``EngineDeadError``) and the last ``tail`` lines."""
    lines = stderr.strip().splitlines()
    errors = [ln for ln in lines[:-tail] if re.search(r"(Error|Exception)\b.*:", ln) and "Warning" not in ln]
    return "\n".join([*errors[:8], *(["..."] if errors else []), *lines[-tail:]])


def run_arm(
    engine: str, python: str, spec: dict, threads: int, timeout_s: float, log_dir: str | None = None
) -> dict:
    """``spec`` through ``engine`` in a child process; its result, or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory(prefix="memrl-bench-engines-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(
            json.dumps(
                dict(
                    spec,
                    engine=engine,
                    backend=ARMS[engine][0],
                    dtype=ARMS[engine][1],
                    speculative_tokens=ARMS[engine][2],
                    threads=threads,
                )
            ),
            encoding="utf-8",
        )
        env = child_env(tmp)
        cmd = [python, "-m", "memrl.bench.engines_arm", str(spec_path), str(out_path)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"{engine} arm ran past --arm-timeout-s {timeout_s:.0f} s"}
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            first = spec["workloads"][0]["name"].split("/")[0]
            (Path(log_dir) / f"{engine}-{first}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
        if proc.returncode or not out_path.is_file():
            said = arm_failure(
                proc.stdout + proc.stderr
            )  # vLLM logs to stdout, Python's tracebacks to stderr
            return {"error": f"{engine} arm exited with {proc.returncode}: {said}"}
        return json.loads(out_path.read_text(encoding="utf-8"))


def _summary(name: str, arms: dict[str, dict]) -> dict:
    """One workload's row: per engine, its numbers; each other arm's ratio over float32 HF and (greedy) its rows
    that agree with HF's."""
    row: dict = {}
    for engine, res in arms.items():
        r = res["workloads"][name]
        row[engine] = {
            "wall_s": round(r["wall_s"], 3),
            "generated_tokens": r["generated_tokens"],
            "prompt_tokens": r["prompt_tokens"],
            "tokens_per_s": round(r["generated_tokens"] / r["wall_s"], 2) if r["wall_s"] else None,
            # prompt + generated: the writes are mostly prefill, so this is their throughput
            "forwarded_tokens_per_s": round((r["prompt_tokens"] + r["generated_tokens"]) / r["wall_s"], 1)
            if r["wall_s"]
            else None,
            "peak_rss_mb": round(r["peak_rss_mb"], 1),
            **({"publish_s": round(r["publish_s"], 3)} if "publish_s" in r else {}),
        }
    others = [e for e in arms if e != "hf"]
    if "hf" not in arms or not others:
        return row
    hf = row["hf"]["tokens_per_s"]
    row["over_hf"] = {
        e: round(row[e]["tokens_per_s"] / hf, 3) if hf and row[e]["tokens_per_s"] else None for e in others
    }
    if name.endswith("/greedy"):
        base = arms["hf"]["workloads"][name]["rows"]
        row["rows"] = len(base)
        row["agree_with_hf"] = {
            e: sum(x == y for x, y in zip(base, arms[e]["workloads"][name]["rows"], strict=False))
            for e in others
        }
    return row


@BENCHES.register("engines")
def bench_engines(argv: list[str]) -> dict:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from memrl.policy.models import resolve_model_path
    from memrl.threads import auto_threads

    engines = _choices(args.engines, ENGINES, "--engines")
    model_dir = resolve_model_path(
        args.model
    )  # resolved here: the vLLM environment need not have the model package
    tok = AutoTokenizer.from_pretrained(model_dir)
    stop_ids = [] if tok.eos_token_id is None else [int(tok.eos_token_id)]
    gen_specs, train_specs = build_specs(args, model_dir, tok, stop_ids)
    threads = args.threads or auto_threads()
    pythons = {
        e: vllm_python(args.vllm_python) if b == "vllm" else sys.executable for e, (b, *_) in ARMS.items()
    }
    out: dict = {"config": {**vars(args), "model_dir": model_dir, "torch_threads": threads}, "engines": {}}
    arms: dict[str, dict] = {}
    for engine in engines:
        why = check_engine(engine, pythons[engine])
        out["engines"][engine] = {"available": why is None, **({"reason": why} if why else {})}
        if why:
            logger.warning("bench engines: %s arm unavailable: %s", engine, why)
            continue
        arms[engine] = {"workloads": {}}
    for spec in gen_specs + train_specs:  # each engine's generation workloads, then each one's training step
        for engine in list(arms):
            logger.info("bench engines: %s, %d workloads", engine, len(spec["workloads"]))
            res = run_arm(engine, pythons[engine], spec, threads, args.arm_timeout_s, args.log_dir)
            if "error" in res:
                out["engines"][engine].setdefault("errors", []).append(res["error"])
                logger.error("bench engines: %s", res["error"])
                continue
            arms[engine]["workloads"].update(res["workloads"])
            info = out["engines"][engine]
            info.update(res["engine_info"])
            if (
                engine == "vllm"
            ):  # vLLM's CPU engine binds its own OpenMP threads (torch.set_num_threads is ignored)
                info["omp_threads_bind"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
            if "startup_s" in res:
                info["startup_s"] = round(res["startup_s"], 1)
    names = [w["name"] for s in gen_specs + train_specs for w in s["workloads"]]
    out["workloads"] = {n: _summary(n, {e: a for e, a in arms.items() if n in a["workloads"]}) for n in names}
    out["faster_than_hf"] = {
        e: [n for n, row in out["workloads"].items() if (row.get("over_hf", {}).get(e) or 0) > 1]
        for e in arms
        if e != "hf"
    }
    return out
