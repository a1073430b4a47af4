"""Gated DeltaNet (the linear-attention layers of Qwen3.5 / Qwen3-Next): CPU references in `naive.py`.

The recurrence, per value head, state S [Dk, Dv] float32, q and k L2-normalised and q scaled by 1/sqrt(Dk):

    S <- e^{g_t} S;   u_t = beta_t (v_t - S^T k_t);   S <- S + k_t u_t^T;   o_t = S^T q_t

Unrolled from S0 over rows with summed log decay G_t: S_t = e^{G_t} S0 + sum_{j<=t} e^{G_t - G_j} k_j u_j^T, and
the u solve one unit lower triangular system, (I + A) u = beta v - beta e^G K S0 with
A[i, j] = beta_i e^{G_i - G_j} k_i.k_j (j < i): the WY/UT chunk form `chunked` runs for prefill.

Trees need no per-node state. Row i of that system involves only the rows it reads, and on a tree a node reads
exactly its ancestors: replace the causal mask by the ancestor mask and G by the path sum (G_n = G_parent + g_n),
and every node's u and o are what the token loop gives along its own root..n path (`tree`, checked against
`tree_by_paths`). Ancestor sets are transitive, so (I + A)^-1 keeps the ancestor sparsity: siblings never mix.

Commit: once the verifier accepts a path (root plus `accepted` drafts), `commit` re-runs the float32 token loop over
exactly those rows from the committed state, the same operations as the stock decode over the same tokens, so the
same bits; `chain_snapshots` is the stock alternative that keeps every position's state. The short conv commits the
last K - 1 inputs along the path (`conv_state_after`). `split3` splits a float32 state exactly into three bf16 parts
for tensor-core products.

The `rows_*` functions (what the layer runs for decode and verify rows, and the commit) pick the Triton kernels
(`triton.py`: the same token loop, one program per walk) when the plan's `use_triton` says so, the references
otherwise.
"""

from __future__ import annotations

import torch

from specpilot.config.plan import KernelPlan
from specpilot.kernels.dispatch import use_triton
from specpilot.kernels.gdn.naive import (
    ancestors,
    chain_parents,
    chain_snapshots,
    check_parents,
    chunked,
    commit,
    conv_chain,
    conv_state_after,
    conv_tree,
    join3,
    l2norm,
    once,
    recurrent,
    root_path,
    split3,
    tree,
    tree_by_paths,
    tree_snapshots,
)

__all__ = [
    "ancestors",
    "chain_parents",
    "chain_snapshots",
    "check_parents",
    "chunked",
    "commit",
    "conv_chain",
    "conv_state_after",
    "conv_tree",
    "join3",
    "once",
    "l2norm",
    "recurrent",
    "root_path",
    "rows_chain",
    "rows_commit",
    "rows_tree",
    "split3",
    "tree",
    "tree_by_paths",
    "tree_snapshots",
]


# Each imports the Triton module only when it runs it: importing this package never imports triton (TRITON_INTERPRET
# must be set before triton's first import). `memo`: a dict shared by the layers of one forward (Forward.derived),
# so what depends on the rows' shape alone (a tree's paths) is built once a forward, not once a layer.


def rows_chain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               state: torch.Tensor, plan: KernelPlan, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain verification: (o, every row's state [B, T, Hv, Dk, Dv]), as `chain_snapshots`."""
    if use_triton(k, plan):
        from specpilot.kernels.gdn.triton import recurrent_rows

        return recurrent_rows(q, k, v, g, beta, state, normalize, snapshots=True, final=False)
    return chain_snapshots(q, k, v, g, beta, state, normalize)


def rows_tree(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor, parents: torch.Tensor, plan: KernelPlan, normalize: bool = True,
              snapshots: bool = False, memo: dict | None = None):
    """Tree verification: o [B, N, Hv, Dv] as `tree`, or with snapshots (o, states) as `tree_snapshots`."""
    if use_triton(k, plan):
        from specpilot.kernels.gdn.triton import tree_paths, tree_rows

        paths = once(memo, "tree_paths", lambda: tree_paths(parents))
        return tree_rows(q, k, v, g, beta, state, parents, normalize, snapshots, paths=paths)
    if snapshots:
        return tree_snapshots(q, k, v, g, beta, state, parents, normalize)
    return tree(q, k, v, g, beta, state, parents, normalize)


def rows_commit(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
                path: torch.Tensor, accepted: torch.Tensor, plan: KernelPlan, normalize: bool = True,
                memo: dict | None = None) -> torch.Tensor:
    """The state after the accepted path, as `commit` (memo: the commit's dict shared by its layers)."""
    if use_triton(k, plan):
        from specpilot.kernels.gdn.triton import commit_path, commit_rows

        walk = once(memo, "commit_path", lambda: commit_path(path, accepted))
        return commit_rows(k, v, g, beta, state, path, accepted, normalize, walk=walk)
    return commit(k, v, g, beta, state, path, accepted, normalize)
