"""Build the few-row product's cubins here (NVRTC needs no GPU) so that a GPU run spends no device time
compiling: `python bench/gpu/prebuild.py .stage/cubin`, carry .stage/cubin, and on the GPU
`python bench/gpu/prebuild.py --install .stage/cubin` copies them into the cubin cache (kernels/nvrtc.py)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, with or without PYTHONPATH
from bench.gpu.fewrow import SWEEP  # noqa: E402
from specpilot.kernels import fewrow, nvrtc  # noqa: E402

# (row tiles, layout) the benchmark times: the defaults and the alternatives it sweeps
LAYOUTS = sorted(set(fewrow.LAYOUT.items()) | set(SWEEP))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--install", action="store_true", help="copy the folder's cubins into the cache")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    folder = Path(args.folder)
    if args.install:
        nvrtc.cache_dir().mkdir(parents=True, exist_ok=True)
        for f in folder.glob("*.cubin"):
            shutil.copy(f, nvrtc.cache_dir() / f.name)
        print(f"installed {len(list(folder.glob('*.cubin')))} cubins")
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    forms = ((True, True), (True, False), (False, False))  # W12 tiled, W12 in rows, BF16
    builds = [fewrow.macros(w12, mt, *layout, tiled=tiled) for w12, tiled in forms for mt, layout in LAYOUTS]
    for layout in {fewrow.LAYOUT[1], fewrow.layout_for(1 << 20, 1, 132)}:  # two-level verification's pass
        builds.append(fewrow.macros(True, 1, *layout, view8=True, tiled=True))
    for macros in builds:
        nvrtc.build(fewrow.SOURCE, macros, args.arch)
        shutil.copy(nvrtc.cache_path(fewrow.SOURCE, macros, args.arch), folder)
    print(f"{len(list(folder.glob('*.cubin')))} cubins in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
