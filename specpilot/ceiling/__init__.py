"""Ceiling analysis (`specpilot ceiling`): the cost model S = tau / c and the factors that bound it — tokens (exact
replay), kernels against their byte and FLOP floors (a profile), time outside the kernels, and the lattice itself —
with the target they name, the mechanisms that reach it, and what-if predictions. run.py measures, report.py
computes, model.py is the arithmetic, floors.py the byte counts, profile.py the kernel attribution."""
