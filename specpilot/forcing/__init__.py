from __future__ import annotations

# The smallest excess mismatch rate (a fraction: 0.1 points) a pass of token forcing must be able to detect with
# 80% power, else it is "inconclusive" (forcing/run.force's bound): `specpilot force --power-bound`'s default and
# the loop's gate's. Here, apart from the judge's imports, so that the command line reads it without them.
POWER_BOUND = 0.001
