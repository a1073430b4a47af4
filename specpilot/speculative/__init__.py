"""The speculative step as a pipeline: propose (proposal.py: the drafter's greedy chain over its lattice, or a
tree builder's rows: tree.py) -> verify (the target's pass over the proposal's rows) -> accept (accept.py: the
verdict) -> commit (every cache keeps the accepted path); step.py runs them. The tensors each stage hands the
next are core/contracts.py's types, in [batch, rows] shapes."""
