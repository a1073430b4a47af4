"""Summary figures of run records, each system against AR on the same requests.

tau: tokens committed per target pass in decode (bonus included), mean over requests of each request's
mean. Speedup: geometric mean over requests of (system decode rate / AR decode rate) — prefill is
reported separately. Step cost: decode ms per target pass (for AR a token; for stock draft + verify + accept).
Mismatch: share of AR's output tokens that the system's output does not reproduce
at the same position.
"""

from __future__ import annotations

import math
from collections import Counter

from specpilot.bench.harness import TurnRecord


def mismatches(tokens: list[int], reference: list[int]) -> int:
    """Positions where the two outputs differ; a missing or extra token counts as a difference."""
    same = sum(a == b for a, b in zip(tokens, reference, strict=False))
    return max(len(tokens), len(reference)) - same


def first_divergence(tokens: list[int], reference: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _row(rec: TurnRecord, ref: TurnRecord | None) -> dict:
    row = rec.to_json()
    rate = rec.decode_rate
    row["decode_tokens_per_s"] = rate
    row["tau"] = sum(rec.accepted) / len(rec.accepted) if rec.accepted else None
    if ref is not None:
        ref_rate = ref.decode_rate
        row["speedup_vs_ar"] = rate / ref_rate if rate and ref_rate else None
        row["mismatch_vs_ar"] = mismatches(rec.tokens, ref.tokens) / max(len(ref.tokens), 1)
        row["first_divergence_vs_ar"] = first_divergence(rec.tokens, ref.tokens)
    return row


def by_dataset(rows: list[dict]) -> dict:
    """Per benchmark, as overall: requests, mean per-request tau, geometric-mean speedup over AR."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["dataset"], []).append(row)
    out = {}
    for name, group in groups.items():
        taus = [r["tau"] for r in group if r["tau"] is not None]
        out[name] = {"n_requests": len(group), "tau": sum(taus) / len(taus) if taus else None}
        if any("speedup_vs_ar" in r for r in group):
            out[name]["speedup_vs_ar"] = geomean([r.get("speedup_vs_ar") for r in group])
    return out


def summarize(records: list[TurnRecord], reference: list[TurnRecord] | None) -> dict:
    by_id = {r.id: r for r in reference} if reference is not None else {}
    rows = [_row(r, by_id.get(r.id)) for r in records]
    steps = [a for r in records for a in r.accepted]
    taus = [row["tau"] for row in rows if row["tau"] is not None]
    decode_tokens = sum(r.decode_tokens for r in records)
    decode_s = sum(r.decode_s for r in records)
    out = {
        "requests": rows,
        "n_requests": len(rows),
        "tau": sum(taus) / len(taus) if taus else None,
        "tau_histogram": {str(k): v for k, v in sorted(Counter(steps).items())},
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else None,
        "decode_ms_per_token": 1000 * decode_s / decode_tokens if decode_tokens else None,
        # ms per target pass in decode: AR's is its step, a speculative system's its whole step (draft + verify)
        "decode_ms_per_step": 1000 * decode_s / len(steps) if steps else None,
        "prefill_ms_mean": 1000 * sum(r.prefill_s for r in records) / len(records) if records else None,
        "output_tokens": sum(len(r.tokens) for r in records),
    }
    out["by_dataset"] = by_dataset(rows)
    if reference is not None:
        ref_tokens = sum(len(by_id[r.id].tokens) for r in records if r.id in by_id)
        wrong = sum(mismatches(r.tokens, by_id[r.id].tokens) for r in records if r.id in by_id)
        out["speedup_vs_ar"] = geomean([row["speedup_vs_ar"] for row in rows])
        out["mismatch_vs_ar"] = wrong / ref_tokens if ref_tokens else None
    return out
