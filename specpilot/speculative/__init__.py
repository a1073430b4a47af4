"""The speculative step as a pipeline: propose (proposal.py: the drafter's greedy chain over its lattice;
trees next) -> verify (the target's pass over the proposal's rows) -> accept (accept.py: the verdict) ->
commit (every cache keeps the accepted path), with the dataclasses that carry each stage's tensors in
[batch, rows] shapes (step.py runs them; visibility.py says which slots a row sees)."""
