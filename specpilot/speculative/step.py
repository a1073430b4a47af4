"""One speculative step, device only (no host sync, so it can be captured as one CUDA graph):

  context  the rows the last step committed become the drafter's context (their target features);
  propose  the proposer's rows (stock: the drafter's greedy chain; a tree builder's rows: speculative/tree.py);
  verify   one target pass over them (its logits and the features the drafter conditions on);
  accept   the verdict (speculative/accept.py);
  commit   every cache keeps the accepted path; the bonus token and the next position are the new state.

The step owns its persistent tensors (SpecState) so that a graph replays it as is; the host reads `out`
([B, 1 + R]: accepted count, then the committed tokens) once per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Proposal, Verdict, chain
from specpilot.core.regions import region
from specpilot.kernels.sample import SamplerRows, pick
from specpilot.models.cache import Cache
from specpilot.models.dense import DenseTarget, Mode
from specpilot.runtime.faults import distort, force_first_draft
from specpilot.speculative.accept import accept_greedy, accept_predicted
from specpilot.speculative.admit import Admission, ride
from specpilot.speculative.budget import BudgetProposer, ChainBudgetProposer, Expect
from specpilot.speculative.drafter import Drafter
from specpilot.speculative.proposal import ChainProposer, TreeProposer
from specpilot.speculative.tree import TreeBuilder


@dataclass
class SpecState:
    """What one step leaves for the next: [B] token and position (shared with the engine's AR state), the
    last verify's features [B, R, F] of which the first count [B] rows were committed, and `out`."""

    token: torch.Tensor
    pos: torch.Tensor
    ctx_feats: torch.Tensor
    ctx_count: torch.Tensor
    out: torch.Tensor
    live: torch.Tensor | None = None  # [B] 1 where a request decodes (batches): a parked row stays where it is
    sampler: SamplerRows | None = None  # each row's sampling (read where the step samples: SpecStep.sampling)
    # batch_rows=auto over a best_first/ddtree tree: the tokens each budget on offer was expected to commit this step
    expect: torch.Tensor | None = None
    ctx_tokens: torch.Tensor | None = None  # [B, R]: the tokens of ctx_feats' rows (what the drafter is told)

    def rows(self, n: int) -> SpecState:
        """The first n rows (views: a batch step over fewer slots moves these)."""
        return SpecState(self.token[:n], self.pos[:n], self.ctx_feats[:n], self.ctx_count[:n], self.out[:n],
                         None if self.live is None else self.live[:n],
                         None if self.sampler is None else self.sampler.rows(0, n), self.expect,
                         None if self.ctx_tokens is None else self.ctx_tokens[:n])


class SpecStep:
    """The stock speculative step of one target and drafter over their caches (see the module docstring)."""

    def __init__(self, target: DenseTarget, drafter: Drafter, cache: Cache, state: SpecState, plan: KernelPlan,
                 fault: str = "none", builder: TreeBuilder | None = None, forward: Callable | None = None,
                 ctx_rows: torch.Tensor | None = None, budget: int = 0, offers: tuple[int, ...] = (),
                 admission: Admission | None = None):
        """drafter: what proposes (speculative/drafter.py; it keeps its own cache); builder: a tree builder (None:
        stock's chain); forward: what runs the target's pass (default the target itself; a model-level fault's
        wrapper: runtime/faults.faulty); ctx_rows: the rows of the state's ctx_feats the drafter is told of (default
        this step's own rows; a narrower step of a batch takes its engine's full step's, whose state it shares);
        budget: the rows a batch step verifies in all, shared by its requests (speculative/budget.py; 0: none);
        offers: the budgets whose expected tokens the step writes to state.expect (batch_rows=auto over a tree);
        admission: the prompt chunks the step's verify pass carries (speculative/admit.py; None: none)."""
        self.target, self.drafter, self.cache, self.state = target, drafter, cache, state
        self.forward = forward or target
        self.plan, self.fault = plan, fault
        device = target.device
        if budget and builder is None:
            self.proposer = ChainBudgetProposer(drafter, device, budget, state.live)
        elif budget or offers:
            expect = Expect(state.expect, offers) if offers else None
            self.proposer = BudgetProposer(drafter, device, builder, budget, state.live, expect)
        elif builder is not None:
            self.proposer = TreeProposer(drafter, device, builder)
        else:
            self.proposer = ChainProposer(drafter, device)
        self.hidden_layers = drafter.taps
        self.sampling = False  # static (a captured step either samples or takes the argmax): the engine sets it
        self.ctx_rows = self.proposer.index if ctx_rows is None else ctx_rows  # the rows of the state's ctx_feats
        self.admission = admission

    def __call__(self) -> None:
        s = self.state
        with region("drafter"):
            self.context(s)
        proposal = self.propose(s)
        if self.admission is not None:  # parked slots' rows carry their prompts' chunks
            proposal = ride(proposal, self.admission)
            a = self.admission  # a request's first chunk: its recurrent states start afresh
            self.cache.reset_rows((a.count > 0) & (a.first == 0))
        logits, feats = self.verify(proposal)
        with region("tree"):  # accept and commit (a tree's build is inside propose)
            self.commit(proposal, self.accept(proposal, logits), feats)
        if self.admission is not None:
            self.admitted(self.admission, proposal, logits, feats)

    def kept(self, verdict: Verdict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What every cache keeps: (path, accepted, start). A slot carrying a prompt chunk keeps the chunk's rows,
        all of them, where they are (a recurrent state moves past them; attention K/V stay in place)."""
        s, a = self.state, self.admission
        if a is None:
            return verdict.path, verdict.accepted, s.pos
        on = a.count > 0
        path = torch.where(on[:, None], a.index[: verdict.path.shape[1]], verdict.path)
        return (path, torch.where(on, (a.count - 1).clamp(min=0), verdict.accepted),
                torch.where(on, a.first, s.pos))

    def _moving(self) -> torch.Tensor | None:
        """The rows whose recurrent states move: the decoding ones, and those carrying a chunk."""
        live, a = self.state.live, self.admission
        if a is None or live is None:
            return live
        return torch.where(a.count > 0, 1, live)

    def admitted(self, a: Admission, proposal: Proposal, logits: torch.Tensor, feats: torch.Tensor) -> None:
        """The chunks' taps to the drafter's context (as a prefill's); where a chunk ends its prompt, the slot's first
        token (the target's pick at its last row), its position past the prompt and no context left to tell."""
        s = self.state
        with region("drafter"):
            self.drafter.commit(feats.to(s.ctx_feats.dtype), a.first, a.count, a.index, a.tokens)
        done = (a.count > 0) & a.last.bool()
        row = (a.count - 1).clamp(min=0)
        last = distort(logits.gather(1, row[:, None, None].expand(-1, 1, logits.shape[-1])), self.fault)
        end = a.first + a.count
        first = pick(last, end[:, None], s.sampler)[:, 0] if self.sampling else last[:, 0].argmax(-1)
        s.token.copy_(torch.where(done, first, s.token))
        s.pos.copy_(torch.where(done, end, s.pos))
        s.ctx_count.copy_(torch.where(done, 0, s.ctx_count))

    def propose(self, s: SpecState) -> Proposal:
        """The rows to verify after the state's token (two-level verification proposes two rounds here)."""
        return self.proposer.propose(s.token, s.pos)

    def context(self, s: SpecState) -> None:
        """The previous verify's rows 0..count-1 are committed: the drafter is told (their features)."""
        self.drafter.commit(s.ctx_feats, s.pos - s.ctx_count, s.ctx_count, self.ctx_rows, s.ctx_tokens)

    def verify(self, proposal: Proposal, view: str = "exact") -> tuple[torch.Tensor, torch.Tensor]:
        """The target's pass over the proposal's rows (view: the weights it reads, core/contracts.VIEWS)."""
        return self.forward(proposal.tokens, proposal.forward(view), self.cache, Mode.VERIFY, self.plan,
                            self.hidden_layers)

    def accept(self, proposal: Proposal, logits: torch.Tensor) -> Verdict:
        logits = distort(logits, self.fault)
        if self.sampling:  # each row's next token sits one position past the row
            verdict = accept_predicted(proposal, pick(logits, proposal.positions + 1, self.state.sampler))
        else:
            verdict = accept_greedy(proposal, logits)
        forcing = self.fault in ("unverified_accept", "rare_unverified")
        if forcing and proposal.drafts.shape[1]:  # (an anchor step has no draft to force through)
            verdict = force_first_draft(verdict, proposal.drafts, self.state.pos if self.fault == "rare_unverified"
                                        else None)
        return verdict

    def commit(self, proposal: Proposal, verdict: Verdict, feats: torch.Tensor) -> None:
        """Every cache keeps the accepted path (a chain's is in place: nothing moves; a tree's rows move to
        consecutive slots); the committed rows' features become the drafter's next context; the bonus token and
        the position move on."""
        s = self.state
        self.cache.commit(*self.kept(verdict), in_place=proposal.chain, live=self._moving())
        path = None if proposal.chain else verdict.path
        s.out[:, 0] = verdict.accepted
        s.out[:, 1 : 1 + verdict.tokens.shape[1]] = verdict.tokens  # (an anchor step's one row: the rest unread)
        kept = feats if path is None else feats.gather(1, path[..., None].expand(-1, -1, feats.shape[2]))
        s.ctx_feats[:, : kept.shape[1]].copy_(kept)
        if s.ctx_tokens is not None:  # the same rows' own tokens
            own = proposal.tokens if path is None else proposal.tokens.gather(1, path)
            s.ctx_tokens[:, : own.shape[1]].copy_(own[:, : s.ctx_tokens.shape[1]])
        if s.live is None:
            moved, bonus = verdict.accepted + 1, verdict.bonus
        else:  # a parked row keeps its token (a request whose prefill just ended holds its first one there)
            moved, bonus = (verdict.accepted + 1) * s.live, torch.where(s.live.bool(), verdict.bonus, s.token)
        s.ctx_count.copy_(moved)
        s.token.copy_(bonus)
        s.pos.add_(moved)


class AnchorStep(SpecStep):
    """A target pass over each request's anchor alone, no drafting: AR's next token (the row's argmax, or its sample
    at the same position), and the drafter told the rows the last step committed, as after any step, so that a
    speculative step can follow it. A batch's one-row step where speculating would commit fewer tokens a second
    (`batch_rows=auto`: runtime/batch.py); built with its speculative step's arguments and context rows."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.one = torch.zeros(1, dtype=torch.int64, device=self.target.device)
        self.no_parent = (self.one - 1)[None]

    def propose(self, s: SpecState) -> Proposal:
        return chain(s.token, s.token[:, None][:, :0], s.pos, self.one, self.no_parent)
