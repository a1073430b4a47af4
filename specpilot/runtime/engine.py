"""Generation loops: AR greedy decoding and speculative decoding, one request at a time.

An Engine is one system (config/system.py) on one target (+ drafter) and one context size: it owns the
caches, the kernel plan (with the tuning table its warm-up fills) and the step graphs. AR and the
speculative step share the target's kernels, precision, static caches and (on CUDA) graph capture: an AR
baseline that runs eagerly would flatter every speedup. Each decode step is one graph replay and one host
sync that reads the step's committed tokens; with graphs the next `lookahead` steps are already enqueued
while the host waits (runtime/graphs.Lookahead), so the host's read and launch never leave the GPU idle.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from functools import partial

import torch

from specpilot.config import System, parse_system
from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Forward, Generation, Prompted, Sampling
from specpilot.core.regions import region
from specpilot.errors import UserError
from specpilot.kernels.dispatch import fix_triton_interpreter, interpreting
from specpilot.kernels.greedy import greedy_advance
from specpilot.kernels.sample import SamplerRows, pick
from specpilot.kernels.tuning import store as tuning_store
from specpilot.models.dense import DenseTarget, Mode
from specpilot.models.dflash import DFlashDrafter
from specpilot.models.eagle3 import Eagle3Drafter
from specpilot.runtime.faults import distort, faulty
from specpilot.runtime.graphs import Lookahead, StepGraph, replay_ms
from specpilot.runtime.padding import Pad
from specpilot.runtime.scheduler import batch_sizes
from specpilot.speculative.admit import Admission
from specpilot.speculative.drafter import DFlash
from specpilot.speculative.eagle3 import RELEASE_NODES, Eagle3
from specpilot.speculative.sequoia import parse_accept
from specpilot.speculative.step import AnchorStep, SpecState, SpecStep
from specpilot.speculative.tree import TreeBuilder, max_nodes
from specpilot.speculative.two_level import TwoLevelStep
from specpilot.w12.attach import attach, claim, off_kernel
from specpilot.weights import fp8, fp8_attach
from specpilot.weights.dense import few_row_path


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Engine:
    """One system's caches, plan and step graphs for one target (+ drafter) and one context size.

    system: the configuration (default: stock with a drafter, else AR); plan: a kernel plan to use instead of
    a fresh one from the system's options (engines whose plans agree may share one, and so its tuning); slots:
    requests in flight (a cache row each; past 1, generate() batches them: runtime/batch.py)."""

    def __init__(self, target: DenseTarget, drafter: DFlashDrafter | None = None, system: System | None = None, *,
                 context: int, plan: KernelPlan | None = None, slots: int = 1):
        self.system = system or parse_system("stock" if drafter is not None else "ar")
        if self.system.speculative and drafter is None:
            raise UserError(f"system {self.system.name!r} needs a drafter in the deployment")
        self.target, self.drafter = target, drafter
        self.device = target.device
        self.context = context
        self.plan = plan if plan is not None else self.system.plan()
        if plan is not None and plan.features() != self.system.plan().features():
            raise ValueError("the plan given to the engine is not its system's")
        if self.plan.kernels == "triton" and self.device.type != "cuda":  # Triton on the CPU: its interpreter
            if not interpreting():
                raise UserError(f"system {self.system.name!r}: kernels=triton needs a CUDA device here (or Triton's "
                                "CPU interpreter: TRITON_INTERPRET=1, slow)")
            fix_triton_interpreter()  # every Triton kernel's loops run under it
        self.fault = self.system.get("fault")
        self.forward = faulty(target, self.fault)  # the target's forward, as a model-level fault changes it
        if self.fault in ("unverified_accept", "rare_unverified") and drafter is None:
            raise UserError(f"fault {self.fault} needs a drafter (system stock)")
        self.use_graphs = self.system.get("graphs") and self.device.type == "cuda"
        self.w12_report = None
        self.fp8_report = None
        # where weights=w12 / fewrow=true products run (checked before any W12 form is made)
        path = few_row_path(self.plan, self.device, target.embed.weight.dtype, self.system.get("verify") == "tlv")
        for form in ("w12", "fp8"):
            if getattr(self.plan, f"{form}_dense") == "drop" and self.plan.weights != form:
                raise UserError(f"system {self.system.name!r}: {form}_dense=drop needs weights={form} (it frees the "
                                f"BF16 copies that the {form.upper()} forms replace)")
        drops = "drop" in (self.plan.w12_dense, self.plan.fp8_dense)
        claim(target, self, drops)  # no system here reads copies another one freed
        if self.plan.weights == "w12" or self.system.get("verify") == "tlv":
            # the projections' W12 forms (tlv reads their 8-bit view), made and checked once per target; under
            # w12_dense=drop the layers' dense copies freed as they go
            self.w12_report = attach(target, drop=drops)
            self._need_w12_forms()
        if self.plan.weights == "fp8":
            # the layers' FP8 forms, quantized once per target from its weights (weights/fp8.py); under
            # fp8_dense=drop the dense copies freed as they go
            self.fp8_report = {**fp8_attach.attach(target, drop=drops),
                               "path": fp8.path(self.device, target.embed.weight.dtype)}
        self.kernel_record = None if path is None else self._kernel_record(path)
        self.lookahead = self.system.get("lookahead")
        # seam[options]: the engine's options are read
        self.pad = Pad(self.system.get("pad_us"), self.device)
        self.recorder = None  # replay/record.Recorder: each speculative step's lattice (steps run one by one)
        self.tuning: dict = {}  # the step tuning's report (kernels/tuning/descent.py), once it ran
        self._ahead: dict[int, Lookahead] = {}  # pinned read-back buffers by step output (CUDA graphs)
        if target.rope.length < context + 1:
            target.set_rope_length(context + 1, device=self.device)
        if slots < 1:
            raise UserError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self.cache = target.new_cache(slots, context)
        self._recurrent = "gdn" in target.cfg.kinds  # a hybrid target: every step commits its rows
        self._one_row = torch.zeros(1, 1, dtype=torch.int64, device=self.device)  # an AR step's path: its row
        self.pos = torch.zeros(slots, dtype=torch.int64, device=self.device)
        self.token = torch.zeros(slots, dtype=torch.int64, device=self.device)
        # which slots hold a decoding request (batches only: a parked slot's position and context stay put)
        self.live = torch.zeros(slots, dtype=torch.int64, device=self.device) if slots > 1 else None
        self.sampler = SamplerRows.zeros(slots, self.device)  # each slot's sampling (its request's)
        self.sampling = False  # whether the steps sample (sample_as)
        self._ar = StepGraph(self._ar_step, self.use_graphs)
        # batches: a step graph per batch size n (runtime/scheduler.batch_sizes), over slots 0..n-1, and per kind
        # (greedy, or sampling where any row samples), all of one memory pool
        self.sizes = batch_sizes(slots) if slots > 1 else ()
        self._variants = [(n, sampled) for n in self.sizes for sampled in (False, True)]
        pool = torch.cuda.graph_pool_handle() if self.use_graphs and self.sizes else None
        self._views = {n: (self.cache.rows(0, n), self.sampler.rows(0, n)) for n in self.sizes}
        self._ar_batch = {v: StepGraph(partial(self._ar_rows, *v), self.use_graphs, pool) for v in self._variants}
        self._spec_batch: dict[tuple[int, bool], StepGraph] = {}
        # batch_rows=auto (batches only): the narrower steps' graphs by (rows, batch size, sampling), the costs of
        # every width by kind (timed once: runtime/batch.py) and the steps each width ran
        self._width_batch: dict[int, dict[tuple[int, bool], StepGraph]] = {}  # rows -> (size, sampling) -> graph
        self.step_costs: dict[bool, dict[int, dict[int, float]]] = {}
        self.step_rows: dict[int, int] = {}
        self.full_rows = 0
        self._widths: tuple[int, ...] = ()  # batch_rows=auto's narrower widths (rows a request)
        self.admission: Admission | None = None  # admit=true: the prompt chunks the next admitting step carries
        self.admit_chunk = 0  # admit=true: prompt tokens a slot's chunk holds at most
        self._admit_batch: dict[tuple[int, bool], StepGraph] = {}
        self._pool = pool
        self.requests = 0  # requests begun on this engine (a snapshot holds only until the next one)
        self.timing_state = None  # ceiling/run.step_seconds: (its request, a snapshot) to time from again
        self.block = self.rows = self.width = 0  # width: the drafter's lattice candidates per position
        self.builder = None
        if drafter is not None:
            self._init_spec(drafter, self.system.get("block_size") if self.system.speculative else 0)

    # ----- set-up ---------------------------------------------------------------------------------
    def _need_w12_forms(self) -> None:
        """weights=w12 and verify=tlv read the projections' W12 forms, which only BF16 values get (w12/attach.py):
        on a model where none has one (float32 weights, as the CPU's SmolLM2 or `tiny`) both would silently run
        the exact weights, and tlv's 8-bit pass would be a second exact pass. Refused: the user's to fix."""
        if any(row["stored"] == "w12" for row in self.w12_report["tensors"]):
            return
        asked = [name for name, on in (("weights=w12", self.plan.weights == "w12"),
                                       ("verify=tlv", self.system.get("verify") == "tlv")) if on]
        why = next(iter(self.w12_report["kept_bf16"].values()), "it has no projections")
        silently = ("verify=tlv's 8-bit pass would silently run the exact weights" if "verify=tlv" in asked else
                    "it would silently run the exact weights")
        raise UserError(f"system {self.system.name!r}: {' and '.join(asked)} {'reads' if len(asked) == 1 else 'read'}"
                        f" the projections' W12 forms, which only BF16 weights get, and this model has none ({why}): "
                        f"{silently} (serve the model in bfloat16, the deployment's dtype, or drop the option)")

    def _kernel_record(self, path: str) -> dict:
        """The path weights=w12 / fewrow=true / verify=tlv run on, and (on a GPU, for the first two) the projections
        that take the dense path."""
        if self.device.type != "cuda" or (self.plan.weights != "w12" and not self.plan.fewrow):
            return {"path": path}  # (tlv alone: its exact pass is meant to take the dense path)
        kept = self.w12_report["kept_bf16"] if self.w12_report is not None else {}
        return {"path": path, "dense_path": off_kernel(self.target, self.plan, kept)}

    def _init_spec(self, drafter: DFlashDrafter | Eagle3Drafter, block_size: int) -> None:
        if isinstance(drafter, Eagle3Drafter):  # a drafter of the other kind: its own cache and tree
            self.draft = Eagle3(drafter, self.target.embed, self.context, block_size, self.plan, self.slots)
        else:
            self.draft = DFlash(drafter, self.target.embed, self.target.head, self.context, block_size, self.plan,
                                self.target.cfg.vocab_size, self.slots)
        self.block, self.width = self.draft.block, self.draft.width
        self.builder = self._builder()
        rows = self.builder.rows if self.builder is not None else self.block  # one round's rows
        tlv = self.system.get("verify") == "tlv"
        paths = 2 * self.block if tlv else self.block  # the longest committed path (two rounds' with tlv)
        feats = len(self.draft.taps) * self.target.cfg.hidden_size
        dev, dtype = self.device, self.draft.dtype
        n = self.slots
        self.state = SpecState(token=self.token, pos=self.pos,
                               ctx_feats=torch.zeros(n, paths, feats, dtype=dtype, device=dev),
                               ctx_count=torch.zeros(n, dtype=torch.int64, device=dev),
                               out=torch.zeros(n, 1 + paths, dtype=torch.int64, device=dev), live=self.live,
                               sampler=self.sampler, ctx_tokens=torch.zeros(n, paths, dtype=torch.int64, device=dev))
        self.rows = 2 * rows if tlv else rows  # slots a step writes past pos
        args = (self.target, self.draft, self.cache, self.state, self.plan, self.fault, self.builder, self.forward)
        make = (lambda *a, **kw: TwoLevelStep(*a, rows=rows, path=self.block)) if tlv else SpecStep
        self.spec = make(*args)
        budget = self._budget(tlv)
        self._widths = widths = self._batch_widths(tlv)
        shares = self._shares(widths)
        if shares:  # the budgets' expected tokens, written by every tree step (runtime/batch.py reads them)
            self.state.expect = torch.zeros(len(shares), dtype=torch.float32, device=dev)
        self._spec = StepGraph(self._spec_step, self.use_graphs)
        self._spec_steps = {(n, sampled): make(self.target, self.draft.rows(0, n), self._views[n][0],
                                               self.state.rows(n), *args[4:], budget=budget(n),
                                               offers=self.offers(n) if shares else ())
                            for n, sampled in self._variants}
        for (_, sampled), step in self._spec_steps.items():
            step.sampling = sampled
        self._spec_batch = {v: StepGraph(partial(self._spec_rows, v), self.use_graphs, self._pool)
                            for v in self._variants}
        self.full_rows = self.rows  # (two-level verification: both rounds, all a step may commit)
        self._width_steps = {(w, n, sampled): self._narrower(w, n, sampled, args)
                             for w in widths for n, sampled in self._variants}
        if self._admits(tlv):  # admit=true: each step again, its verify pass carrying prompt chunks
            self.admission = Admission.zeros(self.slots, rows, dev)
            # a chunk is a path the caches keep whole: a recurrent state's commit takes a path of a block at most
            self.admit_chunk = self.block if self._recurrent else rows
            # a step carrying chunks verifies every row of every decoding request (no budget; under
            # batch_rows=auto it is the full step, its budgets' expectations written as the full step's are)
            self._admit_steps = {(n, sampled): SpecStep(self.target, self.draft.rows(0, n), self._views[n][0],
                                                        self.state.rows(n), *args[4:],
                                                        offers=self.offers(n) if shares else (),
                                                        admission=self.admission.rows(n))
                                 for n, sampled in self._variants}
            for (_, sampled), step in self._admit_steps.items():
                step.sampling = sampled
            self._admit_batch = {v: StepGraph(partial(self._admit_rows, v), self.use_graphs, self._pool)
                                 for v in self._variants}
        for w, n, sampled in self._width_steps:
            self._width_batch.setdefault(w, {})[n, sampled] = StepGraph(partial(self._width_rows, (w, n, sampled)),
                                                                        self.use_graphs, self._pool)
        # results record what ran: the drafter's block, not "0"
        own = {"nodes": self.system.get("nodes") or self.block} if self.builder is None else {
            "tree": self.builder.builder, "nodes": self.builder.rows, "tree_k": self.builder.k}
        self.system = self.system.resolving(block_size=self.block, **own)

    def _budget(self, tlv: bool):
        """batch_budget's rows at each batch size n (0: none): the option's, within n (a root each) and n x nodes."""
        budget = self.system.get("batch_budget") if self.system.speculative else 0
        if budget and (tlv or self.builder is not None and self.builder.builder not in ("best_first", "ddtree")):
            raise UserError(f"system {self.system.name!r}: batch_budget shares a batch's rows by the drafts' path "
                            "scores: it needs stock's chain, tree=best_first or tree=ddtree (rows in score order), "
                            "without verify=tlv")
        if budget and self.system.get("batch_rows") == "auto":
            raise UserError(f"system {self.system.name!r}: batch_budget and batch_rows=auto both set a step's rows: "
                            "choose one")
        rows = self.block if self.builder is None else self.builder.rows
        return lambda n: max(n, min(budget, n * rows)) if budget else 0

    def _admits(self, tlv: bool) -> bool:
        """Whether batch steps carry prompt chunks (admit=true); what it cannot go with is refused."""
        if not (self.system.speculative and self.system.get("admit") and self.sizes):
            return False
        if tlv:
            raise UserError(f"system {self.system.name!r}: admit=true carries prompt chunks in a step's one round of "
                            "rows: not with verify=tlv")
        return True

    def _batch_widths(self, tlv: bool) -> tuple[int, ...]:
        """batch_rows=auto's steps below the full one, by rows a request: 1 (the anchor alone); 4 and 8 for a chain;
        budgets of 2, 4 and 8 rows a request on average for a tree in score order (best_first, ddtree), shared by
        the requests' likeliest nodes (speculative/budget.py)."""
        if not (self.system.speculative and self.system.get("batch_rows") == "auto" and self.sizes):
            return ()
        if tlv:
            return (1,)
        if self.builder is None:
            return (1, *(w for w in (4, 8) if w < self.block))
        shared = self.builder.builder in ("best_first", "ddtree")
        return (1, *(w for w in (2, 4, 8) if shared and w < self.builder.rows))

    def _shares(self, widths: tuple[int, ...]) -> tuple[int, ...]:
        """The widths above the anchor whose steps share a budget (a tree in score order; the full rows last)."""
        if self.builder is None or self.builder.builder not in ("best_first", "ddtree") or max(widths, default=1) < 2:
            return ()
        return (*(w for w in widths if w > 1), self.builder.rows)

    @property
    def shares(self) -> tuple[int, ...]:
        """batch_rows=auto's widths whose steps share a budget, in state.expect's order (runtime/batch.py)."""
        return self._shares(self._widths)

    def offers(self, n: int) -> tuple[int, ...]:
        """The rows in all of each shared width's step at batch size n."""
        return tuple(w * n for w in self.shares)

    def _narrower(self, rows: int, n: int, sampled: bool, args: tuple) -> SpecStep:
        """A batch step of slots 0..n-1 verifying `rows` rows a request: the anchor step, a shorter chain (the
        drafter drafting a shorter block), or a budget of rows x n shared by the requests' trees; the full step's
        state and drafter context rows."""
        cache, state = self._views[n][0], self.state.rows(n)
        if rows == 1:
            step = AnchorStep(self.target, self.draft.rows(0, n), cache, state, *args[4:], ctx_rows=self.spec.ctx_rows)
        elif self.builder is not None:
            step = SpecStep(self.target, self.draft.rows(0, n), cache, state, self.plan, self.fault, self.builder,
                            self.forward, ctx_rows=self.spec.ctx_rows, budget=rows * n, offers=self.offers(n))
        else:
            step = SpecStep(self.target, self.draft.narrowed(rows).rows(0, n), cache, state, self.plan, self.fault,
                            None, self.forward, ctx_rows=self.spec.ctx_rows)
        step.sampling = sampled
        return step

    @property
    def tree(self) -> tuple[str, int, int]:
        """(builder, rows, k) this engine runs, whatever the options say: stock's chain is ("chain", its rows,
        tree_k); an EAGLE-3 drafter's stock (tree=chain, nodes=0) is its release's eagle2 tree."""
        b = self.builder
        return (b.builder, b.rows, b.k) if b is not None else ("chain", self.rows, self.system.get("tree_k"))

    def _builder(self) -> TreeBuilder | None:
        """The system's tree builder (None: stock's chain at the block size, the released behaviour)."""
        name, nodes, k = self.system.get("tree"), self.system.get("nodes"), self.system.get("tree_k")
        if name == "chain" and nodes == 0 and isinstance(self.draft, Eagle3):  # EAGLE-3's stock: its release's tree
            name, k = "eagle2", self.draft.frontier
            nodes = min(RELEASE_NODES, max_nodes(name, self.block - 1, self.width, k))  # a small draft vocabulary
        elif name == "chain" and nodes in (0, self.block):
            return None
        if name == "eagle2" and k > self.width:  # the builder would keep fewer per depth than the name says
            raise UserError(f"system {self.system.name!r}: tree_k={k} exceeds the drafter's {self.width} candidates "
                            "per position")
        try:
            accept = parse_accept(self.system.get("tree_accept"))
            return TreeBuilder(name, nodes or self.block, self.block - 1, self.width, k, accept, self.plan)
        except ValueError as exc:
            raise UserError(f"system {self.system.name!r}: {exc}") from None

    def check_request(self, prompt: list[int], max_new_tokens: int) -> None:
        if not prompt:
            raise UserError("empty prompt: a request needs at least one token")
        if max_new_tokens <= 0:
            raise UserError(f"max_new_tokens must be positive, got {max_new_tokens}")
        if len(prompt) + max_new_tokens + self.rows > self.context:
            rows = f", or verify fewer rows a step: {self._rows_option()}" if self.rows else ""
            raise UserError(f"does not fit the context: {len(prompt)} prompt tokens + {max_new_tokens} new + "
                            f"{self.rows} draft slots > {self.context} (raise the deployment's `context`, lower "
                            f"max_new_tokens{rows})")
        vocab = self.target.cfg.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise UserError(f"prompt token id outside the vocabulary (0..{vocab - 1})")

    # ----- steps (device only: no host sync, so they can be graph-captured) ------------------------
    def _ar_step(self) -> None:
        logits, _ = self.forward(self.token[None], Forward.consecutive(self.pos[None]), self.cache, Mode.DECODE,
                                 self.plan)
        if self._recurrent:  # the row is kept: a recurrent layer's state moves past it
            self.cache.commit(self._one_row, self._one_row[:, 0], self.pos, in_place=True)
        if self.sampling:  # the next token sits one past the row's position
            self.token.copy_(pick(distort(logits[:, -1:], self.fault), self.pos[:, None] + 1, self.sampler)[:, 0])
            self.pos.add_(1)
        else:
            greedy_advance(distort(logits[0, -1], self.fault), self.token, self.pos, self.plan)
        self.pad()

    def _ar_rows(self, n: int, sampled: bool) -> None:
        """The AR step of slots 0..n-1 at once (batches): each row at its own position; parked rows keep their
        token and position. sampled: rows sample as their sampler says (temperature 0: the argmax)."""
        cache, sampler = self._views[n]
        token, pos, live = self.token[:n], self.pos[:n], self.live[:n]
        logits, _ = self.forward(token[:, None], Forward.consecutive(pos[:, None]), cache, Mode.DECODE, self.plan)
        if self._recurrent:  # the live rows are kept (a parked row's recurrent state stays)
            rows = self._one_row.expand(n, 1)
            cache.commit(rows, rows[:, 0], pos, in_place=True, live=live)
        logits = distort(logits[:, -1:], self.fault)
        nxt = pick(logits, pos[:, None] + 1, sampler)[:, 0] if sampled else logits[:, 0].argmax(-1)
        token.copy_(torch.where(live.bool(), nxt, token))
        pos.add_(live)
        self.pad()

    def _spec_step(self) -> None:
        self.spec()
        self.pad()

    def _spec_rows(self, variant: tuple[int, bool]) -> None:
        """The speculative step of slots 0..n-1 (batches), greedy or sampling."""
        self._spec_steps[variant]()
        self.pad()

    def _admit_rows(self, variant: tuple[int, bool]) -> None:
        """The speculative step of slots 0..n-1 carrying prompt chunks (admit=true)."""
        self._admit_steps[variant]()
        self.pad()

    def admit_steps(self) -> dict[tuple[int, bool], StepGraph]:
        """admit=true's step graphs by (batch size, sampling); empty when off."""
        return self._admit_batch

    def _width_rows(self, key: tuple[int, int, bool]) -> None:
        """A narrower step (rows, batch size, sampling) of slots 0..n-1 (batch_rows=auto)."""
        self._width_steps[key]()
        self.pad()

    def batch_steps(self, spec: bool) -> dict[tuple[int, bool], StepGraph]:
        """The step graph of each (batch size, sampling) (slots > 1), AR's or the speculative one."""
        return self._spec_batch if spec else self._ar_batch

    def width_steps(self) -> dict[int, dict[tuple[int, bool], StepGraph]]:
        """batch_rows=auto's narrower step graphs: rows -> (batch size, sampling) -> graph; empty when fixed."""
        return self._width_batch

    def _graphs(self) -> list[StepGraph]:
        return [self._ar, *self._ar_batch.values(), *self._spec_batch.values(), *self._admit_batch.values(),
                *(g for graphs in self._width_batch.values() for g in graphs.values())] + (
            [self._spec] if self.block else [])

    # ----- a decode state kept for repeated step timings ---------------------------------------------
    def _live(self) -> list[torch.Tensor]:
        """What a step reads besides the caches below pos: the caches there stay as the request left them until
        the next request begins, and a step writes (the same values, from the same state) only at and past pos."""
        spec = [self.state.ctx_feats, self.state.ctx_count, self.state.out, *self.draft.live()] if self.block else []
        return [self.pos, self.token, *spec]

    def snapshot(self) -> tuple[int, list[torch.Tensor]]:
        return self.requests, [t.clone() for t in self._live()]

    def restore(self, snap: tuple[int, list[torch.Tensor]]) -> bool:
        """Back to the snapshot's state; False (nothing done) when a request began since it was taken."""
        if snap[0] != self.requests:
            return False
        for live, kept in zip(self._live(), snap[1], strict=True):
            live.copy_(kept)
        return True

    # ----- requests ---------------------------------------------------------------------------------
    def _prefill(self, prompt: list[int], with_hidden: bool) -> torch.Tensor | None:
        ids = torch.tensor([prompt], dtype=torch.int64, device=self.device)
        positions = torch.arange(len(prompt), device=self.device)[None]
        layers = self.spec.hidden_layers if with_hidden else ()
        logits, hidden = self.forward(ids, Forward.consecutive(positions), self.cache, Mode.PREFILL, self.plan,
                                      layers)
        self.token.copy_(self.first_token(logits, len(prompt)))
        # seam[first-token]: the prefill's token is in self.token (its logits in `logits`)
        self.pos.fill_(len(prompt))
        return hidden

    def first_token(self, logits: torch.Tensor, n: int, row: int = 0, sampled: bool | None = None) -> torch.Tensor:
        """The token after a prompt of n tokens, from its prefill's last logits (row: the request's slot; sampled:
        whether it samples, default as the steps do)."""
        last = distort(logits[:, -1:], self.fault)
        if not (self.sampling if sampled is None else sampled):
            return last[0, 0].argmax(-1)
        return pick(last, torch.full((1, 1), n, dtype=torch.int64, device=last.device), self.sampler.row(row))[0, 0]

    def sample_as(self, requests: list[Prompted]) -> None:
        """Steps that sample where any request samples, that take the argmax where none does (static: a change
        recaptures the step graphs)."""
        on = any(r.samples for r in requests)
        if on != self.sampling:
            self.sampling = on
            if self.block:
                self.spec.sampling = on
            for graph in (self._ar, getattr(self, "_spec", None)):  # (the batches capture each kind apart)
                if graph is not None:
                    graph.graph = None

    def _lookahead(self, result: torch.Tensor) -> Lookahead:
        key = id(result)
        if key not in self._ahead or self._ahead[key].depth != self.lookahead:
            self._ahead[key] = Lookahead(result, self.lookahead)
        ahead = self._ahead[key]
        ahead.reset()
        return ahead

    def _prepare(self, step: StepGraph) -> None:
        """Capture a new graph from a known state (its warm-up runs advance the state, which is harmless
        here: the request's prefill resets it, and every slot a step reads was written this request)."""
        self.pos.zero_()
        self.token.zero_()
        if self.block:
            self.state.ctx_count.zero_()
        step.prepare()

    def _rows_option(self) -> str:
        return "`nodes`" + (" (verify=tlv doubles the slots)" if self.system.get("verify") == "tlv" else "")

    def warmup(self) -> None:
        """Capture the step graphs outside any timed region (throwaway requests). With `gemv` on CUDA, first
        choose the one-row kernels' configs by timing the captured AR step (kernels/tuning), beginning where
        kernels/tuning/starts.py has a table for this GPU (unless the plan's `tune_start` is off)."""
        new = 2 * max(self.block, 1) + 2
        if 4 + new + self.rows > self.context:  # said of the system, not of the throwaway request
            raise UserError(f"system {self.system.name!r}: {self.rows} draft slots a step leave no room in the "
                            f"context of {self.context} (raise the deployment's `context`, or verify fewer rows "
                            f"a step: {self._rows_option()})")
        self.generate_one([0] * 4, new)
        if self.plan.gemv and self.use_graphs and not self.tuning:
            self.tuning = self._tune_gemv()
            self.generate_one([0] * 4, new)

    def _tune_gemv(self) -> dict:
        from specpilot.kernels.tuning.descent import tune_step
        from specpilot.kernels.tuning.starts import start_for

        def reset() -> None:  # a quarter of the context: the attention's split count depends on it
            self.pos.fill_(self.context // 4)

        device = torch.cuda.get_device_name(self.device)
        start = start_for(device) if self.plan.tune_start else {}
        what = {"target": repr(self.target.cfg), "dtype": str(self.target.embed.weight.dtype), "context": self.context}
        name = tuning_store.entry_name(device, self.plan, what) if self.plan.tune_store else None
        with torch.inference_mode():
            reset()
            report = self._stored(name) if name else None
            if report is None:
                reset()
                report = tune_step(self._ar_step, lambda step: replay_ms(step, reset), self.plan, start=start)
                if name:
                    reset()
                    keys, chosen = self.plan.table.record(self._ar_step), self.plan.table.chosen
                    if all(k in chosen for k in keys):
                        tuning_store.save(name, {k: chosen[k] for k in keys}, device)
        for graph in self._graphs():
            graph.graph = None  # recaptured with the chosen configs
        return report or {"note": "every kernel already had a config chosen in this plan's table"}

    def _stored(self, name: str) -> dict | None:
        """The choices an earlier tuning of this step kept under `name` (kernels/tuning/store.py), put in the plan's
        table (keys it holds already keep theirs) if they cover every key the step launches: the tuning's report
        then names the entry. None: the step is to be tuned (the table as it was)."""
        stored = tuning_store.load(name)
        if stored is None:
            return None
        table = self.plan.table.chosen
        added = {k: v for k, v in stored.items() if k not in table}
        table.update(added)
        keys = self.plan.table.record(self._ar_step)  # an eager run: every stored key launches its config
        if any(k not in table for k in keys):
            for k in added:
                del table[k]
            return None
        return {"store": str(tuning_store.ROOT / name), "keys": len(keys)}

    def generate(self, requests: list[Prompted], base: str | None = None, arrivals: list[int] | None = None
                 ) -> list[Generation]:
        """The engine's one call: each request's Generation, timed. base: `ar` runs greedy decoding on this
        engine's caches and plan (AR is every system's reference), `stock` the speculative step; default: the
        system's own. One slot: one request at a time, each timed alone. More: continuous batching
        (runtime/batch.py), `arrivals` the step at which each request may start (default: all at once)."""
        if self.slots > 1:
            from specpilot.runtime.batch import run_batch

            return run_batch(self, requests, base, arrivals)
        gens = []
        for r in requests:
            self.sample_as([r])
            self.sampler.set(0, r.sampling)
            gens.append(self._generate(r.prompt, r.max_new_tokens, r.stop_ids, base))
        return gens

    def generate_one(self, prompt: list[int], max_new_tokens: int, stop_ids: tuple[int, ...] | list[int] = (),
                     base: str | None = None, sampling: Sampling | None = None) -> Generation:
        """generate() of one request (scripts and tests)."""
        return self.generate([Prompted(prompt, max_new_tokens, tuple(stop_ids), sampling)], base)[0]

    def _generate(self, prompt: list[int], max_new_tokens: int, stop_ids: tuple[int, ...],
                  base: str | None) -> Generation:
        # seam[request]: a request (prompt, max_new_tokens, stop_ids, base) begins
        steps = self.steps(prompt, max_new_tokens, stop_ids, base)
        _sync(self.device)
        t0 = time.perf_counter()
        next(steps)  # the prefill, its first token on the host
        t1 = time.perf_counter()
        gen = drain(steps)
        # The last token is on the host now; a step launched ahead past a stop is not waited for here
        # (its writes lie past this request's positions and the next request's prefill resets the state).
        t2 = time.perf_counter()
        _sync(self.device)
        gen.prefill_s, gen.decode_s = t1 - t0, t2 - t1
        # seam[generated]: the request's Generation `gen`, timed
        return gen

    @torch.inference_mode()
    def steps(self, prompt: list[int], max_new_tokens: int, stop_ids: tuple[int, ...] | list[int] = (),
              base: str | None = None, tokens: bool = False) -> Generator[int | list[int], None, Generation]:
        """generate() one step at a time, untimed: the request is checked and the step prepared (graphs
        captured) now; the generator yields the number of tokens produced so far (tokens: the tokens) after the
        prefill and after every decode step's host read, and returns the Generation (times 0). Two engines'
        requests can so advance in lockstep (the controller's timing on a CPU whose speed drifts); an answer can
        be streamed."""
        if self.slots > 1:
            raise UserError(f"an engine of {self.slots} slots serves its requests together: use generate()")
        self.check_request(prompt, max_new_tokens)
        self.requests += 1
        spec = (base or self.system.base) == "stock"
        if spec and self.drafter is None:
            raise UserError("system 'stock' needs a drafter in the deployment")
        self._prepare(self._spec if spec else self._ar)
        return self._steps(prompt, max_new_tokens, stop_ids, spec, tokens)

    @torch.inference_mode()
    def _steps(self, prompt: list[int], max_new_tokens: int, stop_ids, spec: bool, tokens: bool = False
               ) -> Generator[int | list[int], None, Generation]:
        with region("prefill"):
            hidden = self._prefill(prompt, with_hidden=spec)
            if spec:
                self.draft.prefill(hidden, tokens=torch.tensor([prompt], dtype=torch.int64, device=self.device))
                self.state.ctx_count.zero_()
        first = int(self.token.item())
        yield [first] if tokens else 1
        with region("decode"):  # every decode kernel inside a range: the profile links each launch to one
            out, accepted = yield from self._decode(first, spec, max_new_tokens, set(stop_ids), tokens)
        out = Prompted(prompt, max_new_tokens, tuple(stop_ids)).cut(out)
        if accepted:  # the last pass may have committed past a stop or the budget: count what was kept
            accepted[-1] = len(out) - 1 - sum(accepted[:-1])
        return Generation(tokens=out, prefill_s=0.0, decode_s=0.0, accepted=accepted)

    def _decode(self, first: int, spec: bool, max_new_tokens: int, stops: set[int], tokens: bool = False
                ) -> Generator[int | list[int], None, tuple[list[int], list[int]]]:
        """The decode loop: one step (graph replay) and one host read per step, `lookahead` steps in flight;
        yields the tokens produced after each read."""
        out, accepted = [first], []
        step, result = (self._spec, self.state.out) if spec else (self._ar, self.token)
        record = self.recorder if spec else None
        ahead = self._lookahead(result) if self.use_graphs and record is None else None
        if record is not None:
            record.begin()
        k = 0
        while first not in stops and len(out) < max_new_tokens:
            if ahead is None:
                start = int(self.pos.item()) if record is not None else 0
                step()
                values = result.tolist()
                if record is not None:
                    record.step(start, self.spec.proposer.last)
            else:
                if k == 0:
                    ahead.launch(step)
                # steps k + 1 .. k + depth may be needed (each commits a token at least): in flight while k is read
                while ahead.launched <= k + ahead.depth and len(out) + ahead.launched - k < max_new_tokens:
                    ahead.launch(step)
                values = ahead.read(k)
            k += 1
            new = values[0][1 : values[0][0] + 2] if spec else values
            accepted.append(len(new))
            out.extend(new)
            if stops.intersection(new):
                break
            # seam[step]: a step's tokens are read (`out`, k steps; `step`/`result` run the next, `spec` says which)
            yield list(out) if tokens else len(out)
        return out, accepted


# seam[module]: module-level names


def drain(steps: Generator[int, None, Generation]) -> Generation:
    """Run a step generator to its end; its Generation."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
