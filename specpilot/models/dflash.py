"""DFlash-style parallel block drafter (with the optional DFlash2 conv and candidate selector, or DSpark's Markov
and confidence heads).

One forward drafts a whole block: the block is [last committed token, mask x (B-1)], its queries see
the projected target hidden states of every committed position (kept as this drafter's own K/V cache,
one K/V per draft layer) and the whole block. The target's embedding and LM head are borrowed as the
target's weight objects (specpilot/weights). The output is a `Lattice`: top-K candidates per draft position
and parent-conditioned edge scores. Every call takes the kernel plan it runs under.

DSpark (DeepSpec) drafts from every slot of the block, the anchor's too, and adds to slot k's logits a bias from the
token before it, W2 W1[x_{k-1}] (rank r). Its drafts are sequential: slot k's candidates are the top-K of its
logits biased by the drafter's own pick at k-1 (the anchor at 0), so the lattice's greedy walk through its edges
(unary + the bias from each parent) is DSpark's own greedy chain, and a tree builder sees every parent's bias.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specpilot.config.plan import KernelPlan
from specpilot.core.contracts import Lattice, Visibility
from specpilot.core.regions import region
from specpilot.kernels.norm import rms_norm
from specpilot.models.cache import Cache
from specpilot.models.config import DrafterConfig
from specpilot.models.layers import Attention, RopeTable, SwiGLU, run_layers
from specpilot.weights import DenseWeight


class DynamicConv(nn.Module):
    """DFlash2's grouped dynamic causal conv over the block: a learned base kernel plus a per-token
    kernel predicted from the input, applied before (`prepare`) and after (`finish`) a sublayer."""

    def __init__(self, hidden: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel_size * self.groups, bias=False)

    def _convolve(self, x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        blocks = x.view(b, t, self.groups, self.group_size)
        out = torch.zeros_like(blocks)
        for offset in range(self.kernel_size):
            shifted = F.pad(blocks[:, : t - offset], (0, 0, 0, 0, offset, 0)) if offset else blocks
            weight = base[offset].view(self.groups, self.group_size).to(x.dtype) + dynamic[:, :, offset, :, None]
            out = out + weight * shifted
        return out.view(b, t, h)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dyn = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, self.groups)
        return self._convolve(x, dyn[..., 0, :, :], self.base_kernel[0]), dyn[..., 1, :, :]

    def finish(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return self._convolve(x, dynamic, self.base_kernel[1])


class DraftBlock(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        lc = cfg.layer
        self.attn_norm = nn.Parameter(torch.ones(lc.hidden_size))
        self.attn = Attention(lc)
        self.mlp_norm = nn.Parameter(torch.ones(lc.hidden_size))
        self.mlp = SwiGLU(lc.hidden_size, lc.intermediate_size, lc.mlp_bias, lc.rms_norm_eps)
        self.attn_conv = self.mlp_conv = None
        if cfg.conv_kernel_size:
            self.attn_conv = DynamicConv(lc.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
            self.mlp_conv = DynamicConv(lc.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    @staticmethod
    def around(conv: DynamicConv | None, h: torch.Tensor, fn) -> torch.Tensor:
        """A sublayer, wrapped by the DFlash2 conv when there is one."""
        if conv is None:
            return fn(h)
        h, dynamic = conv.prepare(h)
        return conv.finish(fn(h), dynamic)


class CandidateSelector(nn.Module):
    """DFlash2's low-rank selector: score(c | p) = unary(c) + <pred[p] * W h, succ[c]>."""

    def __init__(self, vocab: int, hidden: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab, rank)
        self.successor_codebook = nn.Embedding(vocab, rank)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def edges(self, hidden: torch.Tensor, tokens: torch.Tensor, unary: torch.Tensor,
              anchor: torch.Tensor) -> torch.Tensor:
        """All K x K edges of every depth in one einsum: [B, D, K_parent, K_child].
        Depth 0's parent is the anchor, broadcast over the parent axis."""
        h = self.hidden_projection(hidden)  # [B, D, r]
        parents = torch.cat([anchor[:, None, None].expand(-1, 1, tokens.shape[-1]), tokens[:, :-1]], 1)
        pred = self.predecessor_codebook(parents) * h[:, :, None]  # [B, D, K, r]
        succ = self.successor_codebook(tokens)  # [B, D, K, r]
        return unary[:, :, None, :] + torch.einsum("bdpr,bdcr->bdpc", pred, succ)

    def score(self, hidden: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor,
              unary: torch.Tensor) -> torch.Tensor:
        """score(c | given parent) for each depth's candidates [B, D, K]; parents [B, D] (training
        feeds the true previous tokens)."""
        pred = self.predecessor_codebook(parents) * self.hidden_projection(hidden)  # [B, D, r]
        return unary + torch.einsum("bdr,bdkr->bdk", pred, self.successor_codebook(tokens))


class MarkovHead(nn.Module):
    """DSpark's vanilla Markov head: bias(next | prev) = <W1[prev], W2[next]> over the vocabulary, rank r."""

    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.w1 = nn.Embedding(vocab, rank)
        self.w2 = nn.Linear(rank, vocab, bias=False)

    def bias(self, prev: torch.Tensor) -> torch.Tensor:
        """[..., V] for every next token after prev [...]."""
        return self.w2(self.w1(prev)).float()

    def pair(self, parents: torch.Tensor, children: torch.Tensor) -> torch.Tensor:
        """bias of each child after each parent: parents [B, D, P], children [B, D, C] -> [B, D, P, C]."""
        w2 = self.w2.weight  # [V, r]
        return torch.einsum("bdpr,bdcr->bdpc", self.w1(parents).float(), w2[children].float())


class ConfidenceHead(nn.Module):
    """DSpark's confidence: the logit that slot k's draft survives given its prefix did, from [h_k; W1[x_{k-1}]]."""

    def __init__(self, hidden: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden + rank, 1)

    def forward(self, hidden: torch.Tensor, prev_code: torch.Tensor | None) -> torch.Tensor:
        x = hidden if prev_code is None else torch.cat([hidden, prev_code.to(hidden.dtype)], -1)
        return self.proj(x)[..., 0].float()


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        lc = cfg.layer
        self.fc = DenseWeight(len(cfg.target_layer_ids) * lc.hidden_size, lc.hidden_size)
        self.hidden_norm = nn.Parameter(torch.ones(lc.hidden_size))
        self.layers = nn.ModuleList(DraftBlock(cfg) for _ in range(lc.num_layers))
        self.norm = nn.Parameter(torch.ones(lc.hidden_size))
        self.selector = None
        if cfg.selector_rank:
            self.selector = CandidateSelector(lc.vocab_size, lc.hidden_size, cfg.selector_rank,
                                              cfg.selector_top_k)
        self.markov = MarkovHead(lc.vocab_size, cfg.markov_rank) if cfg.markov_rank else None
        self.confidence = None
        if cfg.confidence_head:
            code = cfg.markov_rank if cfg.confidence_with_markov and cfg.markov_rank else 0
            self.confidence = ConfidenceHead(lc.hidden_size, code)
        self.rope = RopeTable(lc, lc.max_position_embeddings)

    def set_rope_length(self, length: int, device=None) -> None:
        self.rope.resize(length, device=device)

    def new_cache(self, batch: int, length: int, dtype=None, device=None, stacked: bool = True) -> Cache:
        lc = self.cfg.layer
        return Cache.build(lc.kinds, batch, length, lc.num_kv_heads, lc.head_dim, dtype or self.fc.weight.dtype,
                           device or self.fc.weight.device, stacked)

    def block_visibility(self, start: torch.Tensor, block: int) -> Visibility:
        """Block rows see the context (slots < start) and the block: all of it (DFlash's bidirectional
        full-attention layers) or causally, within the sliding window if the config has one."""
        tree = None if self.cfg.is_causal else torch.ones(block, block, dtype=torch.bool, device=start.device)
        return Visibility(cache_len=start, start=start, tree=tree, window=self.cfg.sliding_window)

    def write_context(self, feats: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, cache: Cache,
                      plan: KernelPlan) -> None:
        """Project target features [B, C, F] of committed tokens into every draft layer's K/V."""
        ctx = rms_norm(self.fc.project(feats, plan), self.hidden_norm, self.cfg.layer.rms_norm_eps, plan)
        for i, layer in enumerate(self.layers):
            layer.attn.write_kv(ctx, positions, self.rope, cache[i], slots, plan)

    def draft_block(self, embed: DenseWeight, block_tokens: torch.Tensor, start: torch.Tensor, cache: Cache,
                    plan: KernelPlan) -> torch.Tensor:
        """Draft the block [B, Bk] that starts at position `start` [B], the context being cache slots
        < start. Its K/V land at slots start.. and are overwritten by the next round's context.
        Returns the final-normed hidden states of the block [B, Bk, H]."""
        bk = block_tokens.shape[1]
        positions = start[:, None] + torch.arange(bk, device=block_tokens.device)
        vis = self.block_visibility(start, bk)

        def attn(i, layer, h):
            return layer.around(layer.attn_conv, h, lambda a: layer.attn(a, positions, self.rope, cache[i],
                                                                          positions, vis, plan))

        def mlp(i, layer, h):
            return layer.around(layer.mlp_conv, h, lambda a: layer.mlp(a, plan))

        x = embed.rows(block_tokens) * self.cfg.input_embedding_scale
        h, _ = run_layers(x, self.layers, self.norm, self.cfg.layer.rms_norm_eps, attn, mlp, plan)
        return h

    def draft_logits(self, hidden: torch.Tensor, head: DenseWeight, plan: KernelPlan) -> torch.Tensor:
        with region("head"):
            logits = head.project(hidden, plan).float()
        if self.cfg.output_multiplier != 1.0:  # x * 1.0 is x: no pass over [rows, vocabulary] floats for it
            logits = logits * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def lattice(self, hidden: torch.Tensor, head: DenseWeight, anchor: torch.Tensor, top_k: int,
                plan: KernelPlan) -> Lattice:
        """Lattice over the block's draft positions: 1..Bk-1 (DFlash: slot 0 is the anchor), or the next position of
        every slot (DSpark)."""
        h = hidden if self.cfg.anchor_drafts else hidden[:, 1:]
        logits = self.draft_logits(h, head, plan)
        k = min(self.selector.top_k if self.selector is not None else top_k, logits.shape[-1])
        if self.markov is not None:
            return self._markov_lattice(h, logits, anchor, k)
        unary, tokens = logits.topk(k, dim=-1)
        logp = unary - torch.logsumexp(logits, dim=-1, keepdim=True)
        edges = self.selector.edges(h, tokens, unary, anchor) if self.selector is not None else None
        confidence = self._confidence(h, torch.cat([anchor[:, None], tokens[:, :-1, 0]], 1))
        return Lattice(tokens=tokens, unary=unary, logp=logp, edges=edges, anchor=anchor, confidence=confidence)

    def _markov_lattice(self, h: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor, k: int) -> Lattice:
        """DSpark's sequential greedy drafts, slot by slot on the device (no host sync): each slot's candidates are
        the top-K of its logits biased by the previous pick; edges score every candidate after every parent."""
        prev, prevs, unary, tokens, logp = anchor, [], [], [], []
        for d in range(logits.shape[1]):
            biased = logits[:, d] + self.markov.bias(prev)  # [B, V]
            u, t = biased.topk(k, dim=-1)
            prevs.append(prev)
            unary.append(u)
            tokens.append(t)
            logp.append(u - torch.logsumexp(biased, dim=-1, keepdim=True))
            prev = t[:, 0]
        tokens_t = torch.stack(tokens, 1)  # [B, D, K]
        parents = torch.cat([anchor[:, None, None].expand(-1, 1, k), tokens_t[:, :-1]], 1)
        edges = logits.gather(-1, tokens_t)[:, :, None, :] + self.markov.pair(parents, tokens_t)
        return Lattice(tokens=tokens_t, unary=torch.stack(unary, 1), logp=torch.stack(logp, 1), edges=edges,
                       anchor=anchor, confidence=self._confidence(h, torch.stack(prevs, 1)))

    def _confidence(self, h: torch.Tensor, prevs: torch.Tensor) -> torch.Tensor | None:
        """P(slot k's greedy draft survives | its prefix did) [B, D], after the greedy picks prevs [B, D]."""
        return None if self.confidence is None else torch.sigmoid(self.confidence_logits(h, prevs))

    def confidence_logits(self, h: torch.Tensor, prevs: torch.Tensor) -> torch.Tensor:
        """The confidence head's logits [B, D] of the slots h after the tokens prevs [B, D] (W1's codes of them
        beside h, where the head reads them)."""
        code = self.markov.w1(prevs) if self.confidence.proj.in_features > h.shape[-1] else None
        return self.confidence(h, code)
