"""The GPU results' header (bench/gpu/engine_core.provenance): the GPU's state from nvidia-smi, which must
never break the benchmark it describes (no GPU here: nvidia-smi is faked)."""

import subprocess

import pytest

core = pytest.importorskip("bench.gpu.engine_core")


def test_gpu_state_asks_for_each_field_and_keeps_what_the_driver_knows(monkeypatch):
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        field = cmd[3].split("=", 1)[1]
        if field == "clocks_event_reasons.active":  # a field an older driver does not know
            return subprocess.CompletedProcess(cmd, 6, stdout="", stderr="Field is not a valid field")
        return subprocess.CompletedProcess(cmd, 0, stdout=f" {field} value \n")

    monkeypatch.setattr(core.subprocess, "run", fake_run)
    state = core.gpu_state()
    assert state["serial"] == "serial value" and state["clocks.sm"] == "clocks.sm value"
    assert state["clocks_event_reasons.active"] is None
    assert [c[3] for c in calls] == [f"--query-gpu={f}" for f in core.GPU_FIELDS]
    assert all(c[:2] == ["nvidia-smi", "-i"] and c[2] for c in calls)


def test_gpu_state_without_nvidia_smi_or_with_an_odd_failure_is_a_dict(monkeypatch):
    def missing(cmd, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(core.subprocess, "run", missing)
    assert core.gpu_state() == {}

    def odd(cmd, **kwargs):
        raise ValueError("unexpected output")

    monkeypatch.setattr(core.subprocess, "run", odd)
    assert "unexpected output" in core.gpu_state()["error"]
