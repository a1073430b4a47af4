"""Exact replay: the drafter's lattices recorded in a harness run, and the tau any tree builder and node budget
would have reached on them, computed without the target (record.py records, walk.py replays)."""
