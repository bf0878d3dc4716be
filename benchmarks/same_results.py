"""Whether two `infersim run` output folders hold the same results: summary.json equal
less what says how the run was made (`provenance.build_id`, `provenance.processes`),
every Parquet table equal exactly, every other file (plots, CSV) byte for byte; the list
of files infersim wrote (`.infersim-files`) is not compared. The check
behind the exactness claims in benchmarks/README.md (one process against several, a
change against its base).

    python benchmarks/same_results.py OUT_A OUT_B
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

HOW_IT_RAN = ("build_id", "processes")
# infersim's list of the files it wrote (simulator/cli/outputs.py): not a result, and
# absent from folders written before it was kept
MANIFEST = ".infersim-files"


def _summary(folder: Path) -> dict:
    summary = json.loads((folder / "summary.json").read_text())
    for key in HOW_IT_RAN:
        summary["provenance"].pop(key, None)
    return summary


def differences(a: Path, b: Path) -> list[str]:
    """What differs between the two folders (empty when the results are the same)."""
    found = []
    names = sorted(({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()}) - {MANIFEST})
    for name in names:
        if not (a / name).exists() or not (b / name).exists():
            found.append(f"{name}: in one folder only")
        elif name == "summary.json":
            sa, sb = _summary(a), _summary(b)
            keys = sorted(sa | sb)
            found += [f"summary.json: {key}" for key in keys if sa.get(key) != sb.get(key)]
        elif name.endswith(".parquet"):
            try:
                pd.testing.assert_frame_equal(
                    pd.read_parquet(a / name), pd.read_parquet(b / name), check_exact=True
                )
            except AssertionError as exc:
                found.append(f"{name}: {str(exc).splitlines()[0]}")
        elif (a / name).read_bytes() != (b / name).read_bytes():
            found.append(f"{name}: bytes differ")
    return found


if __name__ == "__main__":
    first, second = (Path(p) for p in sys.argv[1:3])
    diff = differences(first, second)
    files = ", ".join(sorted(p.name for p in first.iterdir()))
    print("\n".join(diff) if diff else f"same results: {files}")
    sys.exit(1 if diff else 0)
