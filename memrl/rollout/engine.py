"""The batched state machine every strategy drives: PENDING → GENERATING ⇄ PROCESSING_TOOLS → TERMINATED.

Each :meth:`Engine.step` makes **one** ``policy.generate`` call covering every branch that is ready to generate
(across all requests and trees) and **one** ``tools.execute`` call covering every pending tool call. Fresh
branches that start from the same state (same ``spawn_key``) go in one request with ``n`` samples. Every request
carries the branch's full token sequence: reusing the computed prefix (the prompt, a parent's response up to a
fork point, a turn before its tool result) is the backend's business.

A turn's calls all run in one batch (a tag-format turn stops at its call: one; a hermes-style turn that ends at
end of sequence may hold several), results appended in call order. Tool rollback lives here because it is a
state transition: when a call's error matches ``rollback_on_errors``, the calls before it keep their results,
the errors and a feedback line are appended (mask 0), the branch regenerates from the failed call's checkpoint
(where the previous call ends; the turn start for the first call), and when the new text arrives the branch is
truncated back to the checkpoint and the new text is spliced in, so only the corrected calls stay.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from dataclasses import replace

from memrl.formats import ANSWER_STOP_STRINGS, TOOL_STOP_STRINGS, format_result
from memrl.policy.base import GenerationRequest, PolicyClient, SamplingParams
from memrl.policy.stream import open_stream
from memrl.rollout.base import AgentState, ToolRunner
from memrl.rollout.branch import Branch, OpenRollback
from memrl.rollout.config import RolloutConfig
from memrl.rollout.metrics import RolloutMetrics
from memrl.rollout.rollback import error_line, matches_rollback
from memrl.rollout.toolcalls import parse_turn_calls, token_end
from memrl.tools.base import ToolCall, ToolResult
from memrl.types import (
    BranchFinish,
    ContractError,
    FinishReason,
    GenerationOutput,
    ToolCallRecord,
    ToolStatus,
)

logger = logging.getLogger(__name__)


_READY = (AgentState.PENDING, AgentState.GENERATING)


class EngineHooks:
    """Strategy callbacks (the tree strategy records nodes here; the chain strategy needs none)."""

    def on_output(self, branch: Branch, out: GenerationOutput, start: int) -> None:
        """A normal (not regenerated) output was appended at response index ``start``."""

    def on_boundary(self, branch: Branch) -> None:
        """The branch sits at a continuable state and will generate again (a possible branch point)."""

    def on_restore(self, branch: Branch, position: int) -> None:
        """The branch was truncated back to response index ``position`` by a rollback."""


class Engine:
    """Drives branches to TERMINATED; a branch generates until a stop (a tool call, the answer, eos, its budget)."""

    def __init__(
        self,
        policy: PolicyClient,
        tools: ToolRunner | None,
        cfg: RolloutConfig,
        metrics: RolloutMetrics,
        *,
        hooks: EngineHooks | None = None,
    ) -> None:
        self.policy = policy
        self.tools = tools
        self.cfg = cfg
        self.metrics = metrics
        self.hooks = hooks or EngineHooks()
        self.tokenizer = policy.tokenizer
        self.stop = TOOL_STOP_STRINGS + ANSWER_STOP_STRINGS

    # ------------------------------------------------------------------ loop

    def run(self, branches: Sequence[Branch]) -> None:
        while any(b.state is not AgentState.TERMINATED for b in branches):
            self.step(branches)

    def run_streaming(
        self, branches: Sequence[Branch], refill: Callable[[list[Branch]], list[Branch]]
    ) -> None:
        """Drive ``branches`` to TERMINATED through one generation stream (:mod:`memrl.policy.stream`): a
        request's outputs are applied as soon as its samples finish, its tool calls run right away, and
        ``refill(branches that just ended)`` may return new branches (a tree's next round), which join the rows
        still decoding instead of waiting for the slowest row of a synchronous round."""
        stream = open_stream(self.policy)
        inflight: dict[int, tuple[GenerationRequest, list[Branch]]] = {}
        todo = list(branches)
        try:
            while True:
                waiting = [b for b in todo if b.state is AgentState.PROCESSING_TOOLS]
                if waiting:
                    self._run_tools(waiting)
                batch = self._requests([b for b in todo if b.state in _READY])
                if batch:
                    inflight.update(zip(stream.add([req for req, _ in batch]), batch, strict=True))
                ended = [b for b in todo if b.state is AgentState.TERMINATED]
                todo = refill(ended) if ended else []
                if todo:
                    continue
                if not inflight:
                    return
                done = stream.wait()
                if not done:
                    raise ContractError(
                        f"generation stream returned nothing with {len(inflight)} requests queued"
                    )
                self.metrics.add("rollout/stream_waits", 1)
                for rid, outs in done:
                    req, members = inflight.pop(rid)
                    self._apply_request(req, members, outs)
                    todo += members
        finally:
            stream.close()

    def step(self, branches: Sequence[Branch]) -> None:
        ready = [b for b in branches if b.state in _READY]
        if ready:
            self._generate(ready)
        waiting = [b for b in branches if b.state is AgentState.PROCESSING_TOOLS]
        if waiting:
            self._run_tools(waiting)

    # ------------------------------------------------------------------ generation

    def _budget(self, b: Branch) -> int:
        """Model tokens the next call may produce. A regeneration replaces everything after the checkpoint."""
        used = b.checkpoint if b.regenerating else b.response_len
        return self.cfg.max_response_tokens - used

    def _seed(self, key: str, segment: int) -> int:
        return zlib.crc32(f"{self.cfg.seed}/{key}/{segment}".encode()) & 0x7FFFFFFF

    def _generate(self, ready: list[Branch]) -> None:
        batch = self._requests(ready)
        if not batch:
            return
        outputs = self.policy.generate([req for req, _ in batch])
        if len(outputs) != len(batch):
            raise ContractError(f"policy.generate returned {len(outputs)} results for {len(batch)} requests")
        self.metrics.add("rollout/generate_calls", 1)
        for (req, members), outs in zip(batch, outputs, strict=True):
            self._apply_request(req, members, outs)

    def _requests(self, ready: list[Branch]) -> list[tuple[GenerationRequest, list[Branch]]]:
        """One request per group of ``ready`` branches that start from the same state (their ``n`` samples
        share it), else one per branch; branches out of budget terminate instead."""
        groups: dict[str, list[Branch]] = {}
        for b in ready:
            if self._budget(b) < 1:
                self._terminate(b, BranchFinish.LENGTH)
                continue
            key = b.spawn_key if b.state is AgentState.PENDING and b.spawn_key else b.uid
            groups.setdefault(key, []).append(b)
        out = []
        for key, members in groups.items():
            head = members[0]
            params = SamplingParams(
                temperature=self.cfg.temperature,
                top_p=self.cfg.top_p,
                max_tokens=self._budget(head),
                stop=self.stop,
                n=len(members),
                seed=self._seed(key, head.segments),
                top_logprobs=self.cfg.top_logprobs,
            )
            out.append((GenerationRequest(tuple(head.tokens), params), members))
            for b in members:
                b.state = AgentState.GENERATING
        return out

    def _apply_request(
        self, req: GenerationRequest, members: list[Branch], outs: Sequence[GenerationOutput]
    ) -> None:
        if len(outs) != len(members):
            raise ContractError(f"policy.generate returned {len(outs)} samples for n={len(members)}")
        self.metrics.add("rollout/requests", 1)
        self.metrics.count_request(len(req.prompt_ids), outs)
        for b, out in zip(members, outs, strict=True):
            b.spawn_key = None
            self._apply_output(b, out)

    def _apply_output(self, b: Branch, out: GenerationOutput) -> None:
        b.state = AgentState.GENERATING
        spliced = b.regenerating
        if spliced:
            self._restore(b)
        else:
            out = self._cut_straddling_stop(b, out)
        start = b.response_len
        b.append_model(out.token_ids, out.logprobs)
        b.segments += 1
        if not spliced:
            self.hooks.on_output(b, out, start)
        self._transition(b, out)

    def _cut_straddling_stop(self, b: Branch, out: GenerationOutput) -> GenerationOutput:
        """A stop string split across two segments is invisible to the backend (it matches only new text):
        find it and end the output right after it, as the backend would have."""
        if b.response_len == b.turn_start or not out.token_ids:
            return out
        p = b.prompt_len
        tail = self.tokenizer.decode(b.tokens[p + max(b.turn_start, b.response_len - 16) :])
        if not any(tail.endswith(s[:k]) for s in self.stop for k in range(1, len(s))):
            return out
        for i in range(1, len(out.token_ids) + 1):
            text = tail + self.tokenizer.decode(list(out.token_ids[:i]))
            for stop in self.stop:
                at = text.find(stop)
                if 0 <= at < len(tail) < at + len(stop):
                    return replace(
                        out,
                        token_ids=out.token_ids[:i],
                        logprobs=out.logprobs[:i],
                        top_logprobs=out.top_logprobs[:i],
                        finish_reason=FinishReason.STOP,
                        stop_reason=stop,
                    )
        return out

    def _transition(self, b: Branch, out: GenerationOutput) -> None:
        answered = out.stop_reason in ANSWER_STOP_STRINGS
        if out.finish_reason is FinishReason.STOP and not answered:
            closed = self._ends_in_tool_call(b, out)
            calls = parse_turn_calls(self.cfg.tool_parser, self._turn_text(b), closed_tag=closed)
            if calls:  # one call (a tag stop), or every call of a turn that ended at end of sequence
                b.pending_calls = calls
                b.state = AgentState.PROCESSING_TOOLS
                return
        if out.finish_reason is FinishReason.STOP:
            self._terminate(b, BranchFinish.ANSWER if answered else BranchFinish.EOS)
        elif out.finish_reason is FinishReason.ABORT:
            self._terminate(b, BranchFinish.ABORT)
        elif b.response_len >= self.cfg.max_response_tokens:
            self._terminate(b, BranchFinish.LENGTH)
        else:
            self.hooks.on_boundary(b)

    def _ends_in_tool_call(self, b: Branch, out: GenerationOutput) -> bool:
        if out.stop_reason in TOOL_STOP_STRINGS:
            return True
        # Backends that do not name the stop string that fired: look at the text itself.
        tail = self.tokenizer.decode(b.tokens[-32:])
        return any(tail.endswith(s) for s in TOOL_STOP_STRINGS)

    def _turn_text(self, b: Branch) -> str:
        """The turn's text not yet executed: from the turn start, or from where a rollback spliced."""
        return self.tokenizer.decode(b.tokens[b.prompt_len + b.calls_from :])

    def _terminate(self, b: Branch, finish: BranchFinish) -> None:
        if b.kept_results:
            # A regenerated turn that made no call again: the calls before the rolled-back one did run.
            self._record_calls(b, b.kept_results)
            b.append_observation(self._encode("".join(format_result(r.text) for _, r in b.kept_results)))
            b.kept_results = []
        b.state = AgentState.TERMINATED
        b.finish = finish
        b.pending_calls = []
        if b.open_rollback is not None:
            # The regenerated turn made no further call: the failed call is gone but nothing was repaired.
            b.rollbacks.append(b.open_rollback.close(repaired=False))
            b.open_rollback = None
        self.metrics.add(f"rollout/finish/{finish.value}", 1)

    # ------------------------------------------------------------------ tools and rollback

    def _run_tools(self, waiting: list[Branch]) -> None:
        """Every pending call of every waiting branch in one ``tools.execute`` batch, results in order."""
        runnable = []
        for b in waiting:
            left = self.cfg.max_tool_calls - b.n_calls - len(b.kept_results)
            if left <= 0:
                self._terminate(b, BranchFinish.TOOL_LIMIT)
            else:
                b.pending_calls = b.pending_calls[:left]  # calls past the limit are not run
                runnable.append(b)
        if not runnable:
            return
        calls = [(c, b.request.tool_context) for b in runnable for c in b.pending_calls]
        if self.tools is None:
            results = [
                ToolResult(
                    text="no tools are available", status=ToolStatus.ERROR, error="no tools are configured"
                )
                for _ in calls
            ]
        else:
            results = list(self.tools.execute(calls))
        if len(results) != len(calls):
            raise ContractError(f"tools.execute returned {len(results)} results for {len(calls)} calls")
        at = 0
        for b in runnable:
            mine, at = results[at : at + len(b.pending_calls)], at + len(b.pending_calls)
            for result in mine:
                self.metrics.count_tool(result)
            pairs = list(zip(b.pending_calls, mine, strict=True))
            failing = [
                i for i, (_, r) in enumerate(pairs)
                if self.cfg.rollback.enable_tool_rollback and matches_rollback(r, self.cfg.rollback)
            ]  # fmt: skip
            if failing:
                self._rollback_or_give_up(b, pairs, failing[0])
            else:
                self._accept_results(b, b.kept_results + pairs)

    def _record_calls(self, b: Branch, pairs: list[tuple[ToolCall, ToolResult]]) -> None:
        for call, result in pairs:
            b.tool_calls.append(
                ToolCallRecord(
                    name=call.name,
                    arguments=call.arguments,
                    result=result.text,
                    status=result.status,
                    position=b.response_len,
                    latency_s=result.latency_s,
                    error=result.error,
                )
            )
        b.n_calls += len(pairs)

    def _accept_results(self, b: Branch, pairs: list[tuple[ToolCall, ToolResult]]) -> None:
        self._record_calls(b, pairs)
        b.pending_calls, b.kept_results = [], []
        if b.open_rollback is not None:
            b.rollbacks.append(b.open_rollback.close(repaired=True, end=b.response_len))
            self.metrics.add("tools/rollback_repairs", 1)
            b.open_rollback = None
        ids = self._encode("".join(format_result(r.text) for _, r in pairs))
        room = self.cfg.max_response_tokens - b.response_len
        b.append_observation(ids[:room])
        b.turn_start = b.calls_from = b.response_len
        if len(ids) >= room:
            self._terminate(b, BranchFinish.LENGTH)
            return
        b.state = AgentState.GENERATING
        self.hooks.on_boundary(b)

    def _checkpoint_of(self, b: Branch, pairs: list[tuple[ToolCall, ToolResult]], f: int) -> int:
        """Response index call ``f`` of the unexecuted part rolls back to: where call ``f-1`` ends, or where the
        part begins for the first call (the turn start, so a first call regenerates with its whole turn)."""
        if f == 0:
            return b.calls_from
        part = b.tokens[b.prompt_len + b.calls_from :]
        return b.calls_from + token_end(self.tokenizer.decode, part, pairs[f - 1][0].end)

    def _rollback_or_give_up(self, b: Branch, pairs: list[tuple[ToolCall, ToolResult]], f: int) -> None:
        """Call ``f`` failed with a rollback error: the calls before it keep their results; it and the calls
        after it are regenerated from its checkpoint with the error fed back (while a rollback is open, from
        the same position again)."""
        failed_call, failed = pairs[f]
        ob = b.open_rollback
        if ob is None:
            ob = OpenRollback(position=self._checkpoint_of(b, pairs, f), error="")
            b.kept_results = b.kept_results + pairs[:f]
        err = error_line(failed)
        ob.error = err
        ob.attempts += 1
        b.open_rollback = ob
        if b.retries[ob.position] >= self.cfg.rollback.max_tool_retries:
            # Past the limit: keep the failed calls and their errors in the trajectory and stop here.
            self._record_calls(b, b.kept_results)
            b.append_observation(
                self._encode("".join(format_result(r.text) for _, r in b.kept_results + pairs[f:]))
            )
            b.kept_results, b.pending_calls = [], []
            b.rollbacks.append(ob.close(repaired=False))
            b.open_rollback = None
            self.metrics.add("tools/rollback_terminations", 1)
            self._terminate(b, BranchFinish.RETRY_LIMIT)
            return
        b.retries[ob.position] += 1
        if self.tools is not None:
            self.tools.record_rollback(failed_call.name or "invalid")
        results = "".join(format_result(r.text) for _, r in pairs)
        b.append_observation(self._encode(results + self.cfg.rollback.feedback_template.format(error=err)))
        b.pending_calls = []
        b.regenerating = True
        b.state = AgentState.GENERATING
        self.metrics.add("tools/rollbacks", 1)

    def _restore(self, b: Branch) -> None:
        """Truncate to the open rollback's position: the failed calls, their errors and the feedback disappear."""
        assert b.open_rollback is not None
        position = b.open_rollback.position
        removed = b.truncate(position)
        b.open_rollback.tokens_removed += removed
        b.calls_from = position
        self.metrics.add("tools/rollback_tokens_removed", removed)
        b.regenerating = False
        self.hooks.on_restore(b, position)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))
