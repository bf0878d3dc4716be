"""Trace files in the layouts users already have (BurstGPT, Azure 2023, Mooncake, any CSV
with a column mapping), recognised from their columns, and offline arrivals."""

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simulator as sim
from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.yaml_io import validate_model
from simulator.cli.main import main
from simulator.scenario import Scenario
from simulator.workload import WorkloadConfig, generate_requests, read_trace
from tests.conftest import scenario_dict

SAMPLES = Path(__file__).parents[1] / "scenarios" / "traces"


def trace_workload(path: Path, **fields) -> WorkloadConfig:
    arrivals = {"kind": "trace", "path": str(path), **fields.pop("arrivals", {})}
    return validate_model(WorkloadConfig, {"arrivals": arrivals, **fields}, "scenario.yaml")


def test_burstgpt_csv_is_read_by_its_columns():
    expected = pd.read_csv(SAMPLES / "burstgpt_sample.csv")
    config = trace_workload(SAMPLES / "burstgpt_sample.csv", num_requests=40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its first request at 2 s of 59: no shift to say
        batch = generate_requests(config, 0)
    stamps = expected["Timestamp"].to_numpy(float)
    np.testing.assert_array_equal(batch.arrival_s, stamps - stamps[0])
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
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its first request at 340 ms of 8.1 s: no shift to say
        batch = generate_requests(config, 0)
    start = rows[0]["timestamp"]
    np.testing.assert_array_equal(batch.arrival_s, [(r["timestamp"] - start) / 1000 for r in rows])
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
    with pytest.warns(InfersimWarning, match="hash_ids are not used: the prompts are drawn"):
        assert generate_requests(drawn, 0).prompt_hashes is None  # not the trace's prompts


def test_hashes_finer_than_hash_block_tokens_are_refused(tmp_path):
    """64 hashes for 1,024 tokens were hashed in blocks of 16, not Mooncake's 512: read
    as 512-token blocks they would claim 32,768 shared tokens."""
    path = tmp_path / "h16.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1]}\n'
        + json.dumps({"timestamp": 5, "input_length": 1024, "output_length": 4,
                      "hash_ids": list(range(64))}) + "\n"
    )  # fmt: skip
    with pytest.raises(InfersimError) as err:
        generate_requests(trace_workload(path, num_requests=2), 0)
    assert "h16.jsonl: line 2: 64 hash_ids for input_length 1,024, more than " \
        "ceil(1024 / arrivals.hash_block_tokens 512) = 2" in str(err.value)  # fmt: skip
    fine = trace_workload(path, arrivals={"hash_block_tokens": 16}, num_requests=2)
    assert generate_requests(fine, 0).prompt_hashes.covered.tolist() == [32, 1024]


def test_lengths_drawn_from_a_mooncake_trace_say_its_hashes_are_not_used():
    trace = {"kind": "trace", "path": str(SAMPLES / "mooncake_sample.jsonl")}
    config = validate_model(
        WorkloadConfig,
        {"arrivals": {"kind": "offline"}, "prompt_tokens": trace, "output_tokens": trace,
         "num_requests": 5},
        "scenario.yaml",
    )  # fmt: skip
    with pytest.warns(InfersimWarning, match="hash_ids are not used: lengths drawn from a trace"):
        assert generate_requests(config, 0).prompt_hashes is None


BURSTGPT_WITH_FAILURES = (
    "Timestamp,Model,Request tokens,Response tokens\n0,a,10,0\n2,a,12,5\n3,a,0,7\n4,a,14,6\n"
)


def test_zero_token_rows_are_dropped_and_counted(tmp_path):
    """BurstGPT logs a failed request with 0 response tokens: it is left out, and the
    run says how many were (it used to become a 1-token request silently)."""
    path = tmp_path / "bg.csv"
    path.write_text(BURSTGPT_WITH_FAILURES)
    with pytest.warns(InfersimWarning) as record:
        batch = generate_requests(trace_workload(path, num_requests=2), 0)
    assert "bg.csv: 2 of its 4 rows left out (1 with 0 'Response tokens', 1 with 0 " \
        "'Request tokens'" in str(record[0].message)  # fmt: skip
    assert batch.arrival_s.tolist() == [2.0, 4.0] and batch.prompt_tokens.tolist() == [12, 14]
    kept = generate_requests(trace_workload(path, num_requests=4, zero_token_rows="one_token"), 0)
    assert kept.prompt_tokens.tolist() == [10, 12, 1, 14]
    assert kept.output_tokens.tolist() == [1, 5, 7, 6]


def test_a_trace_of_only_zero_token_rows_is_refused(tmp_path):
    path = tmp_path / "bg.csv"
    path.write_text("Timestamp,Request tokens,Response tokens\n1,10,0\n2,11,0\n")
    with pytest.raises(InfersimError, match="every row has 0 tokens \\(2 with 0 'Response"):
        generate_requests(trace_workload(path, num_requests=1), 0)


def test_date_times_in_several_time_zones_are_instants(tmp_path):
    """A daylight-saving change mid-trace: two offsets, one clock (it used to be an
    internal ValueError); a row without a zone among zoned ones names no instant."""
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-03-26 01:59:00+01:00,10,5\n2023-03-26 03:00:30+02:00,10,5\n")  # fmt: skip
    assert generate_requests(trace_workload(path, num_requests=2), 0).arrival_s.tolist() == [0, 90]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:47+00:00,10,5\n2023-11-16 18:15:48,10,5\n")  # fmt: skip
    with pytest.raises(InfersimError) as err:
        generate_requests(trace_workload(path, num_requests=2), 0)
    assert str(err.value).endswith(
        "az.csv: line 3: TIMESTAMP: '2023-11-16 18:15:48' has no time zone, but line 2's "
        "'2023-11-16 18:15:47+00:00' has one; give every row a zone or none"
    )


def test_column_mapping_reads_any_csv():
    columns = {"arrival": "sent_ms", "prompt": "in_tok", "output": "out_tok", "time_unit": "ms"}
    config = trace_workload(
        SAMPLES / "custom_sample.csv", arrivals={"columns": columns}, num_requests=30
    )
    expected = pd.read_csv(SAMPLES / "custom_sample.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its first request at 1.468 s: no shift to say
        batch = generate_requests(config, 0)
    sent = expected["sent_ms"]
    np.testing.assert_allclose(batch.arrival_s, (sent - sent[0]) / 1000, rtol=1e-15)
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
            "bg.csv",
            "Timestamp,Request tokens,Response tokens\n0,1,1\n1,x,2\n",
            "line 3: Request tokens: not a number ('x')",
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


def test_a_file_fitting_two_layouts_says_which_it_is_read_as(tmp_path):
    path = tmp_path / "both.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,Timestamp,Request tokens,"
                    "Response tokens\n0,10,5,7,70,50\n")  # fmt: skip
    with pytest.warns(InfersimWarning, match="fit the layouts infersim and burstgpt: read as "
                      "infersim \\(arrived_at"):  # fmt: skip
        trace = read_trace(path, ["num_prefill_tokens"], arrivals=True)
    assert trace.tokens["num_prefill_tokens"].tolist() == [10]


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


def test_the_command_line_prints_a_warning_in_one_line(tmp_path, capsys):
    (tmp_path / "bg.csv").write_text(BURSTGPT_WITH_FAILURES)
    workload = {"arrivals": {"kind": "trace", "path": "bg.csv"}, "num_requests": 2}
    data = scenario_dict(workload=workload)
    for role in ("prompt_tokens", "output_tokens"):
        data["workload"].pop(role, None)
    (tmp_path / "s.yaml").write_text(json.dumps(data))
    code = main(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--quiet",
                 "--no-plots"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    # once in the summary's warning lines and once as an `infersim: warning:` line on
    # stderr, as a sentence, not Python's warning with its file and line
    assert sum("warning: " in line for line in out.splitlines()) == 1
    assert sum(line.startswith("infersim: warning: ") for line in err.splitlines()) == 1
    assert "bg.csv: 2 of its 4 rows left out" in " ".join(out.split())
    assert "UserWarning" not in out + err


def test_a_column_named_by_the_user_fits_no_layout_in_particular(tmp_path):
    """Reading one column by its own name ("b") is no reason to say the file fits every
    layout: nothing is ambiguous, so nothing is warned."""
    import warnings

    from simulator.workload.trace_layouts import detect_layout

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layout = detect_layout(tmp_path / "l.csv", ["a", "b"], ["b"])
    assert layout.name == "infersim"
