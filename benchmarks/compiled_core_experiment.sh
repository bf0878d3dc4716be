#!/usr/bin/env bash
# A compiled engine core, measured (benchmarks/README.md, "A compiled engine core: measured").
#
# An experiment, not the product's build: exports this checkout's HEAD three times into a
# scratch folder and times `infersim run` with each tree first on PYTHONPATH:
#   pure   the Python modules unchanged (byte-compiled with compileall);
#   comp   the hot engine modules cythonized unchanged (Cython's pure-Python mode);
#   comp2  as comp, with DecodeSteps a C-level class with typed fields (a step_cost.pxd) and
#          typed locals in Replica._price_run_stepwise (a @cython.locals line).
# Then checks the outputs are identical (summary.json less provenance.build_id; Parquet
# tables with check_exact; other files byte for byte).
#
#   bash benchmarks/compiled_core_experiment.sh [WORK_DIR]     (default /tmp/cy)
#
# Needs gcc, Python's headers and the package registry (Cython is installed into WORK_DIR).
# Takes about 2 minutes to build and 5 to time on an idle 2-core machine.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-/tmp/cy}
PY=$REPO/.venv/bin/python
INFERSIM=$REPO/.venv/bin/infersim
REF=$REPO/../shared/bench/ref_simpy.py
MODS=simulator/engine/replica.py,simulator/engine/scheduler.py,simulator/engine/running.py,simulator/engine/step_cost.py,simulator/engine/columns.py,simulator/engine/step_log.py,simulator/engine/kv_cache.py,hardware_models/attention.py
mkdir -p "$WORK"
[ -d "$WORK/site/Cython" ] || python -m pip install --quiet --target "$WORK/site" cython

cat > "$WORK/setup_cy.py" <<'EOF'
"""cythonize the modules named after --mods in place (annotations are not C types)."""
import sys
from Cython.Build import cythonize
from setuptools import setup
i = sys.argv.index("--mods")
mods = sys.argv[i + 1].split(",")
setup(
    ext_modules=cythonize(mods, language_level=3, nthreads=2,
                          compiler_directives={"annotation_typing": False, "binding": True}),
    script_args=["build_ext", "--inplace"],
)
EOF

for v in pure comp comp2; do
    rm -rf "${WORK:?}/$v" && mkdir -p "$WORK/$v"
    git -C "$REPO" archive HEAD simulator hardware_models | tar -x -C "$WORK/$v"
done

cat > "$WORK/comp2/simulator/engine/step_cost.pxd" <<'EOF'
cimport cython

cdef class DecodeSteps:
    cdef public Py_ssize_t seqs, layers, rank_layers, window_layers, window_rank_layers
    cdef public Py_ssize_t _other_bound
    cdef public tuple parts
    cdef public double launch, host, fixed_flops, fixed_dram
    cdef public double _per_key, _attn_floor, _flops_per_key, _before, _after
    cdef public bint overlap
    cdef public object attention, _terms, _one_step, window_attention, _window_step, _other

    @cython.locals(attn_s=double, attn_f=double, attn_d=double, seq_bytes=double,
                   bandwidth=double, waves=double, memory=double, b0=double, b1=double,
                   b2=double, b3=double, b4=double, layers=Py_ssize_t, window_f=double,
                   window_d=double, window_s=double, gpu_seconds=double, host=double,
                   seconds=double, ranks=Py_ssize_t, flops=double, dram=double)
    cpdef tuple price(self, long context, long window_context=*)
EOF
"$PY" - "$WORK/comp2/simulator/engine/replica.py" <<'EOF'
import sys
from pathlib import Path
path = Path(sys.argv[1])
text = path.read_text()
method = "    def _price_run_stepwise(\n"
assert text.count(method) == 1, "Replica._price_run_stepwise not found"
typed = """    @cython.locals(start=cython.double, end=cython.double, seconds=cython.double,
                   arrival=cython.double, horizon=cython.double, fault=cython.double,
                   j=cython.Py_ssize_t, steps=cython.Py_ssize_t, bs=cython.Py_ssize_t,
                   blocks=cython.long, need=cython.long, free=cython.long, used=cython.long,
                   window=cython.long)
"""
text = text.replace(method, typed + method).replace("\nimport ", "\nimport cython\nimport ", 1)
path.write_text(text)
EOF

for v in comp comp2; do
    (cd "$WORK/$v" && PYTHONPATH="$WORK/site" python "$WORK/setup_cy.py" --mods "$MODS" \
        > "$WORK/build_$v.log" 2>&1) || { echo "build of $v failed: $WORK/build_$v.log"; exit 1; }
done
python -m compileall -q "$WORK/pure" "$WORK/comp" "$WORK/comp2" > /dev/null

cat > "$WORK/compare.py" <<'EOF'
"""Two run folders equal: summary.json less build_id, Parquet exactly, the rest bytewise."""
import filecmp
import json
import sys
from pathlib import Path

import pandas as pd


def compare(a: Path, b: Path) -> int:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()), f"different files in {a}"
    for name in names:
        if (a / name).is_dir():
            compare(a / name, b / name)
        elif name == "summary.json":
            left, right = (json.loads((d / name).read_text()) for d in (a, b))
            for summary in (left, right):
                summary.get("provenance", {}).pop("build_id", None)
            assert left == right, a / name
        elif name.endswith(".parquet"):
            pd.testing.assert_frame_equal(
                pd.read_parquet(a / name), pd.read_parquet(b / name), check_exact=True
            )
        else:
            assert filecmp.cmp(a / name, b / name, shallow=False), a / name
    return len(names)


a, b = Path(sys.argv[1]), Path(sys.argv[2])
print(f"equal: {a} {b} ({compare(a, b)} entries)")
EOF

cd "$REPO"
run() {  # run VARIANT NAME ARGS...: one timed `infersim run` with VARIANT's tree first
    local v=$1 name=$2
    shift 2
    PYTHONPATH="$WORK/$v" /usr/bin/time -f "$name $v %e %U %M" "$INFERSIM" run "$@" \
        -o "$WORK/out_${name}_$v" --overwrite --quiet > /dev/null
}
echo "wall s, user CPU s, peak RSS KB"
for i in 1 2 3 4 5; do
    echo "round $i: $(uptime)"
    /usr/bin/time -f "reference %e %U %M" python "$REF" > /dev/null
    for v in pure comp comp2; do run $v perf_10k benchmarks/perf_10k.yaml; done
done
for i in 1 2 3; do
    echo "round $i: $(uptime)"
    /usr/bin/time -f "reference %e %U %M" python "$REF" > /dev/null
    for v in pure comp comp2; do
        run $v cluster_100k benchmarks/perf_1m_cluster.yaml --set workload.num_requests=100000
    done
done
for name in perf_10k cluster_100k; do
    for v in comp comp2; do "$PY" "$WORK/compare.py" "$WORK/out_${name}_pure" "$WORK/out_${name}_$v"; done
done
