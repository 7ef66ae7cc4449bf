"""``memrl bench parity``: the same episodes through the ``hf`` and ``vllm`` engines, compared token for token.

Each engine runs ``memrl run`` on one config (greedy: ``rollout.temperature=0``, one leaf, history turns recorded
so every write is a step) in a process of its own: ``hf`` under this interpreter, ``vllm`` under the vLLM
environment's (``--vllm-python``, as ``memrl bench engines``). Extra ``key=value`` arguments go to both runs
(``policy.lora_path=RUN/checkpoints/step_N/adapter``: the writer recipe's adapters, both roles').

Reported, per step kind (``writes``: the policy writer's replies; ``answers``: target turns): rows compared and
rows whose generated tokens are equal; ``memory``: steps whose memory operations and retrieved facts are equal;
``max_abs_logprob_diff`` over the equal rows' tokens; the first differing rows (episode, step, both texts); and
each run's wall time.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memrl.bench import BENCHES
from memrl.bench.engines import arm_failure, check_engine, child_env, vllm_python

GREEDY = (
    "rollout.temperature=0",
    "rollout.n=1",
    "rollout.strategy=chain",
    "episode.record_history_turns=true",
)
SHOWN_DIFFERENCES = 5


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="memrl bench parity", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--config", default="configs/synthetic_memory_eval.yaml", help="episode config both engines run"
    )
    p.add_argument("--episodes", type=int, default=16, help="episodes (data.limit)")
    p.add_argument("--vllm-python", default=None, help="python of the vLLM environment")
    p.add_argument("--work-dir", default=None, help="keep both runs' outputs here (default: a temp dir)")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    p.add_argument("--json", action="store_true", help="print JSON only")
    args, extra = p.parse_known_args(argv)
    bad = [a for a in extra if "=" not in a or a.startswith("-")]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)} (config overrides are key=value)")
    args.overrides = extra
    return args


def _run(python: str, backend: str, args: argparse.Namespace, out: Path) -> float:
    cmd = [python, "-m", "memrl.cli.main", "run", "--config", args.config, "--output-dir", str(out), "--fresh",
           "--no-progress", f"policy.backend={backend}", f"data.limit={args.episodes}", *GREEDY,
           *args.overrides]  # fmt: skip
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memrl-parity-engine-") as tmp:
        proc = subprocess.run(cmd, env=child_env(tmp), capture_output=True, text=True, timeout=args.timeout_s)
    if proc.returncode:
        raise RuntimeError(f"{backend} run failed:\n{arm_failure(proc.stdout + proc.stderr)}")
    return time.perf_counter() - t0


def _rows(out: Path) -> dict[tuple[str, str], dict]:
    import pyarrow.parquet as pq

    table = pq.read_table(out / "trajectories").to_pylist()
    return {(r["episode_id"], r["step_id"]): r for r in table}


def _kind(row: dict) -> str:
    return "answers" if row["turn_role"] == "target" else "writes"


def compare(hf: dict[tuple[str, str], dict], vl: dict[tuple[str, str], dict]) -> dict:
    """Per kind: rows, equal generated tokens, equal memory (ops and retrieved facts), the largest log-prob gap
    over equal rows; the first differences."""
    if set(hf) != set(vl):
        missing = sorted(set(hf) ^ set(vl))[:3]
        raise RuntimeError(f"the two runs produced different steps, e.g. {missing}")
    stats: dict[str, dict] = {}
    differences = []
    for key in sorted(hf):
        a, b = hf[key], vl[key]
        s = stats.setdefault(
            _kind(a), {"rows": 0, "tokens_equal": 0, "memory_equal": 0, "max_abs_logprob_diff": 0.0}
        )
        s["rows"] += 1
        same = list(a["response_ids"]) == list(b["response_ids"])
        s["tokens_equal"] += same
        s["memory_equal"] += (a["memory_ops"], a["retrieved_ids"]) == (b["memory_ops"], b["retrieved_ids"])
        if same:
            gaps = [abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True) if math.isfinite(x)]
            s["max_abs_logprob_diff"] = max([s["max_abs_logprob_diff"], *gaps])
        elif len(differences) < SHOWN_DIFFERENCES:
            differences.append(
                {"episode": key[0], "step": key[1], "hf": a["response_text"], "vllm": b["response_text"]}
            )
    return {"by_kind": stats, "first_differences": differences}


@BENCHES.register("parity")
def bench_parity(argv: list[str]) -> dict:
    args = parse_args(argv)
    python = vllm_python(args.vllm_python)
    why = check_engine("vllm", python)
    if why:
        return {"error": why}
    with tempfile.TemporaryDirectory(prefix="memrl-parity-") as tmp:
        root = Path(args.work_dir or tmp)
        walls = {
            "hf": _run(sys.executable, "hf", args, root / "hf"),
            "vllm": _run(python, "vllm", args, root / "vllm"),
        }
        result = compare(_rows(root / "hf"), _rows(root / "vllm"))
    return {"config": args.config, "episodes": args.episodes, "overrides": args.overrides,
            "wall_s": {k: round(v, 1) for k, v in walls.items()}, **result}  # fmt: skip
