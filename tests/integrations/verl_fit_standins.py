"""CPU stand-ins for the three GPU-bound pieces of verl 0.9's ``RayPPOTrainer``: the LLM server (a Ray actor
holding a tiny HF model behind memrl's HF backend) and its client, the actor worker group (a real forward and
backward on the same tiny model, in verl's no-padding layout), and the checkpoint engine's ``update_weights``
(copies the actor's weights into the server's model)."""

from __future__ import annotations

from typing import Any

import ray
import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.rollout.replica import TokenOutput

from tests.integrations.verl_standins import sampling_from_verl


@ray.remote(num_cpus=0)
class TinyServer:
    """The rollout server: memrl's HF backend on a tiny model loaded from ``path``."""

    def __init__(self, path: str) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from memrl.policy.config import PolicyConfig
        from memrl.policy.hf import HFPolicy

        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        self.policy = HFPolicy.from_model(
            model, AutoTokenizer.from_pretrained(path), PolicyConfig(device="cpu")
        )
        self.loads = 0

    def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        from memrl.policy.base import GenerationRequest

        params = sampling_from_verl(sampling_params, 64)
        out = self.policy.generate([GenerationRequest(tuple(prompt_ids), params)])[0][0]
        return TokenOutput(
            token_ids=list(out.token_ids), log_probs=list(out.logprobs), stop_reason="completed"
        )

    def load_weights(self, state: dict[str, torch.Tensor]) -> int:
        self.policy.model.load_state_dict(state)
        self.policy.invalidate_cache()
        self.loads += 1
        return self.loads


class TinyServerClient:
    """verl's ``LLMServerClient.generate`` signature over :class:`TinyServer` (picklable: holds the handle)."""

    def __init__(self, server: Any) -> None:
        self.server = server

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_: Any) -> TokenOutput:
        return await self.server.generate.remote(list(prompt_ids), dict(sampling_params))


def _token_logprobs(model, data: TensorDict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy at every position of the no-padding batch (position t predicts token t + 1), flat
    ``[total_tokens]`` as verl's engines return them."""
    lps, ents = [], []
    for ids in data["input_ids"].unbind():
        logits = model(ids[None]).logits[0].float() / temperature
        logp = torch.log_softmax(logits, dim=-1)
        nxt = torch.cat([ids[1:], ids[:1]])
        lp = logp.gather(-1, nxt[:, None])[:, 0]
        lps.append(torch.cat([lp[:-1], lp.new_zeros(1)]))
        ents.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(lps), torch.cat(ents)


class TinyActorGroup:
    """The actor worker group: ``compute_log_prob`` and ``update_actor`` (PPO clip, one optimizer step per call)."""

    def __init__(self, model, temperature: float = 1.0, lr: float = 1e-2, clip: float = 0.2) -> None:
        self.model = model
        self.temperature = temperature
        self.clip = clip
        self.optim = torch.optim.SGD(model.parameters(), lr=lr)
        self.updates: list[dict[str, Any]] = []

    def compute_log_prob(self, data: TensorDict) -> TensorDict:
        with torch.no_grad():
            lp, ent = _token_logprobs(self.model, data, self.temperature)
        out = TensorDict({"log_probs": lp, "entropy": ent}, batch_size=[])
        tu.assign_non_tensor(out, metrics={"mfu": 0.0})
        return out

    def update_actor(self, data: TensorDict) -> TensorDict:
        from verl.workers.utils.padding import no_padding_2_padding

        lp, _ = _token_logprobs(self.model, data, self.temperature)
        lp = no_padding_2_padding(lp, data)  # [bsz, response_len]
        mask = data["response_mask"].float()
        adv, old = data["advantages"], data["old_log_probs"]
        ratio = torch.exp(lp - old)
        loss = -torch.min(ratio * adv, ratio.clamp(1 - self.clip, 1 + self.clip) * adv)
        loss = (loss * mask).sum() / mask.sum().clamp(min=1)
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        self.updates.append(
            {
                "response_mask": data["response_mask"].clone(),
                "advantages": adv.detach().clone(),
                "token_level_scores": data["token_level_scores"].clone(),
                "responses": data["responses"].clone(),
                "uid": list(data["uid"]),
                "memrl_group_size": list(data["memrl_group_size"]),
            }
        )
        out = TensorDict({}, batch_size=[])
        tu.assign_non_tensor(out, metrics={"mfu": 0.0, "pg_loss": float(loss.detach())})
        return out


class WeightSync:
    """The checkpoint engine manager's two calls in ``fit``: ``update_weights`` copies the actor into the server."""

    def __init__(self, actor: TinyActorGroup, server: Any) -> None:
        self.actor = actor
        self.server = server
        self.calls: list[int] = []

    def update_weights(self, global_steps: int = 0) -> None:
        state = {k: v.detach().clone() for k, v in self.actor.model.state_dict().items()}
        ray.get(self.server.load_weights.remote(state))
        self.calls.append(global_steps)

    def sleep_replicas(self) -> None:
        pass
