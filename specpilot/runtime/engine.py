"""Generation loops: AR greedy decoding and stock speculative decoding, one request at a time.

Both share the target's kernels, precision, static caches and (on CUDA) graph capture: an AR baseline
that runs eagerly would flatter every speedup. Each decode step is one graph replay and one host sync
that reads the step's committed tokens; with graphs the next step (SPECPILOT_LOOKAHEAD steps) is already
enqueued while the host waits (runtime/graphs.Lookahead), so the host's read and launch never leave the GPU
idle.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specpilot.errors import UserError
from specpilot.kernels.greedy import greedy_advance
from specpilot.models.dense import DenseTarget, Mode
from specpilot.models.dflash import DFlashDrafter
from specpilot.models.layers import use_gemv
from specpilot.runtime.faults import MODEL_FAULTS, distort, force_first_draft
from specpilot.runtime.graphs import Lookahead, StepGraph, lookahead_depth, replay_ms
from specpilot.runtime.options import System
from specpilot.runtime.padding import Pad
from specpilot.spec.accept import accept_greedy
from specpilot.spec.masks import Visibility


@dataclass
class Generation:
    tokens: list[int]  # output tokens (the prompt excluded), cut at a stop token or max_new_tokens
    prefill_s: float
    decode_s: float  # from the first token (given by prefill) to the last
    accepted: list[int] = field(default_factory=list)  # tokens committed by each decode target pass

    @property
    def decode_tokens(self) -> int:
        return max(len(self.tokens) - 1, 0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Engine:
    """Owns the caches and the static step buffers for one target (+ drafter) and one context size."""

    def __init__(self, target: DenseTarget, drafter: DFlashDrafter | None = None, *, context: int,
                 use_graphs: bool = True, block_size: int = 0, gemv: bool = False, fault: str = "none",
                 pad_us: float = 0.0):
        self.target, self.drafter = target, drafter
        self.device = target.embed.weight.device
        self.context = context
        self.gemv = gemv
        self.gemv_tuning: dict = {}
        self._ahead: dict[int, Lookahead] = {}  # pinned read-back buffers by step output (CUDA graphs)
        self.fault = fault
        if fault == "unverified_accept" and drafter is None:
            raise UserError("fault unverified_accept needs a drafter (system stock)")
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.pad = Pad(pad_us, self.device)
        if target.rope.length < context + 1:
            target.set_rope_length(context + 1, device=self.device)
        self.cache = target.new_cache(1, context)
        dev = self.device
        self.pos = torch.zeros(1, dtype=torch.int64, device=dev)
        self.token = torch.zeros(1, dtype=torch.int64, device=dev)
        self._ar = StepGraph(self._ar_step, self.use_graphs)
        self.block = 0
        if drafter is not None:
            self._init_spec(drafter, block_size)

    # ----- set-up ---------------------------------------------------------------------------------
    def _init_spec(self, drafter: DFlashDrafter, block_size: int) -> None:
        own = drafter.cfg.block_size
        if block_size and not 2 <= block_size <= own:
            raise UserError(f"block_size={block_size} is outside 2..{own} (the drafter's own block size)")
        self.block = block_size or own
        if drafter.rope.length < self.context + 1:
            drafter.set_rope_length(self.context + 1, device=self.device)
        # One extra slot at the end absorbs the K/V of context rows that are not valid this step.
        self.dcache = drafter.new_cache(1, self.context + 1)
        self.trash = self.context
        self.hidden_layers = tuple(drafter.cfg.target_layer_ids)
        feats = len(self.hidden_layers) * self.target.cfg.hidden_size
        dev = self.device
        self.ctx_feats = torch.zeros(1, self.block, feats, dtype=self.dcache.k.dtype, device=dev)
        self.ctx_count = torch.zeros(1, dtype=torch.int64, device=dev)
        self.masks = torch.full((1, self.block - 1), drafter.cfg.mask_token_id, dtype=torch.int64, device=dev)
        self.rows = torch.arange(self.block, device=dev)
        self.step_out = torch.zeros(1 + self.block, dtype=torch.int64, device=dev)
        self._spec = StepGraph(self._spec_step, self.use_graphs)

    def check_request(self, prompt: list[int], max_new_tokens: int) -> None:
        if not prompt:
            raise UserError("empty prompt: a request needs at least one token")
        if max_new_tokens <= 0:
            raise UserError(f"max_new_tokens must be positive, got {max_new_tokens}")
        need = len(prompt) + max_new_tokens + self.block
        if need > self.context:
            raise UserError(f"prompt longer than the context: {len(prompt)} prompt tokens + {max_new_tokens} "
                            f"new + {self.block} draft slots > context {self.context}")
        vocab = self.target.cfg.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise UserError(f"prompt token id outside the vocabulary (0..{vocab - 1})")

    # ----- steps (device only: no host sync, so they can be graph-captured) ------------------------
    def _ar_step(self) -> None:
        logits, _ = self.target(self.token[None], self.pos[None], self.cache, Mode.DECODE)
        greedy_advance(distort(logits[0, -1], self.fault), self.token, self.pos, pdl_default=self.gemv)
        self.pad()

    def _spec_step(self) -> None:
        drafter, target = self.drafter, self.target
        start, count = self.pos, self.ctx_count
        # The previous verify's rows 0..count-1 are committed: their features become draft context.
        ctx_pos = (start - count + self.rows).clamp(min=0)
        ctx_slots = torch.where(self.rows < count, ctx_pos, self.trash)
        drafter.write_context(self.ctx_feats, ctx_pos[None], ctx_slots[None], self.dcache)
        drafts = self._draft_chain(start)
        tokens = torch.cat([self.token, drafts])
        positions = (start + self.rows)[None]
        vis = Visibility(cache_len=start, start=start)  # a chain: causal among the new rows
        logits, feats = target(tokens[None], positions, self.cache, Mode.VERIFY, slots=positions, vis=vis,
                               hidden_layers=self.hidden_layers)
        accepted, committed = accept_greedy(drafts, distort(logits[0], self.fault))
        if self.fault == "unverified_accept":
            accepted, committed = force_first_draft(accepted, committed, drafts)
        self.step_out[0] = accepted
        self.step_out[1:] = committed
        self.ctx_feats.copy_(feats)
        self.ctx_count.copy_(accepted + 1)
        self.token.copy_(committed.gather(0, accepted.view(1)))
        self.pos.add_(accepted + 1)
        self.pad()

    def _draft_chain(self, start: torch.Tensor) -> torch.Tensor:
        """Stock drafting: the drafter's own greedy walk of its lattice, [block - 1] tokens."""
        block_in = torch.cat([self.token[None], self.masks], 1)
        hidden = self.drafter.draft_block(self.target.embed.weight, block_in, start, self.dcache)
        lattice = self.drafter.lattice(hidden, self.target.head_weight, self.token, top_k=16)
        return lattice.greedy_chain()[0]

    # ----- requests ---------------------------------------------------------------------------------
    def _prefill(self, prompt: list[int], with_hidden: bool) -> torch.Tensor | None:
        ids = torch.tensor([prompt], dtype=torch.int64, device=self.device)
        positions = torch.arange(len(prompt), device=self.device)[None]
        layers = self.hidden_layers if with_hidden else ()
        logits, hidden = self.target(ids, positions, self.cache, Mode.PREFILL, hidden_layers=layers)
        self.token.copy_(distort(logits[0, -1], self.fault).argmax(-1))
        self.pos.fill_(len(prompt))
        return hidden

    def _lookahead(self, result: torch.Tensor) -> Lookahead:
        key, depth = id(result), lookahead_depth()
        if key not in self._ahead or self._ahead[key].depth != depth:
            self._ahead[key] = Lookahead(result, depth)
        ahead = self._ahead[key]
        ahead.reset()
        return ahead

    def _prepare(self, step: StepGraph) -> None:
        """Capture a new graph from a known state (its warm-up runs advance the state, which is harmless
        here: the request's prefill resets it, and every slot a step reads was written this request)."""
        self.pos.zero_()
        self.token.zero_()
        if self.block:
            self.ctx_count.zero_()
        step.prepare()

    def warmup(self, system: System) -> None:
        """Capture the step graph outside any timed region (a throwaway request). With `gemv` on CUDA,
        first choose the one-row kernels' configs by timing the captured AR step (kernels/gemv/choice.py),
        beginning where kernels/gemv/starts.py has a table for this GPU."""
        self.generate([0] * 4, 2 * max(self.block, 1) + 2, (), system)
        if self.gemv and self.use_graphs and not self.gemv_tuning:
            self.gemv_tuning = self._tune_gemv()
            self.generate([0] * 4, 2 * max(self.block, 1) + 2, (), system)

    def _tune_gemv(self) -> dict:
        from specpilot.kernels.gemv.choice import tune_step
        from specpilot.kernels.gemv.starts import start_for

        def reset() -> None:  # a quarter of the context: the attention's split count depends on it
            self.pos.fill_(self.context // 4)

        with torch.inference_mode():
            reset()
            report = tune_step(self._ar_step, lambda step: replay_ms(step, reset),
                               start=start_for(torch.cuda.get_device_name(self.device)))
        for graph in (self._ar, getattr(self, "_spec", None)):
            if isinstance(graph, StepGraph):
                graph.graph = None  # recaptured with the chosen configs
        return report or {"note": "every kernel already had a config chosen in this process"}

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int, stop_ids: tuple[int, ...] | list[int],
                 system: System) -> Generation:
        self.check_request(prompt, max_new_tokens)
        spec = system.base == "stock"
        if spec and self.drafter is None:
            raise UserError("system 'stock' needs a drafter in the deployment")
        use_gemv(self.target, self.gemv)  # the target may be shared with engines of other systems
        self.target.fault = self.fault if self.fault in MODEL_FAULTS else "none"
        self._prepare(self._spec if spec else self._ar)
        _sync(self.device)
        t0 = time.perf_counter()
        hidden = self._prefill(prompt, with_hidden=spec)
        if spec:
            n = len(prompt)
            pos = torch.arange(n, device=self.device)[None]
            self.drafter.write_context(hidden.to(self.dcache.k.dtype), pos, pos, self.dcache)
            self.ctx_count.zero_()
        first = int(self.token.item())
        t1 = time.perf_counter()
        out, accepted = [first], []
        stops = set(stop_ids)
        step, result = (self._spec, self.step_out) if spec else (self._ar, self.token)
        ahead = self._lookahead(result) if self.use_graphs else None
        k = 0
        while first not in stops and len(out) < max_new_tokens:
            if ahead is None:
                step()
                values = result.tolist()
            else:
                if k == 0:
                    ahead.launch(step)
                # steps k + 1 .. k + depth may be needed (each commits a token at least): in flight while k is read
                while ahead.launched <= k + ahead.depth and len(out) + ahead.launched - k < max_new_tokens:
                    ahead.launch(step)
                values = ahead.read(k)
            k += 1
            new = values[1 : values[0] + 2] if spec else values
            accepted.append(len(new))
            out.extend(new)
            if stops.intersection(new):
                break
        # The last token is on the host now; a step launched ahead past a stop is not waited for here
        # (its writes lie past this request's positions and the next request's prefill resets the state).
        t2 = time.perf_counter()
        _sync(self.device)
        out = _cut(out, stops, max_new_tokens)
        if accepted:  # the last pass may have committed past a stop or the budget: count what was kept
            accepted[-1] = len(out) - 1 - sum(accepted[:-1])
        return Generation(tokens=out, prefill_s=t1 - t0, decode_s=t2 - t1, accepted=accepted)


def _cut(tokens: list[int], stops: set[int], limit: int) -> list[int]:
    for i, t in enumerate(tokens[:limit]):
        if t in stops:
            return tokens[: i + 1]
    return tokens[:limit]
