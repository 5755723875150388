"""The speculative decoding loop; plain decoding is the same loop with a draft that proposes nothing.

Each round follows Algorithm 1 of Leviathan et al. (2023): the draft proposes up to γ tokens (`propose`), the
target scores all of them in one forward and keeps a prefix plus one more token (`verify`), each row takes its
tokens up to where plain `generate` would stop (`commit`), and both models roll back to what was kept
(`settle`). Batches share one slot layout (see `hfspec.kernels.slots`); rows that finish are dropped from the batch and
the caches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hfspec.decoding.costmodel import RoundMeter, time_one_token_steps
from hfspec.decoding.round import Committed, Proposal, Verdict, history_groups
from hfspec.decoding.sampling import sample, verify, verify_greedy
from hfspec.decoding.scoring import Scorer
from hfspec.decoding.siblings import Tree, check_tree_target, tree_round
from hfspec.decoding.stats import RoundEvent, SpecStats
from hfspec.decoding.stopping import Stopper
from hfspec.decoding.trees import DynamicTree, check_dynamic_tree, dynamic_round
from hfspec.drafts.base import Draft, NoDraft, attach_draft
from hfspec.kernels.kv_model import CachedModel
from hfspec.kernels.slots import Slots


@dataclass
class DecodeResult:
    sequences: torch.Tensor
    kinds: list[list[str]]
    stats: SpecStats


@dataclass
class DecodeJob:
    """How to decode, besides the models and the prompt: token rules (`scorer`), when to stop (`stopper`), how
    many tokens to propose (`policy`), and the live hooks. `target_runner`: the target's runner (default: the
    HF forward with a KV cache); the draft is attached to it, so a self-draft can share it."""

    scorer: Scorer
    stopper: Stopper
    policy: object
    pad_token_id: int
    generator: torch.Generator | None = None
    streamer: object = None
    on_round: Callable | None = None
    should_stop: Callable[[], bool] | None = None
    stats: SpecStats | None = None
    target_runner: object = None
    tree: object = None  # `hfspec.decoding.siblings.Tree` (sibling leaves) or `hfspec.decoding.trees.DynamicTree` (batch size 1)
    noise: object = None  # `hfspec.decoding.coupling.GumbelNoise`: coupling="gumbel" when sampling (None: rejection)


def decode(target: torch.nn.Module, draft: Draft | None, input_ids: torch.Tensor,
           attention_mask: torch.Tensor | None, job: DecodeJob) -> DecodeResult:
    """Generate until every row stops. `draft`: a `Draft` (see `hfspec.drafts.base`); None decodes plainly."""
    run = _Run(target, draft, input_ids, attention_mask, job)
    while run.active:
        if run.user_stopped():
            break
        run.meter.begin(len(run.active))
        if isinstance(job.tree, DynamicTree):  # a token tree: grown, scored and walked in one step
            proposal, verdict = dynamic_round(run, job.tree)
        else:
            proposal = propose(run)
            verdict = verify_proposal(run, proposal)
        done = commit(run, proposal, verdict)
        settle(run, proposal, verdict, done)
        run.meter.end(proposal.gamma, sum(done.accepted))  # the round's costs, for `hfspec.decoding.costmodel`
    return run.finish()


class _Run:
    """The state of one decode: slots, each row's new tokens, the rows still running, the statistics."""

    def __init__(self, target, draft, input_ids, attention_mask, job: DecodeJob):
        self.began = time.perf_counter()
        self.job = job
        self.draft = draft if draft is not None else NoDraft()
        self.speculative = not isinstance(self.draft, NoDraft)
        self.input_ids = input_ids
        batch, self.prompt_len = input_ids.shape
        self.stats = job.stats or SpecStats()
        self.stats.gamma, self.stats.batch_size = (job.policy.label if self.speculative else 0), batch
        self.stats.stop_reasons = [""] * batch
        self.slots = Slots(input_ids, attention_mask)
        self.target = job.target_runner or CachedModel(target)
        attach_draft(self.draft, self.target)
        self.meter = RoundMeter(self.stats.costs, self.target, self.draft)
        if isinstance(job.tree, DynamicTree):
            check_dynamic_tree(target, self.target, self.draft)
        elif job.tree is not None:
            check_tree_target(target, self.target)
        self.out: list[list[int]] = [[] for _ in range(batch)]
        self.kinds: list[list[str]] = [[] for _ in range(batch)]
        self.active = list(range(batch))
        self.round_index = 0

    def offsets(self) -> list[int]:
        """Per active row, how many new tokens it has: the position of its next token (the noise's key)."""
        return [len(self.out[row]) for row in self.active]

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


def propose(run: _Run) -> Proposal:
    """The draft appends up to γ tokens to the slots; q is processed exactly as the target's p will be."""
    job, device = run.job, run.input_ids.device
    room = max(job.stopper.budget(run.prompt_len + len(run.out[row])) for row in run.active)
    gamma = max(0, min(job.policy.next(), room - 1)) if run.speculative else 0
    start = run.slots.size
    groups = history_groups([run.history(r) for r in run.active], device) if job.scorer.needs_history else None
    clock = (run.draft.seconds, run.draft.forwards)
    early = getattr(job.policy, "decide", None)  # an early exit (hfspec.decoding.early_exit) ends the draft's round
    x, q = run.draft.propose(run.slots, gamma, run.meter.timed(_picker(job, groups, device, run)),
                             **({"decide": early} if early else {}))
    return Proposal(x, q, start, gamma, groups, clock)


def _picker(job: DecodeJob, groups, device, run: _Run):
    scorer, generator = job.scorer, job.generator
    batch_rows, offsets = list(run.active), run.offsets()

    def pick(logits: torch.Tensor, x_so_far: torch.Tensor):
        """The draft's next token and its distribution q, processed exactly as the target's p will be."""
        logits = logits.to(device)
        ctx = [(rows, torch.cat([ids, x_so_far[rows]], dim=1)) for rows, ids in groups] if groups else None
        if not scorer.do_sample:
            return scorer.greedy(ctx, x_so_far, logits)[:, 0], None
        if job.noise is not None:  # coupling="gumbel": argmax(log q + g) with the target's noise at this position
            j = x_so_far.shape[1]
            noise = job.noise.at(batch_rows, [o + j for o in offsets], 1, scorer.vocab_size, device)
            x_j, q_j = scorer.gumbel(ctx, x_so_far, logits, noise, with_probs=True)
            return x_j[:, 0], q_j[:, 0]
        q_j = scorer.probs(ctx, x_so_far, logits)[:, 0]
        return sample(q_j, generator), q_j

    return pick if not isinstance(job.tree, Tree) else job.tree.wrap_pick(pick, scorer, groups)


def verify_proposal(run: _Run, proposal: Proposal) -> Verdict:
    """One target forward over everything it has not seen, distributions at γ + 1 positions; keep a prefix of x
    and draw one more token (the rule of `hfspec.decoding.sampling.verify`). With a tree, `hfspec.decoding.siblings.tree_round`."""
    if isinstance(run.job.tree, Tree) and (verdict := tree_round(run, proposal, run.job.tree)) is not None:
        return verdict
    scorer, slots, gamma = run.job.scorer, run.slots, proposal.gamma
    before = run.target.seconds
    logits = run.target.feed(slots.tokens, slots.positions, slots.valid, proposal.start + gamma, gamma + 1,
                             slots.all_valid)
    logits = logits.to(run.input_ids.device)
    run.meter.scoring()
    if scorer.do_sample and run.job.noise is not None:
        # coupling="gumbel": the target's tokens are argmax(log p + g) at the γ + 1 positions; a proposal is kept
        # iff it is the target's token there (greedy verification of the perturbed argmaxes)
        noise = run.job.noise.at(run.active, run.offsets(), gamma + 1, scorer.vocab_size, run.input_ids.device)
        tokens, _ = scorer.gumbel(proposal.groups, proposal.x, logits, noise)
        n, token = verify_greedy(tokens, proposal.x)
    elif scorer.do_sample:
        # q None: a draft without distributions proposes deterministically (q one-hot on x; `verify` forms it
        # only at the one position per row that needs it)
        n, token = verify(scorer.probs(proposal.groups, proposal.x, logits), proposal.q, proposal.x, run.job.generator)
    else:
        n, token = verify_greedy(scorer.greedy(proposal.groups, proposal.x, logits), proposal.x)
    run.meter.scored()
    return Verdict(n, token, run.target.seconds - before)


def commit(run: _Run, proposal: Proposal, verdict: Verdict) -> Committed:
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


def _report(run: _Run, proposal: Proposal, verdict: Verdict, done: Committed) -> None:
    job, stats, gamma = run.job, run.stats, proposal.gamma
    if job.streamer is not None and done.tokens[0]:
        job.streamer.put(run.input_ids.new_tensor(done.tokens[0]).cpu())
    stats.record_round(gamma, done.accepted, done.checked, [len(t) for t in done.tokens], run.active)
    if hasattr(job.policy, "observe"):  # an early exit learns which positions were accepted
        job.policy.observe(done.accepted, done.checked)
    # A round where the draft had nothing to propose (prompt lookup without a match) says nothing about α or
    # c, and is not the policy choosing plain decoding: the policy does not learn from it.
    if run.speculative and not (proposal.asked > 0 and gamma == 0):
        seconds, forwards = proposal.draft_clock
        d_step = (run.draft.seconds - seconds) / max(1, run.draft.forwards - forwards)
        job.policy.update(gamma, sum(done.accepted), sum(done.checked), d_step, verdict.target_seconds)
    _copy_model_stats(run)
    if job.on_round is not None:
        with run.meter.excluded():  # a live display's time is not the round's
            job.on_round(RoundEvent(run.round_index, gamma, done.accepted, done.tokens, done.kinds, stats,
                                    list(run.active), verdict.tree))
    run.round_index += 1


def settle(run: _Run, proposal: Proposal, verdict: Verdict, done: Committed) -> None:
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


def _copy_model_stats(run: _Run) -> None:
    stats, target, draft = run.stats, run.target, run.draft
    stats.time_target = target.seconds
    stats.positions_fed_target = target.positions_fed
    if draft.forwards:
        stats.time_draft = draft.seconds
        stats.draft_forwards = draft.forwards
        stats.positions_fed_draft = draft.positions_fed
    stats.time_total = time.perf_counter() - run.began
