"""Replay the measured vLLM run on an RTX 4090 through the simulator and compare.

Reference: `../shared/data/e2e/rtx4090-llama-3.1-8b-vllm-0.19/` (LLMServingSim, MIT):
vLLM 0.19.0 serving Llama-3.1-8B (bf16, TP1) on one GeForce RTX 4090, 300 ShareGPT
requests. This is `infersim replay` on that folder (see benchmarks/README.md, "End to
end"): the run's own arrivals, lengths and engine settings, the `rtx-4090` preset with
its shipped calibration (fitted to published RTX 4090 matmul figures, nothing from this
run), or none with --uncalibrated.

    python benchmarks/e2e_rtx4090.py [--data DIR] [--out DIR] [--uncalibrated]
                                     [--set key=value ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/e2e_rtx4090")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument(
        "--uncalibrated", action="store_true", help="the preset's default efficiencies"
    )
    args = parser.parse_args(argv)
    if not (args.data / "requests.jsonl").is_file():
        print(f"skipped: no measured run at {args.data}", file=sys.stderr)
        return 0
    from simulator.cli.main import main as infersim

    command = ["replay", str(args.data), "-o", str(args.out), "--overwrite", "--quiet"]
    command += ["--calibration", "none"] if args.uncalibrated else []
    return infersim([*command, *(f"--set={item}" for item in args.overrides)])


if __name__ == "__main__":
    sys.exit(main())
