"""The command line as a user meets it: output on good input, one line on bad input."""

import subprocess
import sys

import pandas as pd
import pytest

from hardware_models.gemm import gemm_cost
from hardware_models.presets import load_gpu
from simulator.build import resolve_gpu
from simulator.cli.main import main
from simulator.memory_planner import framework_overhead_bytes
from simulator.scenario import Scenario
from tests.conftest import scenario_dict


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_hardware_list_and_show(capsys):
    code, out, _ = run(capsys, "hardware", "list")
    assert code == 0 and "h100-sxm" in out and "dgx-h100" in out
    code, out, _ = run(capsys, "hardware", "show", "h100-sxm")
    assert code == 0 and "989.4" in out and "ridge" in out


def test_hardware_show_a_pcie_node_describes_its_tree(capsys):
    code, out, _ = run(capsys, "hardware", "show", "l40s-8x-pcie")
    assert code == 0
    assert "2 GPUs per switch" in out and "4 per socket" in out and "CPU link 22 GB/s" in out


def test_hardware_show_user_yaml(capsys):
    code, out, _ = run(
        capsys, "hardware", "show", "scenarios/hardware/hypothetical-accelerator.yaml"
    )
    assert code == 0 and "acme" in out.lower()


def test_estimate_quick_figures_from_the_issue(capsys):
    code, out, _ = run(
        capsys, "estimate", "--model", "llama-2-70b", "--gpu", "h100-sxm", "--precision", "fp16"
    )
    assert code == 0
    assert "inference: 2 GPUs" in out
    assert "training:  11 GPUs" in out
    # the serving plan is at the tp it recommends, not at tp=1, where the model cannot fit
    assert "GPUs needed: 2" in out and "Serving plan at tp=2 (the GPUs needed" in out
    assert "does not fit" not in out and "KV capacity" in out
    code, out, _ = run(capsys, "estimate", "--model", "llama-2-70b", "--gpu", "h100-sxm",
                       "--precision", "fp16", "--tp", "1")  # fmt: skip
    assert code == 0 and "Serving plan at tp=1 (--tp" in out
    assert "does not fit" in out  # a tp=1 serving plan explains itself


@pytest.mark.parametrize("flag", ["--dp", "--grad-accum", "--batch", "--seq", "--tp"])
def test_estimate_refuses_a_zero_count_before_printing_anything(capsys, flag):
    with pytest.raises(SystemExit) as exit_:
        run(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--training",
            "--zero", "3", flag, "0")  # fmt: skip
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"argument {flag}: expected a whole number >= 1, got 0" in captured.err


def test_estimate_training_zero3(capsys):
    code, out, _ = run(
        capsys, "estimate", "--model", "llama-2-7b", "--gpu", "a100-80gb-sxm",
        "--training", "--zero", "3", "--dp", "8",
    )  # fmt: skip
    assert code == 0 and "ZeRO-3" in out and "optimizer states" in out


def _weights_gb(out: str) -> float:
    line = next(x for x in out.splitlines() if x.strip().startswith("weights"))
    return float(line.split()[1])


def test_estimate_reads_precision_as_run_reads_weight_dtype(capsys):
    """nvfp4 keeps its spelling and its scales (an fp8 scale per 16 weights, not mxfp4's
    e8m0 per 32: ~2.1 GB more on 70B), and a format the GPU has no kernels for is refused
    as `run` refuses it."""
    estimate = ("estimate", "--model", "llama-3.1-70b", "--gpu")
    code, nv, _ = run(capsys, *estimate, "b200", "--precision", "nvfp4")
    assert code == 0 and "nvfp4 weights" in nv
    code, mx, _ = run(capsys, *estimate, "b200", "--precision", "mxfp4")
    assert code == 0 and "mxfp4 weights" in mx
    # 1/32 byte more per quantised weight (embeddings and norms stay bf16)
    assert 2.0 < _weights_gb(nv) - _weights_gb(mx) < 70.55 / 32
    code, _, err = run(capsys, *estimate, "mi300x", "--precision", "nvfp4")
    assert code == 2 and "--precision: mi300x (CDNA3) has no kernels for nvfp4" in err
    hypothetical = "scenarios/hardware/hypothetical-accelerator.yaml"
    code, _, err = run(capsys, *estimate, hypothetical, "--precision", "fp4")
    assert code == 2 and "no kernels for fp4 (read as mxfp4) weights" in err


def test_roofline_single_and_csv(capsys, tmp_path):
    code, out, _ = run(
        capsys, "roofline", "--gpu", "h100-sxm", "--op", "gemm",
        "--m", "4096", "--n", "4096", "--k", "4096", "--dtype", "bf16",
        "--plot", str(tmp_path / "r.png"),
    )  # fmt: skip
    assert code == 0 and "compute" in out and (tmp_path / "r.png").stat().st_size > 1000
    ops = tmp_path / "ops.csv"
    ops.write_text(
        "op,m,n,k,batch,q_len,context,heads,kv_heads,head_dim,bytes,gpus\n"
        "gemm,1,8192,8192,,,,,,,,\n"
        "attention_prefill,,,,4,2048,,32,8,128,,\n"
        "attention_decode,,,,64,,4096,32,8,128,,\n"
        "all_reduce,,,,,,,,,,16777216,8\n"
    )
    out_csv = tmp_path / "costs.csv"
    code, out, _ = run(
        capsys, "roofline", "--gpu", "h100-sxm", "--input", str(ops), "--output", str(out_csv)
    )
    assert code == 0
    text = out_csv.read_text()
    assert text.count("\n") == 5 and "memory" in text and "communication" in text


@pytest.mark.parametrize(
    ("flags", "setting", "says"),
    [
        ((), "auto", "calibration h100-sxm (auto: fitted on this GPU)"),
        (("--calibration", "none"), "none", "calibration none (datasheet efficiencies)"),
    ],
)
def test_roofline_prices_with_the_calibration_a_run_would(capsys, tmp_path, flags, setting, says):
    """By default the profile a run's `hardware.calibration: auto` picks, named on the
    first line; --calibration chooses another, as the scenario field does."""
    out_csv = tmp_path / "costs.csv"
    code, out, _ = run(capsys, "roofline", "--gpu", "h100-sxm", "--m", "4096", "--n", "4096",
                       "--k", "4096", *flags, "--output", str(out_csv))  # fmt: skip
    assert code == 0 and out.splitlines()[0] == f"NVIDIA H100 SXM5 80GB, {says}"
    hardware = {"gpu": "h100-sxm", "calibration": setting}
    gpu = resolve_gpu(Scenario.from_dict(scenario_dict(hardware=hardware)))
    priced = pd.read_csv(out_csv)["seconds"].item()
    assert priced == pytest.approx(gemm_cost(gpu, 4096, 4096, 4096, "bf16").seconds, rel=1e-12)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["hardware", "show", "h10"], "did you mean 'h100-sxm'"),
        (["roofline", "--gpu", "h100-sxm", "--m", "8", "--n", "8", "--k", "8",
          "--calibration", "bogus"], "--calibration: unknown calibration 'bogus'"),
        (["hardware", "show", "/nonexistent/gpu.yaml"], "no such file"),
        (["estimate", "--model", "lama-2-7b", "--gpu", "h100-sxm"], "did you mean"),
        (["estimate", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--precision", "fp9"], "fp9"),
        (["roofline", "--gpu", "h100-sxm", "--op", "gemm", "--m", "3"], "needs n, k"),
        (["roofline", "--gpu", "h100-sxm", "--op", "conv", "--m", "3"], "op"),
        (["roofline", "--gpu", "a100-80gb-sxm", "--m", "8", "--n", "8", "--k", "8",
          "--dtype", "fp8"], "fp8"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(capsys, argv, needle):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("infersim: error:")
    assert needle in err
    assert "Traceback" not in err


def test_bad_csv_names_the_line(capsys, tmp_path):
    ops = tmp_path / "ops.csv"
    ops.write_text("op,m,n,k\ngemm,1,2,3\ngemm,1,-2,3\n")
    code, _, err = run(capsys, "roofline", "--gpu", "h100-sxm", "--input", str(ops))
    assert code == 2 and "line 3" in err and "n" in err


def test_console_script_is_installed():
    result = subprocess.run(
        [sys.executable, "-m", "simulator.cli.main", "hardware", "show", "nope"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_estimate_says_gb_and_gib_apart(capsys):
    code, out, _ = run(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                       "--training")  # fmt: skip
    assert code == 0
    assert "(each 85.90 GB = 80 GiB on the datasheet, 85.06 GB of it visible to CUDA)" in out
    # the verdict names the capacity it checks: what CUDA reports, not the datasheet's
    assert "does NOT fit in the 85.06 GB CUDA sees" in out
    assert "80 GB" not in out


def _row_gb(out: str, label: str, nth: int = 0) -> float:
    rows = [x for x in out.splitlines() if x.strip().startswith(label)]
    return float(rows[nth].split()[-2])


@pytest.mark.parametrize(("model", "tp"), [("llama-3.1-8b", 1), ("llama-3.1-70b", 2)])
def test_estimate_charges_one_overhead_in_both_sections(capsys, model, tp):
    """The detailed inference and the serving plan below it charge the same non-torch
    memory (framework_overhead_bytes at the tp: 0.21 GB at tp=1, 2.14 GB at tp=2 over
    NVLink), not a flat 1.50 GB above a modelled figure."""
    code, out, _ = run(capsys, "estimate", "--model", model, "--gpu", "h100-sxm")
    assert code == 0 and f"Serving plan at tp={tp}" in out
    detailed = _row_gb(out, "framework overhead (per GPU)")
    assert detailed == _row_gb(out, "framework overhead", nth=1)
    assert detailed == pytest.approx(
        framework_overhead_bytes(load_gpu("h100-sxm"), tp) / 1e9, abs=0.01
    )


def test_paper_cuts(capsys, tmp_path):
    # a closed pipe is not an internal error
    listing = subprocess.run(
        f"{sys.executable} -m simulator.cli.main hardware list | head -1",
        shell=True, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert listing.stdout == "GPUs:\n" and listing.stderr == ""
    # --debug after the subcommand; preset names in any case
    with pytest.raises(Exception, match="unknown gpu 'nope'"):
        main(["hardware", "show", "nope", "--debug"])
    code, out, _ = run(capsys, "hardware", "show", "H100-SXM")
    assert code == 0 and "h100-sxm" in out and "80 GiB (85.9 GB; CUDA sees 79.22 GiB)" in out
    # a folder is not a file
    code, _, err = run(capsys, "run", "scenarios")
    assert code == 2 and "scenarios: is a folder; give one YAML file in it" in err
    # a node, by name or as a YAML file, is shown as a node
    for node in ("dgx-h100", "hardware_models/presets/nodes/dgx-h100.yaml"):
        code, out, err = run(capsys, "hardware", "show", node)
        assert code == 0 and err == "" and "8 x h100-sxm" in out and "infiniband" in out
    # the README's roofline example has its CSV
    code, out, _ = run(capsys, "roofline", "--gpu", "h100-sxm", "--input", "scenarios/ops.csv",
                       "--plot", str(tmp_path / "r.png"))  # fmt: skip
    assert code == 0 and "all_reduce" in out and (tmp_path / "r.png").stat().st_size > 1000
