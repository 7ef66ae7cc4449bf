"""``memrl doctor MODEL [--json] [--dtype D] [--probe-tokens N] [--device DEV]``: can memrl's engine serve MODEL?

MODEL is an alias (``smollm2-135m``), a local model directory, a hub id in the local cache (``HF_HUB_OFFLINE=1``)
or ``tiny:<family>`` (a random tiny model: ``tiny:llama``, ``tiny:mistral``, ...). Prints what the engine sees of
the model (family, size, precision, sliding window, chat template), then each engine path's greedy tokens against
transformers' on a probe prompt (:mod:`memrl.policy.engine.doctor`), and a verdict. Exit code 0: OK; 1: some path
differs from transformers (parity FAIL); 2: the engine refuses the model (or it does not load).
"""

from __future__ import annotations

import argparse
import dataclasses
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check that memrl's HF engine serves a model and decodes it as transformers does",
        description=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("model", help="alias, local model directory, cached hub id, or tiny:<family>")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"), help="(default: auto)"
    )
    p.add_argument(
        "--probe-tokens",
        type=_probe_tokens,
        default=None,
        metavar="N",
        help="probe prompt length (default: 2 x window + 37 with a sliding window, else 300)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when there is one)")
    p.set_defaults(func=run)


def _probe_tokens(text: str) -> int:
    n = int(text)
    if n < 8:
        raise argparse.ArgumentTypeError(f"{n}: must be >= 8")
    return n


def run(args: argparse.Namespace) -> int:
    import torch

    from memrl.policy.engine.doctor import diagnose

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = diagnose(args.model, dtype=args.dtype, device=device, probe_tokens=args.probe_tokens)
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
    else:
        render(report)
    return report.exit_code


def layer_ranges(layers: list[int]) -> str:
    """``[0, 1, 2, 4]`` -> ``"0-2, 4"``."""
    spans: list[list[int]] = []
    for i in layers:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _attention(report) -> str:
    if report.window is None:
        text = "global only"
    else:
        n = len(report.sliding_layers)
        text = f"sliding window {report.window} on {n} of {report.layers} layers ({layer_ranges(report.sliding_layers)})"
    unsupported = "; ".join(report.unsupported) or "none"
    return f"{text}; unsupported features: {unsupported}"


def _template(report) -> str:
    found = "chat template" if report.chat_template else "no chat template (memrl renders its plain format)"
    bos = (
        f"bos {report.bos_token!r} {'added' if report.adds_bos else 'not added'}"
        if report.bos_token
        else "no bos"
    )
    return f"{found}; {bos}"


def describe_lines(report) -> list[tuple[str, str]]:
    """The report's description as (label, text) rows."""
    millions = report.parameters / 1e6
    return [
        ("model", f"{report.model}  ({report.path})" if report.path != report.model else report.model),
        (
            "class",
            f"{report.model_class} ({report.model_type}): {millions:.1f}M parameters, {report.layers} layers",
        ),
        ("precision", f"{report.dtype} on {report.device}"),
        ("attention", _attention(report)),
        ("template", _template(report)),
        ("renders", report.chat_preview),
        ("sampling", _sampling(report)),
    ]


def _sampling(report) -> str:
    own = ", ".join(f"{k}={v}" for k, v in report.generation_defaults.items())
    if not own:
        return "the model's generation_config sets no sampling defaults"
    return f"the model's generation_config sets {own}; memrl's engine applies rollout.temperature and rollout.top_p only"


def render(report, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        console = Console(highlight=False)
        if not console.is_terminal:  # a file or a pipe: long lines rather than rich's default 80 columns
            console.width = 120
    for label, text in describe_lines(report):
        console.print(f"[bold]{label:<10}[/bold] {escape(text)}", soft_wrap=True)
    if report.refusal:
        console.print(f"[bold]{'refused':<10}[/bold] {escape(report.refusal)}", soft_wrap=True)
    else:
        console.print(
            f"[bold]{'probe':<10}[/bold] {report.probe_tokens} tokens, {report.new_tokens} greedy tokens a row, "
            "each engine path against transformers' generate"
        )
        table = Table(show_edge=False, box=None, pad_edge=False)
        for col in ("path", "result", "detail"):
            table.add_column(col)
        for c in report.checks:
            color = {"pass": "green", "FAIL": "red"}.get(c.status, "yellow")
            table.add_row(c.path, f"[{color}]{c.status}[/{color}]", escape(c.detail))
        console.print(table)
        if any(c.status == "near tie" for c in report.checks):
            console.print(
                f"{'':<10} near tie: the first token that differs had a rival within rounding of it (the "
                "tolerance); --dtype float32 checks exactly",
                soft_wrap=True,
            )
    color = {"OK": "green", "refused": "yellow"}.get(report.verdict, "red")
    console.print(
        f"[bold]verdict[/bold]    [{color}]{report.verdict}[/{color}] (exit code {report.exit_code})"
    )
