from __future__ import annotations

# The smallest excess mismatch rate (a fraction: 0.1 points) a pass of token forcing must be able to detect with
# 80% power, else it is "inconclusive" (forcing/run.force's bound): `specpilot force --power-bound`'s default and
# the loop's gate's. Here, apart from the judge's imports, so that the command line reads it without them.
POWER_BOUND = 0.001

# The loop's tolerance (the paper's rule: a candidate's mismatch rate within stock's + 0.5 points): the power bound
# its gate holds forcing of a change of arithmetic to. A change of logic alone is decided by the float32 check
# (forcing/logic.py) and reports what forcing could detect beside it.
TOLERANCE = 0.005
