"""The engine's bottom layer: the plain types every layer above shares (contracts.py) and the profiler's named
regions (regions.py). Nothing here imports from the rest of specpilot but config and errors."""
