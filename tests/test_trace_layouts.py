"""Trace files in the layouts users already have (BurstGPT, Azure 2023, Mooncake, any CSV
with a column mapping), recognised from their columns, and offline arrivals."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simulator as sim
from hardware_models.errors import InfersimError
from hardware_models.yaml_io import validate_model
from simulator.scenario import Scenario
from simulator.workload import WorkloadConfig, generate_requests, read_trace
from tests.conftest import scenario_dict

SAMPLES = Path(__file__).parents[1] / "scenarios" / "traces"


def trace_workload(path: Path, **fields) -> WorkloadConfig:
    arrivals = {"kind": "trace", "path": str(path), **fields.pop("arrivals", {})}
    return validate_model(WorkloadConfig, {"arrivals": arrivals, **fields}, "scenario.yaml")


def test_burstgpt_csv_is_read_by_its_columns():
    expected = pd.read_csv(SAMPLES / "burstgpt_sample.csv")
    batch = generate_requests(trace_workload(SAMPLES / "burstgpt_sample.csv", num_requests=40), 0)
    np.testing.assert_array_equal(batch.arrival_s, expected["Timestamp"].to_numpy(float))
    np.testing.assert_array_equal(batch.prompt_tokens, expected["Request tokens"])
    np.testing.assert_array_equal(batch.output_tokens, expected["Response tokens"])
    assert batch.prompt_hashes is None


def test_azure_2023_timestamps_count_from_the_first_row():
    expected = pd.read_csv(SAMPLES / "azure2023_sample.csv")
    batch = generate_requests(trace_workload(SAMPLES / "azure2023_sample.csv", num_requests=40), 0)
    stamps = pd.to_datetime(expected["TIMESTAMP"])
    seconds = (stamps - stamps[0]).dt.total_seconds().to_numpy()
    np.testing.assert_allclose(batch.arrival_s, seconds, rtol=0, atol=1e-9)
    assert batch.arrival_s[0] == 0.0
    np.testing.assert_array_equal(batch.prompt_tokens, expected["ContextTokens"])
    np.testing.assert_array_equal(batch.output_tokens, expected["GeneratedTokens"])


def test_mooncake_jsonl_gives_ms_arrivals_and_block_hashes():
    rows = [json.loads(line) for line in (SAMPLES / "mooncake_sample.jsonl").open()]
    config = trace_workload(SAMPLES / "mooncake_sample.jsonl", num_requests=len(rows))
    batch = generate_requests(config, 0)
    np.testing.assert_array_equal(batch.arrival_s, [r["timestamp"] / 1000 for r in rows])
    np.testing.assert_array_equal(batch.prompt_tokens, [r["input_length"] for r in rows])
    np.testing.assert_array_equal(batch.output_tokens, [r["output_length"] for r in rows])
    hashes = batch.prompt_hashes
    assert hashes is not None and hashes.block_tokens == 512 and len(hashes) == len(rows)
    for ids, covered, row in zip(hashes.ids, hashes.covered, rows, strict=True):
        assert list(ids) == row["hash_ids"]
        assert covered == min(len(row["hash_ids"]) * 512, row["input_length"])


def test_mooncake_hashes_cover_only_the_prompt_simulated(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [7, 8]}\n'
    )
    clipped = generate_requests(trace_workload(path, num_requests=1, max_total_tokens=605), 0)
    assert clipped.prompt_tokens[0] == 604 and clipped.prompt_hashes.covered[0] == 604
    scaled = trace_workload(path, num_requests=1, prompt_length_scale=2.0)
    assert generate_requests(scaled, 0).prompt_hashes.covered[0] == 1000
    drawn = trace_workload(path, num_requests=1, prompt_tokens={"kind": "fixed", "tokens": 9})
    assert generate_requests(drawn, 0).prompt_hashes is None  # not the trace's prompts


def test_column_mapping_reads_any_csv():
    columns = {"arrival": "sent_ms", "prompt": "in_tok", "output": "out_tok", "time_unit": "ms"}
    config = trace_workload(
        SAMPLES / "custom_sample.csv", arrivals={"columns": columns}, num_requests=30
    )
    expected = pd.read_csv(SAMPLES / "custom_sample.csv")
    batch = generate_requests(config, 0)
    np.testing.assert_allclose(batch.arrival_s, expected["sent_ms"] / 1000, rtol=1e-15)
    np.testing.assert_array_equal(batch.prompt_tokens, expected["in_tok"])
    np.testing.assert_array_equal(batch.output_tokens, expected["out_tok"])


def test_unknown_columns_name_the_layouts_and_the_mapping():
    config = trace_workload(SAMPLES / "custom_sample.csv", num_requests=3)
    with pytest.raises(InfersimError) as err:
        generate_requests(config, 0)
    message = str(err.value)
    assert "\n" not in message
    assert "custom_sample.csv: its columns (req_id, sent_ms, in_tok, out_tok) match no" in message
    for layout in ("infersim (arrived_at", "burstgpt (Timestamp", "azure2023 (TIMESTAMP"):
        assert layout in message
    assert "mooncake (timestamp, input_length, output_length, hash_ids)" in message
    assert "arrivals.columns: {arrival, prompt, output, time_unit}; for trace lengths" in message


def test_trace_lengths_are_read_from_a_burstgpt_file():
    trace = {"kind": "trace", "path": str(SAMPLES / "burstgpt_sample.csv")}
    config = validate_model(
        WorkloadConfig,
        {
            "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
            "prompt_tokens": trace,
            "output_tokens": trace,
            "num_requests": 500,
        },
        "scenario.yaml",
    )
    batch = generate_requests(config, 0)
    pairs = set(pd.read_csv(SAMPLES / "burstgpt_sample.csv")[["Request tokens", "Response tokens"]]
                .itertuples(index=False, name=None))  # fmt: skip
    assert (
        set(zip(batch.prompt_tokens.tolist(), batch.output_tokens.tolist(), strict=True)) <= pairs
    )


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "az.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1,1\nsoon,2,2\n",
            "line 3: TIMESTAMP: not a date and time ('soon')",
        ),
        (
            "az_order.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\n"
            "2023-11-16 18:15:45,2,2\n",
            "line 3: TIMESTAMP 2023-11-16 18:15:45 is earlier than the previous request's",
        ),
        (
            "bg.csv",
            "Timestamp,Request tokens,Response tokens\n0,1,1\n1,x,2\n",
            "line 3: Request tokens: not a number ('x')",
        ),
        (
            "bg_order.csv",
            "Timestamp,Request tokens,Response tokens\n5,1,1\n3,2,2\n",
            "line 3: Timestamp 3 is earlier than the previous request's 5",
        ),
        (
            "mc.jsonl",
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "a"]}\n',
            "line 1: hash_ids: expected a list of 64-bit integers",
        ),
        (
            "partial.csv",
            "Timestamp,Request tokens\n0,1\n",
            "missing column(s) 'Response tokens'",
        ),
    ],
)
def test_bad_rows_name_the_files_own_columns(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(InfersimError) as err:
        read_trace(tmp_path / name, ["num_prefill_tokens", "num_decode_tokens"], arrivals=True)
    assert message in str(err.value)


def test_mapping_requires_an_arrival_column():
    with pytest.raises(InfersimError, match="arrival"):
        trace_workload(Path("x.csv"), arrivals={"columns": {"prompt": "p"}}, num_requests=1)


# ---- offline arrivals --------------------------------------------------------------------


def offline(**stop) -> WorkloadConfig:
    data = {
        "arrivals": {"kind": "offline"},
        "prompt_tokens": {"kind": "fixed", "tokens": 10},
        "output_tokens": {"kind": "fixed", "tokens": 5},
        **stop,
    }
    return validate_model(WorkloadConfig, data, "scenario.yaml")


def test_offline_sends_every_request_at_zero():
    batch = generate_requests(offline(num_requests=25), 0)
    assert len(batch) == 25 and not batch.arrival_s.any()


def test_offline_needs_num_requests():
    with pytest.raises(InfersimError, match="num_requests: offline arrivals"):
        offline(duration_s=10)


def test_offline_run_is_a_closed_loop_of_as_many_users():
    """The same requests as num_requests users sending at once, without the feedback."""

    def run(arrivals: dict):
        lengths = {"prompt_tokens": {"kind": "fixed", "tokens": 300},
                   "output_tokens": {"kind": "fixed", "tokens": 100}}  # fmt: skip
        workload = {"arrivals": arrivals, "num_requests": 200, **lengths}
        return sim.simulate(Scenario.from_dict(scenario_dict(workload=workload)), progress=False)

    offline, closed = run({"kind": "offline"}), run({"kind": "closed_loop", "users": 200})
    assert not offline.requests["arrival"].any()
    np.testing.assert_array_equal(
        np.sort(offline.requests["finish"]), np.sort(closed.requests["finish"])
    )
