"""A model's cache: one state object per layer, made from the config's layer types.

Attention layers keep K/V over a static cache of `length` slots ([B, Hkv, L, D] each, the layout the
attention kernels read without a copy); a row's slot is where its K/V live. A step writes the K/V of every
row it verifies (the kernels write in place), then `commit` keeps the accepted path: every state is told every
step, chains included (an attention layer's chain prefix is in place already; a recurrent layer's state, Gated
DeltaNet's, must still move to the accepted row's).
"""

from __future__ import annotations

import torch

from specpilot.kernels import gdn


class AttentionState:
    """One attention layer's K and V, [B, Hkv, L, D]."""

    kind = "attention"

    def __init__(self, batch: int, length: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device,
                 stack: tuple[torch.Tensor, torch.Tensor, int] | None = None):
        """stack: (K of all layers, V of all layers, this layer's index): this layer's K/V are views of them,
        taken at each use (as indexing a stacked tensor always was: a view kept from before an in-place write
        to its base would trip autograd where gradients are on)."""
        shape = (batch, kv_heads, length, head_dim)
        if stack is None:
            stack = (torch.zeros(shape, dtype=dtype, device=device)[None],
                     torch.zeros(shape, dtype=dtype, device=device)[None], 0)
        self._k, self._v, self._i = stack

    @property
    def k(self) -> torch.Tensor:
        return self._k[self._i]

    @property
    def v(self) -> torch.Tensor:
        return self._v[self._i]

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def rows(self, first: int, last: int) -> AttentionState:
        """A view of sequences first..last-1 (writes go to this state)."""
        return AttentionState.of(self.k[first:last], self.v[first:last])

    def reset_rows(self, mask: torch.Tensor) -> None:
        """Nothing: a slot's K/V are written before they are read."""

    @classmethod
    def of(cls, k: torch.Tensor, v: torch.Tensor) -> AttentionState:
        """A state around K/V tensors [B, Hkv, L, D] that exist already."""
        return cls(0, 0, 0, 0, k.dtype, k.device, (k[None], v[None], 0))

    def commit(self, path: torch.Tensor, accepted: torch.Tensor, start: torch.Tensor, in_place: bool = False,
               live: torch.Tensor | None = None, memo: dict | None = None) -> None:
        """Keep the accepted path: `path` [B, P] are the verified rows (slot start + r) of the path in order, the
        first accepted [B] + 1 of them kept, to sit at slots start, start + 1, ...; in_place: the path is there
        already (a chain accepts a prefix of its rows, and row r sits at slot start + r), so nothing moves. Rows
        past the path are overwritten by the next step. live: unused (a parked row's moves stay past its
        position, where its next request writes before it reads)."""
        if not in_place:
            move_rows((self.k[None], self.v[None]), path, start)


def move_rows(tensors: tuple[torch.Tensor, ...], rows: torch.Tensor, start: torch.Tensor) -> None:
    """Slots start + rows[b, i] -> start + i of each tensor [layers, B, Hkv, L, D] (gathered first: the ranges
    may overlap)."""
    b, r = rows.shape
    for t in tensors:
        shape = (t.shape[0], b, t.shape[2], r, t.shape[4])
        index = (start[:, None] + rows).view(1, b, 1, r, 1).expand(shape)
        dest = (start[:, None] + torch.arange(r, device=rows.device)).view(1, b, 1, r, 1).expand(shape)
        t.scatter_(3, dest, t.gather(3, index))


class GDNState:
    """One Gated DeltaNet layer's state (models/gdn.py): ssm [B, Hv, Dk, Dv] float32 and the conv's last inputs
    [B, C, width - 1]. Decode and verify rows leave in `pending` what the commit needs (a state per row, or a
    tree's rows' inputs); the commit moves the state to the accepted path's end."""

    kind = "gdn"

    def __init__(self, batch: int, shape, dtype: torch.dtype, device, tensors=None):
        self.shape = shape
        if tensors is None:
            tensors = (torch.zeros(batch, shape.v_heads, shape.k_dim, shape.v_dim, dtype=torch.float32,
                                   device=device),
                       torch.zeros(batch, shape.conv_dim, shape.conv - 1, dtype=dtype, device=device))
        self.ssm, self.conv = tensors
        self.pending: dict | None = None

    @property
    def length(self) -> int:
        return 0  # no slots: a fixed-size state

    def rows(self, first: int, last: int) -> GDNState:
        return GDNState(0, self.shape, self.conv.dtype, self.conv.device, (self.ssm[first:last], self.conv[first:last]))

    def reset_rows(self, mask: torch.Tensor) -> None:
        """The sequences where mask [B] is set start afresh (graph-safe: no host read)."""
        self.ssm.copy_(torch.where(mask[:, None, None, None], 0.0, self.ssm))
        self.conv.copy_(torch.where(mask[:, None, None], 0.0, self.conv))

    def reset(self) -> None:
        self.ssm.zero_()
        self.conv.zero_()

    def commit(self, path: torch.Tensor, accepted: torch.Tensor, start: torch.Tensor, in_place: bool = False,
               live: torch.Tensor | None = None, memo: dict | None = None) -> None:
        """The state after the accepted path (path [B, P]: the verified rows in order; the first accepted + 1
        kept): the kept state of its last row, or (a tree under hybrid_tree=recompute) the state recomputed along
        the path in float32 (the same sequence of operations as decoding it token by token). live [B]: rows
        where 0 keep their state (a batch's parked rows). memo: a dict shared by the layers of one commit (what
        depends on the path alone is made once)."""
        p, self.pending = self.pending, None
        if p is None:
            return
        if "snapshots" in p:
            picks = gdn.once(memo, "snapshot_picks", lambda: (torch.arange(path.shape[0], device=path.device),
                                                               path.gather(1, accepted[:, None])[:, 0]))
            ssm = p["snapshots"][picks]  # the kept path's last row's state
        else:
            ssm = gdn.rows_commit(p["k"], p["v"], p["g"], p["beta"], self.ssm, path, accepted, p["plan"], memo=memo)
        conv = gdn.conv_state_after(p["mixed"], self.conv, path, accepted, memo)
        if live is not None:
            keep = gdn.once(memo, "live", live.bool)
            ssm = torch.where(keep[:, None, None, None], ssm, self.ssm)
            conv = torch.where(keep[:, None, None], conv, self.conv)
        self.ssm.copy_(ssm)
        self.conv.copy_(conv)


STATES = {"attention": AttentionState, "gdn": GDNState}


class Cache:
    """Per-layer states of one model for `batch` sequences of up to `length` slots."""

    def __init__(self, states: list):
        self.layers = states

    @classmethod
    def build(cls, layer_types: list[str], batch: int, length: int, kv_heads: int, head_dim: int,
              dtype: torch.dtype, device, stacked: bool = True, gdn_shape=None) -> Cache:
        """stacked: the attention layers' K (and V) are views of one tensor [layers, B, Hkv, L, D], the layout the
        engine had before its cache was per layer (on the H200 8B, separate tensors made the cuBLAS AR step 1.9%
        slower: bench/results/2026-12-02_two_trees_dense-8b_*); separate tensors where autograd must see each
        layer's writes apart (drafter training)."""
        if not stacked or set(layer_types) != {"attention"}:
            return cls([GDNState(batch, gdn_shape, dtype, device) if kind == "gdn" else
                        AttentionState(batch, length, kv_heads, head_dim, dtype, device) for kind in layer_types])
        shape = (len(layer_types), batch, kv_heads, length, head_dim)
        k, v = torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
        return cls([AttentionState(batch, length, kv_heads, head_dim, dtype, device, (k, v, i))
                    for i in range(len(layer_types))])

    def __getitem__(self, i: int):
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def length(self) -> int:
        return max(s.length for s in self.layers)

    def rows(self, first: int, last: int) -> Cache:
        """A view of sequences first..last-1 (a stacked cache's view stays stacked: its commit stays one move)."""
        stacked = self._stack()
        if stacked is None:
            return Cache([s.rows(first, last) for s in self.layers])
        k, v = (t[:, first:last] for t in stacked)
        return Cache([AttentionState(0, 0, 0, 0, k.dtype, k.device, (k, v, i)) for i in range(len(self.layers))])

    def commit(self, path: torch.Tensor, accepted: torch.Tensor, start: torch.Tensor, in_place: bool = False,
               live: torch.Tensor | None = None) -> None:
        """Every layer keeps the accepted path (AttentionState.commit), every step; the attention layers of one
        stacked tensor in one gather and one scatter each for K and V, not one per layer."""
        stacked = None if in_place else self._stack()
        if stacked is not None:
            move_rows(stacked, path, start)
            return
        memo: dict = {}  # what the layers' commits derive from the path alone, made once (GDN layers)
        for state in self.layers:
            state.commit(path, accepted, start, in_place, live, memo)

    def reset_rows(self, mask: torch.Tensor) -> None:
        """The recurrent states of the sequences where mask [B] is set start afresh (a new request's first
        prompt rows in a verify pass: speculative/admit.py); attention layers need nothing."""
        for state in self.layers:
            state.reset_rows(mask)

    def _stack(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(K, V) [layers, B, Hkv, L, D] when every layer is a view of one stacked tensor, in order."""
        first = self.layers[0]
        if not all(isinstance(s, AttentionState) and s._k is first._k and s._v is first._v and s._i == i
                   for i, s in enumerate(self.layers)) or first._k.shape[0] != len(self.layers):
            return None
        return first._k, first._v
