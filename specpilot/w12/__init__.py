"""W12, the lossless 12-bit weight format (format.py: encode, decode, the 8-bit view; inspect.py: what a model's
weights cost in it; attach.py: a loaded target's projections given their W12 form, for `weights=w12`)."""
