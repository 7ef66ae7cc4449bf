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
        from memrl.policy.engine.hf import HFPolicy

        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        self.policy = HFPolicy.from_model(
            model, AutoTokenizer.from_pretrained(path), PolicyConfig(device="cpu")
        )
        self.loads = 0
        self.global_steps: int | None = None  # the actor step its weights come from, as verl's servers track

    def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        from memrl.policy.base import GenerationRequest

        params = sampling_from_verl(sampling_params, 64)
        out = self.policy.generate([GenerationRequest(tuple(prompt_ids), params)])[0][0]
        return TokenOutput(
            token_ids=list(out.token_ids),
            log_probs=list(out.logprobs),
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    def load_weights(self, state: dict[str, torch.Tensor], global_steps: int) -> int:
        self.policy.model.load_state_dict(state)
        self.policy.invalidate_cache()
        self.loads += 1
        self.global_steps = global_steps
        return self.loads


class TinyServerClient:
    """verl's ``LLMServerClient.generate`` signature over :class:`TinyServer` (picklable: holds the handle)."""

    def __init__(self, server: Any) -> None:
        self.server = server

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_: Any) -> TokenOutput:
        output = await self.server.generate.remote(list(prompt_ids), dict(sampling_params))
        # as LLMServerClient.generate: one call spans one weight version
        output.extra_fields.setdefault("min_global_steps", output.extra_fields["global_steps"])
        output.extra_fields.setdefault("max_global_steps", output.extra_fields["global_steps"])
        return output


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
    """The actor worker group: ``compute_log_prob`` and ``update_actor`` (PPO clip, one optimizer step per call).

    ``lora_rank > 0``: the model gets a LoRA on every linear layer (peft, in place) and only the LoRA trains, as
    verl's ``actor_rollout_ref.model.lora_rank``; the server then gets the merged weights."""

    def __init__(
        self, model, temperature: float = 1.0, lr: float = 1e-2, clip: float = 0.2, lora_rank: int = 0
    ) -> None:
        if lora_rank:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear")
            )
        self.model = model
        self.temperature = temperature
        self.clip = clip
        self.optim = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
        self.updates: list[dict[str, Any]] = []

    def served_state(self) -> dict[str, torch.Tensor]:
        """The weights the rollout server gets: the model's, with a LoRA merged in."""
        import copy

        model = self.model
        if hasattr(model, "merge_and_unload"):
            model = copy.deepcopy(model).merge_and_unload()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    def lora_delta(self) -> float:
        """L2 norm of the LoRA's weight update (``scaling · B @ A`` over every adapted layer); 0 without one."""
        total = 0.0
        for module in self.model.modules():
            if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
                a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
                total += float((module.scaling["default"] * b @ a).norm() ** 2)
        return total**0.5

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
        state = self.actor.served_state()
        ray.get(self.server.load_weights.remote(state, global_steps))
        self.calls.append(global_steps)

    def sleep_replicas(self) -> None:
        pass


def _padded(x: torch.Tensor) -> torch.Tensor:
    return x.to_padded_tensor(0) if x.is_nested else x


class TinyActorGroupTQ(TinyActorGroup):
    """The same actor for verl's v1 trainer, which hands workers ``KVBatchMeta`` keys into TransferQueue:
    verl's own ``tqbridge`` reads the samples (nested, no padding) and writes the returned fields back."""

    _dispatch_info = {"actor": [0]}  # one data-parallel rank (the trainer balances the batch over it)

    def compute_log_prob(self, batch: Any) -> Any:
        from verl.utils.transferqueue_utils import tqbridge

        return tqbridge()(self._compute_log_prob)(batch)

    def _compute_log_prob(self, data: TensorDict) -> TensorDict:
        with torch.no_grad():
            lp, ent = _token_logprobs(self.model, data, self.temperature)
        lengths = data["input_ids"].offsets().diff().tolist()

        def nested(x):
            return torch.nested.as_nested_tensor(list(x.split(lengths)), layout=torch.jagged)

        out = TensorDict({"log_probs": nested(lp), "entropy": nested(ent)}, batch_size=[len(lengths)])
        tu.assign_non_tensor(out, metrics={"mfu": 0.0})
        return out

    def update_actor(self, batch: Any) -> Any:
        from verl.utils.transferqueue_utils import tqbridge

        return tqbridge()(self._update_actor)(batch)

    def _response_logprobs(self, data: TensorDict, width: int) -> torch.Tensor:
        """``[B, width]`` log-probs of each row's response tokens under the current model (0 past its end)."""
        lp, _ = _token_logprobs(self.model, data, self.temperature)
        seqs = lp.split(data["input_ids"].offsets().diff().tolist())
        prompts = data["prompts"].offsets().diff().tolist()
        # position t predicts token t + 1: the response's log-probs start one before it
        return torch.stack(
            [
                torch.nn.functional.pad(s[p - 1 : -1], (0, width - (len(s) - p)))
                for s, p in zip(seqs, prompts, strict=True)
            ]
        )

    def _update_actor(self, data: TensorDict) -> TensorDict:
        mask = _padded(data["response_mask"]).float()
        lp = self._response_logprobs(data, mask.shape[1])
        adv, old = _padded(data["advantages"]), _padded(data["old_log_probs"])
        ratio = torch.exp(lp - old)
        loss = -torch.min(ratio * adv, ratio.clamp(1 - self.clip, 1 + self.clip) * adv)
        loss = (loss * mask).sum() / mask.sum().clamp(min=1)
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        with torch.no_grad():  # what this step did to each row: the change of its tokens' summed log-prob
            moved = ((self._response_logprobs(data, mask.shape[1]) - lp.detach()) * mask).sum(-1)
        self.updates.append(
            {
                "logprob_change": moved,
                "response_mask": mask.long(),
                "advantages": adv.detach().clone(),
                "token_level_scores": _padded(data["rm_scores"]).clone(),
                "responses": _padded(data["responses"]).clone(),
                "uid": list(data["uid"]),
                "memrl_group_size": [e["memrl_group_size"] for e in data["extra_fields"]],
                "memrl_role": [e.get("memrl_role") for e in data["extra_fields"]],
                "memrl_credit_group": [e.get("memrl_credit_group") for e in data["extra_fields"]],
                "memrl_reward": [e.get("memrl_reward") for e in data["extra_fields"]],
                "gold": [rm["ground_truth"] for rm in data["reward_model"]],
                "prompts": [p.tolist() for p in data["prompts"].unbind()],
                "old_log_probs": old.detach().clone(),
            }
        )
        out = TensorDict({}, batch_size=[])
        tu.assign_non_tensor(out, metrics={"mfu": 0.0, "pg_loss": float(loss.detach())})
        return out
