"""``memrl serve``: OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` (streaming too) over the
in-process HF backend."""

from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the policy as an OpenAI-compatible completions + chat endpoint (localhost)",
        description="Serve policy.model (HF backend) on http://HOST:PORT/v1/completions and "
        "/v1/chat/completions (stream=true as server-sent events). Extra key=value "
        "arguments override the config, e.g. policy.model=/path/to/model policy.lora_path=ckpt/adapter.",
    )
    p.add_argument("--config", help="YAML config (its policy section is used)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; there is no auth)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--model-name", default=None, help="model id reported by /v1/models (default: policy.model)"
    )
    p.set_defaults(func=run, accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import uvicorn

    from memrl.config import load_config
    from memrl.policy import make_policy
    from memrl.policy.server.app import create_app

    cfg = load_config(args.config, list(args.extra))
    policy_cfg = dataclasses.replace(cfg.policy, backend="hf")
    policy = make_policy(policy_cfg)
    app = create_app(policy, args.model_name or policy_cfg.model)
    logger.info(
        "serving %s on http://%s:%d/v1 (completions, chat/completions)",
        policy_cfg.model,
        args.host,
        args.port,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
