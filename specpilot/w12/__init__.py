"""W12, the lossless 12-bit weight format (format.py: encode, decode, the 8-bit view; inspect.py: what a model's
weights cost in it)."""
