"""SpecPilot: lossless speculative decoding, tuned per deployment."""

__version__ = "0.1.0"
