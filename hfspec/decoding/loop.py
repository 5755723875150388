"""The speculative decoding loop; plain decoding is the same loop with a draft that proposes nothing.

Each round follows Algorithm 1 of Leviathan et al. (2023): the job's verifier has the draft propose up to γ
tokens and the target score all of them in one forward, keeping a prefix plus one more token
(`Verifier.propose_and_verify`; the chain by default, `hfspec.decoding.chain`), each row takes its tokens up to
where plain `generate` would stop (`commit`), and both models roll back to what was kept (`settle`). Batches
share one slot layout (see `hfspec.kernels.slots`); rows that finish are dropped from the batch and the caches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from transformers.generation.streamers import BaseStreamer

from hfspec.decoding.chain import Chain
from hfspec.decoding.costmodel import RoundMeter, time_one_token_steps
from hfspec.decoding.coupling import GumbelNoise
from hfspec.decoding.gamma import GammaPolicy
from hfspec.decoding.priors import LEAN_TARGET_FLOOR, verify_floor
from hfspec.decoding.round import Committed, Proposal, Verdict
from hfspec.decoding.scoring import Scorer
from hfspec.decoding.stats import RoundEvent, SpecStats
from hfspec.decoding.stopping import Stopper
from hfspec.decoding.verifier import Verifier
from hfspec.drafts.base import AttachesToTarget, Draft, NoDraft, attach_draft
from hfspec.kernels import lean_target, native_step, verify_linear
from hfspec.kernels.kv_model import CachedModel, Runner
from hfspec.kernels.lean import LeanRunner
from hfspec.kernels.slots import Slots


@dataclass
class DecodeResult:
    sequences: torch.Tensor
    kinds: list[list[str]]
    stats: SpecStats


@dataclass
class DecodeJob:
    """How to decode, besides the models and the prompt: token rules (`scorer`), when to stop (`stopper`), how
    many tokens to propose (`policy`), how a round proposes and verifies (`verifier`: the chain, sibling leaves
    `hfspec.decoding.siblings.Tree`, or a token tree `hfspec.decoding.trees.DynamicTree`), and the live hooks.
    `target_runner`: the target's runner (default: the HF forward with a KV cache); the draft is attached to it,
    so a self-draft can share it. `noise`: coupling="gumbel" when sampling (None: rejection)."""

    scorer: Scorer
    stopper: Stopper
    policy: GammaPolicy
    pad_token_id: int
    generator: torch.Generator | None = None
    streamer: BaseStreamer | None = None
    on_round: Callable[[RoundEvent], None] | None = None
    should_stop: Callable[[], bool] | None = None
    stats: SpecStats | None = None
    target_runner: Runner | None = None
    verifier: Verifier = field(default_factory=Chain)
    noise: GumbelNoise | None = None


def decode(target: torch.nn.Module, draft: Draft | None, input_ids: torch.Tensor,
           attention_mask: torch.Tensor | None, job: DecodeJob) -> DecodeResult:
    """Generate until every row stops. `draft`: a `Draft` (see `hfspec.drafts.base`); None decodes plainly.
    A speculative decode's fp32 verify passes run the few-row kernel where it is on (`hfspec.kernels.verify_linear`)."""
    with verify_linear.installed(target) if draft is not None and not isinstance(draft, NoDraft) else nullcontext() \
            as routed:
        run = Run(target, draft, input_ids, attention_mask, job)
        if routed:  # verify passes may cost less than plain decoding's step: the plausibility check's bound says so
            run.stats.verify_floor = verify_floor(run.stats.target_dtype)
        if isinstance(run.target, LeanRunner) and job.target_runner is None:  # cheaper still: the lean target's
            run.stats.verify_floor = min(run.stats.verify_floor, LEAN_TARGET_FLOOR)
        while run.active:
            if run.user_stopped():
                break
            run.meter.begin(len(run.active))
            before = sum(map(len, run.out))
            proposal, verdict = job.verifier.propose_and_verify(run)
            done = commit(run, proposal, verdict)
            settle(run, proposal, verdict, done)
            # the round's costs, for `hfspec.decoding.costmodel`, and the tokens it committed
            run.meter.end(proposal.gamma, sum(done.accepted), max(0, sum(map(len, run.out)) - before))
        return run.finish()


def lean_target_capable(draft: Draft, verifier: Verifier) -> bool:
    """Whether a decode with this draft and verifier may score the target through the lean target: a speculative
    decode (a plain one's baseline is the HF forward) whose draft does not share the target's runner and whose
    verifier feeds the target only through its runner (`Verifier.lean_target`)."""
    return not isinstance(draft, NoDraft | AttachesToTarget) and getattr(verifier, "lean_target", False)


def target_runner(target, draft: Draft, batch: int, verifier: Verifier, stats: SpecStats) -> Runner:
    """The target's runner for a decode: the lean decoder over its own weights where a speculative decode's
    verifier can score through it (`hfspec.kernels.lean_target`; not a plain decode, whose baseline is the HF
    forward, nor a draft that shares the target's runner), else the HF forward with its KV cache.
    `stats.target_path` says which, and why not the lean one."""
    if not lean_target_capable(draft, verifier):
        stats.target_path = "HF forward"
        return CachedModel(target)
    runner, path = lean_target.runner_for(target, batch)
    if runner is not None and native_step.of(runner.model) is not None:
        path += ", native C step"  # its passes of 1-16 positions (`hfspec.kernels.native_step`)
    stats.target_path = path if runner is not None else f"HF forward ({path})"
    return runner if runner is not None else CachedModel(target)


class Run:
    """The state of one decode: slots, each row's new tokens, the rows still running, the statistics. A verifier
    reads it as a `hfspec.decoding.verifier.RoundState` (the attributes and methods listed there)."""

    def __init__(self, target, draft, input_ids, attention_mask, job: DecodeJob):
        self.job = job
        self.scorer, self.generator, self.noise, self.policy = job.scorer, job.generator, job.noise, job.policy
        self.draft = draft if draft is not None else NoDraft()
        self.speculative = not isinstance(self.draft, NoDraft)
        self.decide = self.policy.decide if self.speculative else None
        self.input_ids = input_ids
        self.device, self.token_dtype = input_ids.device, input_ids.dtype
        batch, self.prompt_len = input_ids.shape
        self.stats = job.stats or SpecStats()
        self.stats.gamma, self.stats.batch_size = (self.policy.label if self.speculative else 0), batch
        self.stats.stop_reasons = [""] * batch
        self.slots = Slots(input_ids, attention_mask)
        self.target = job.target_runner or target_runner(target, self.draft, batch, job.verifier, self.stats)
        attach_draft(self.draft, self.target)
        self.meter = RoundMeter(self.stats.costs, self.target, self.draft)
        job.verifier.check(target, self)  # (a compiled draft's tree level compiles here once: not timed)
        self.began = time.perf_counter()
        self.out: list[list[int]] = [[] for _ in range(batch)]
        self.kinds: list[list[str]] = [[] for _ in range(batch)]
        self.active = list(range(batch))
        self.round_index = 0
        self.chosen = 0  # the γ policy's choice for the latest round, before the length budget capped it

    def room(self) -> int:
        return max(self.job.stopper.budget(self.prompt_len + len(self.out[row])) for row in self.active)

    def gamma(self) -> int:
        """This round's γ: the policy's, capped by the length budget (`chosen` keeps the policy's own)."""
        if not self.speculative:
            return 0
        self.chosen = self.policy.next()
        return max(0, min(self.chosen, self.room() - 1))

    def offsets(self) -> list[int]:
        """Per active row, how many new tokens it has: the position of its next token (the noise's key)."""
        return [len(self.out[row]) for row in self.active]

    def new_tokens(self) -> int:
        return sum(len(o) for o in self.out)

    def history(self, row: int) -> torch.Tensor:
        return torch.cat([self.input_ids[row], self.input_ids.new_tensor(self.out[row])])

    def user_stopped(self) -> bool:
        if self.job.should_stop is None or not self.job.should_stop():
            return False
        self.stats.stopped = True
        for row in self.active:
            self.stats.stop_reasons[row] = "user"
        return True

    def finish(self) -> DecodeResult:
        if self.job.streamer is not None:
            self.job.streamer.end()
        _copy_model_stats(self)
        if not self.stats.stopped:
            time_one_token_steps(self.stats.costs, self.target, self.slots)  # the cost model's t(1), outside time_total
        batch, device = self.input_ids.shape[0], self.input_ids.device
        width = max(len(row) for row in self.out) if self.out else 0
        sequences = torch.full((batch, self.prompt_len + width), self.job.pad_token_id, dtype=self.input_ids.dtype,
                               device=device)
        sequences[:, :self.prompt_len] = self.input_ids
        for row, tokens in enumerate(self.out):
            sequences[row, self.prompt_len : self.prompt_len + len(tokens)] = self.input_ids.new_tensor(tokens)
        return DecodeResult(sequences, self.kinds, self.stats)


def commit(run: Run, proposal: Proposal, verdict: Verdict) -> Committed:
    """Each row takes its accepted tokens and the new one in order, stopping exactly where plain generate would;
    then the statistics, the streamer, the γ policy and `on_round` hear of the round."""
    gamma, done = proposal.gamma, Committed()
    last = "target" if gamma == 0 else None
    for row, n_i, token, x_row in zip(run.active, verdict.n.tolist(), verdict.token.tolist(), proposal.x.tolist(),
                                      strict=True):
        kind = last or verdict.last_kind or ("bonus" if n_i == gamma or verdict.from_leaf else "resampled")
        tokens = x_row[:n_i] + [token]
        keep, finished, reason = run.job.stopper.commit(run.prompt_len + len(run.out[row]), tokens,
                                                        lambda row=row: run.history(row))
        row_kinds = (["accepted"] * n_i + [kind])[:keep]
        run.out[row].extend(tokens[:keep])
        run.kinds[row].extend(row_kinds)
        done.tokens.append(tokens[:keep])
        done.kinds.append(row_kinds)
        # Positions past a stop (EOS, length) were never really used: count only those up to it.
        done.accepted.append(min(n_i, keep))
        done.checked.append(min(n_i + 1, gamma, keep))
        done.finished.append(finished)
        if finished:
            run.stats.stop_reasons[row] = reason
    _report(run, proposal, verdict, done)
    return done


def _report(run: Run, proposal: Proposal, verdict: Verdict, done: Committed) -> None:
    job, stats, gamma = run.job, run.stats, proposal.gamma
    if job.streamer is not None and done.tokens[0]:
        job.streamer.put(run.input_ids.new_tensor(done.tokens[0]).cpu())
    stats.record_round(gamma, done.accepted, done.checked, [len(t) for t in done.tokens], run.active)
    # A token tree's round is not a chain of γ: the γ policy (which sizes tree "auto"'s chain rounds) learns from
    # chain rounds only, as in a chain's run.
    tree_round = verdict.tree is not None and not verdict.tree.chain
    if not tree_round:
        job.policy.observe(done.accepted, done.checked)  # an early exit learns which positions were accepted
    # A round at γ 0 the policy did not choose (prompt lookup without a match, or the length budget's last token)
    # says nothing about α or c, and is not the policy choosing plain decoding: the policy does not learn from it.
    if run.speculative and not tree_round and not (gamma == 0 and run.chosen > 0):
        seconds, forwards = proposal.draft_clock
        d_step = (run.draft.seconds - seconds) / max(1, run.draft.forwards - forwards)
        job.policy.update(gamma, sum(done.accepted), sum(done.checked), d_step, verdict.target_seconds)
    _copy_model_stats(run)
    if job.on_round is not None:
        with run.meter.excluded():  # a live display's time is not the round's
            job.on_round(RoundEvent(run.round_index, gamma, done.accepted, done.tokens, done.kinds, stats,
                                    list(run.active), verdict.tree))
    run.round_index += 1


def settle(run: Run, proposal: Proposal, verdict: Verdict, done: Committed) -> None:
    """Roll both caches back to the accepted prefix, lay out the next round, and drop finished rows."""
    run.slots.settle(proposal.start, proposal.x, verdict.n, verdict.token)
    run.target.rollback(run.slots.size - 1)
    run.draft.rollback(run.slots.size - 1)
    if not any(done.finished):
        return
    keep = [i for i, finished in enumerate(done.finished) if not finished]
    run.active = [run.active[i] for i in keep]
    if run.active:
        rows = torch.tensor(keep, device=run.input_ids.device)
        run.slots.keep_rows(rows)
        run.target.keep_rows(rows)
        run.draft.keep_rows(rows)


def _copy_model_stats(run: Run) -> None:
    stats, target, draft = run.stats, run.target, run.draft
    stats.time_target = target.seconds
    stats.positions_fed_target = target.positions_fed
    if draft.forwards:
        stats.time_draft = draft.seconds
        stats.draft_forwards = draft.forwards
        stats.positions_fed_draft = draft.positions_fed
    stats.time_total = time.perf_counter() - run.began
