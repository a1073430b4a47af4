"""The `gemv` step tuning: block configs of the one-row kernels, chosen by timing the whole captured decode
step (descent.py) over each kernel kind's candidates (candidates.py), beginning where a GPU has a measured
start table (starts.py); the choices live in the kernel plan's table (config/plan.py)."""
