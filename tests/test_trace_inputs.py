"""Traces as users' own logs write them: absolute clocks (Unix time), rows written as
requests complete (out of arrival order), date-times and nested token counts in JSONL,
and the messages when the columns are not what was assumed."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.yaml_io import validate_model
from simulator.cli.main import main
from simulator.scenario import Scenario
from simulator.workload import WorkloadConfig, generate_requests, read_trace
from tests.conftest import scenario_dict

ROOT = Path(__file__).resolve().parents[1]

UNIX_START = 1_733_011_200  # 2024-12-01 00:00:00 UTC
GAPS = [0.0, 0.311, 0.363, 1.5]
PROMPTS = [377, 1656, 1870, 20]
OUTPUTS = [152, 143, 151, 9]


def workload(path: Path, columns: dict | None = None, **fields) -> WorkloadConfig:
    arrivals = {"kind": "trace", "path": str(path)}
    if columns:
        arrivals["columns"] = columns
    return validate_model(WorkloadConfig, {"arrivals": arrivals, **fields}, "scenario.yaml")


def openai_csv(tmp_path: Path, scale: int = 1, name: str = "openai.csv") -> Path:
    """Rows as an OpenAI-style usage export writes them: `created` on an absolute clock."""
    rows = "".join(
        f"{round((UNIX_START + gap) * scale, 3)},m,{p},{o}\n"
        for gap, p, o in zip(GAPS, PROMPTS, OUTPUTS, strict=True)
    )
    path = tmp_path / name
    path.write_text("created,model,prompt_tokens,completion_tokens\n" + rows)
    return path


OPENAI = {"arrival": "created", "prompt": "prompt_tokens", "output": "completion_tokens"}


# ---- 1. an absolute clock is counted from the first request ---------------------------------


@pytest.mark.parametrize(("scale", "unit"), [(1, "s"), (1000, "ms")])
def test_unix_time_is_counted_from_the_first_request_and_said(tmp_path, scale, unit):
    """Unix seconds (or ms) used as-is made a 55-year run at 0.0000002 req/s."""
    path = openai_csv(tmp_path, scale)
    config = workload(path, {**OPENAI, "time_unit": unit}, num_requests=4)
    with pytest.warns(InfersimWarning) as record:
        batch = generate_requests(config, 0)
    np.testing.assert_allclose(batch.arrival_s, GAPS, rtol=0, atol=1e-6)
    assert batch.arrival_s[0] == 0.0
    (message,) = [str(w.message) for w in record]
    assert "replayed from its earliest request (created " in message
    assert "line 2, is t = 0): every arrival 1,733,011,200 s (54.9 years) earlier" in message


def test_integer_milliseconds_stay_exact_after_the_shift(tmp_path):
    path = tmp_path / "ms.csv"
    path.write_text("ts,p,o\n1733011200029,1,1\n1733011200340,1,1\n")
    columns = {"arrival": "ts", "prompt": "p", "output": "o", "time_unit": "ms"}
    with pytest.warns(InfersimWarning, match="1,733,011,200.029 s"):
        batch = generate_requests(workload(path, columns, num_requests=2), 0)
    assert batch.arrival_s.tolist() == [0.0, 0.311]


def test_a_small_material_shift_is_said_in_its_own_digits(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.00025,5,5\n0.001,6,6\n")
    with pytest.warns(InfersimWarning, match=r"every arrival 0\.00025 s earlier"):
        batch = generate_requests(workload(path, num_requests=2), 0)
    assert batch.arrival_s.tolist() == [0.0, 0.001 - 0.00025]


@pytest.mark.parametrize(
    ("first", "said"),
    [
        (0.34279452741857913, False),  # one gap after 0, as infersim's own bench JSON
        (1.0, False),  # 1 s idle of 11 s: 9%
        (1.2, True),  # 1.2 s of 11.2 s: 11%, more than SHIFT_SAID_SHARE
    ],
)
def test_a_shift_is_said_only_where_it_is_material(tmp_path, first, said):
    """A trace starting one inter-arrival gap after 0 (a Poisson trace) is replayed from its
    first request without a word; a shift leaving more than a tenth of the run idle is
    said, its numbers written for people."""
    path = tmp_path / "t.csv"
    rows = "".join(f"{first + t},5,5\n" for t in (0, 5, 10))
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        batch = generate_requests(workload(path, num_requests=3), 0)
    assert batch.arrival_s.tolist() == pytest.approx([0.0, 5.0, 10.0])
    shifts = [str(w.message) for w in record if "earlier than the file writes" in str(w.message)]
    assert len(shifts) == said
    if said:
        assert "(arrived_at 1.2 s, line 2, is t = 0): every arrival 1.2 s earlier" in shifts[0]


def test_the_shipped_mooncake_sample_replays_without_a_shift_warning():
    """Its first request at 340 ms, of 7.75 s of requests: said before, for nothing."""
    scenario = Scenario.from_yaml(ROOT / "scenarios" / "mooncake-prefix-cache.yaml")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        generate_requests(scenario.workload, scenario.seed, ROOT / "scenarios")
    assert not [w for w in record if "earlier than the file writes" in str(w.message)]


def test_a_trace_starting_at_zero_is_read_as_written_without_a_word(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n0.25,6,6\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = generate_requests(workload(path, num_requests=2), 0)
    assert batch.arrival_s.tolist() == [0.0, 0.25]


def test_duration_counts_from_the_first_request(tmp_path):
    path = openai_csv(tmp_path)
    config = workload(path, OPENAI, duration_s=1.0)
    with pytest.warns(InfersimWarning, match="earlier than the file writes it"):
        assert len(generate_requests(config, 0)) == 3


def test_the_run_says_the_shift_and_reports_the_real_rate(tmp_path, capsys):
    openai_csv(tmp_path)
    data = scenario_dict(workload={"arrivals": {"kind": "trace", "path": "openai.csv",
                                                "columns": OPENAI}})  # fmt: skip
    for role in ("prompt_tokens", "output_tokens", "num_requests", "duration_s"):
        data["workload"].pop(role, None)
    (tmp_path / "s.yaml").write_text(json.dumps(data))
    code = main(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--no-plots"])
    out, err = capsys.readouterr()
    assert code == 0, err
    text = " ".join(out.split())
    assert "every arrival 1,733,011,200 s (54.9 years) earlier than the file writes it" in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["run"]["duration_s"] < 60  # not 1.7e9 s
    assert any("54.9 years" in w for w in summary["warnings"])


# ---- 2. date-times in JSONL -----------------------------------------------------------------


def test_jsonl_date_times_read_as_the_same_csv(tmp_path):
    stamps = ["2026-11-30T12:00:00.028858+00:00", "2026-11-30T12:00:00.339776+00:00"]
    (tmp_path / "t.jsonl").write_text("".join(
        json.dumps({"sent_at": s, "p": 10, "o": 5}) + "\n" for s in stamps))  # fmt: skip
    (tmp_path / "t.csv").write_text("sent_at,p,o\n" + "".join(f"{s},10,5\n" for s in stamps))
    columns = {"arrival": "sent_at", "prompt": "p", "output": "o", "time_unit": "datetime"}
    jsonl = generate_requests(workload(tmp_path / "t.jsonl", columns, num_requests=2), 0)
    csv = generate_requests(workload(tmp_path / "t.csv", columns, num_requests=2), 0)
    np.testing.assert_array_equal(jsonl.arrival_s, csv.arrival_s)
    assert jsonl.arrival_s.tolist() == [0.0, 0.310918]


def test_a_jsonl_number_is_not_a_date_time(tmp_path):
    """pandas would read 5 as 5 ns after 1970: it is refused, with its line."""
    (tmp_path / "t.jsonl").write_text('{"t": "2026-11-30T12:00:00", "p": 1, "o": 1}\n'
                                      '{"t": 5, "p": 1, "o": 1}\n')  # fmt: skip
    columns = {"arrival": "t", "prompt": "p", "output": "o", "time_unit": "datetime"}
    with pytest.raises(InfersimError, match=r"t.jsonl: line 2: t: not a date and time \(5\)"):
        generate_requests(workload(tmp_path / "t.jsonl", columns, num_requests=2), 0)


# ---- 3. rows out of arrival order -----------------------------------------------------------


def test_rows_out_of_order_are_sorted_stably_and_said(tmp_path):
    path = tmp_path / "done.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    "0,10,1\n2,20,2\n1,30,3\n2,40,4\n0.5,50,5\n")  # fmt: skip
    with pytest.warns(InfersimWarning) as record:
        trace = read_trace(path, ["num_prefill_tokens"], arrivals=True)
    assert trace.arrived_at.tolist() == [0, 0.5, 1, 2, 2]
    assert trace.tokens["num_prefill_tokens"].tolist() == [10, 50, 30, 20, 40]  # 20 before 40
    assert [trace.line(i) for i in range(5)] == [2, 6, 4, 3, 5]
    (message,) = [str(w.message) for w in record]
    assert message.endswith(
        "done.csv: 2 of its 5 rows arrive before a row above them (first: line 4, arrived_at "
        "1, before line 3's 2): replayed in order of arrived_at, rows of equal times in file "
        "order"
    )


def test_sorted_rows_keep_their_block_hashes_and_date_times(tmp_path):
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'
        '{"timestamp": 900, "input_length": 700, "output_length": 2, "hash_ids": [3, 4]}\n'
        '{"timestamp": 400, "input_length": 100, "output_length": 3, "hash_ids": [5]}\n'
    )
    with pytest.warns(InfersimWarning, match="1 of its 3 rows arrive before"):
        batch = generate_requests(workload(mooncake, num_requests=3), 0)
    assert batch.arrival_s.tolist() == [0, 0.4, 0.9]
    assert [list(ids) for ids in batch.prompt_hashes.ids] == [[1, 2], [5], [3, 4]]
    azure = tmp_path / "az.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46,1,1\n2023-11-16 18:15:45,2,2\n")  # fmt: skip
    with pytest.warns(InfersimWarning, match="line 3, TIMESTAMP 2023-11-16 18:15:45, before"):
        batch = generate_requests(workload(azure, num_requests=2), 0)
    assert batch.arrival_s.tolist() == [0, 1] and batch.prompt_tokens.tolist() == [2, 1]


# ---- 4. nested token counts -----------------------------------------------------------------


def test_dotted_columns_reach_into_nested_jsonl_objects(tmp_path):
    path = tmp_path / "usage.jsonl"
    path.write_text("".join(
        json.dumps({"created": UNIX_START + gap, "usage": {"prompt_tokens": p,
                    "completion_tokens": o, "total_tokens": p + o}}) + "\n"
        for gap, p, o in zip(GAPS, PROMPTS, OUTPUTS, strict=True)))  # fmt: skip
    columns = {"arrival": "created", "prompt": "usage.prompt_tokens",
               "output": "usage.completion_tokens"}  # fmt: skip
    with pytest.warns(InfersimWarning, match="earlier than the file writes it"):
        batch = generate_requests(workload(path, columns, num_requests=4), 0)
    assert batch.prompt_tokens.tolist() == PROMPTS and batch.output_tokens.tolist() == OUTPUTS
    columns["output"] = "usage.completion"
    with pytest.raises(InfersimError) as err:
        generate_requests(workload(path, columns, num_requests=4), 0)
    assert str(err.value).endswith(
        "usage.jsonl: no column 'usage.completion' (from arrivals.columns); its columns: "
        "created, usage.prompt_tokens, usage.completion_tokens, usage.total_tokens"
    )


USAGE = {"arrival": "created", "prompt": "usage.prompt_tokens",
         "output": "usage.completion_tokens"}  # fmt: skip


def _usage_log(tmp_path: Path, error_row: dict) -> Path:
    """The OpenAI usage log of GAPS, PROMPTS and OUTPUTS with `error_row` third."""
    rows = [{"created": UNIX_START + gap, "usage": {"prompt_tokens": p, "completion_tokens": o}}
            for gap, p, o in zip(GAPS, PROMPTS, OUTPUTS, strict=True)]  # fmt: skip
    rows.insert(2, {"created": UNIX_START + 1, **error_row})
    path = tmp_path / "usage.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize(
    "error_row",
    [{"object": "error", "error": {"message": "rate limited"}}, {"usage": None}],
)
def test_rows_without_token_counts_are_left_out_and_counted(tmp_path, error_row):
    """An error response logged without `usage` (or with `usage: null`) has no lengths to
    replay: left out, said once, the rest replayed."""
    path = _usage_log(tmp_path, error_row)
    with pytest.warns(InfersimWarning) as record:
        batch = generate_requests(workload(path, USAGE, num_requests=4), 0)
    assert batch.prompt_tokens.tolist() == PROMPTS and batch.output_tokens.tolist() == OUTPUTS
    (said,) = [str(w.message) for w in record if "left out" in str(w.message)]
    assert said.endswith(
        "usage.jsonl: 1 of its 5 rows have no usage.prompt_tokens or usage.completion_tokens "
        "(first: line 3; an error response is logged without token counts) and are left out"
    )


@pytest.mark.parametrize(
    ("usage", "needle"),
    [
        ({"prompt_tokens": 5}, "line 3: missing field 'usage.completion_tokens'"),
        ({"prompt_tokens": 5, "completion_tokens": "7x"}, "line 3: usage.completion_tokens: not"),
    ],
)
def test_a_row_with_some_lengths_or_a_malformed_one_is_still_an_error(tmp_path, usage, needle):
    path = _usage_log(tmp_path, {"usage": usage})
    with pytest.raises(InfersimError, match=needle):
        generate_requests(workload(path, USAGE, num_requests=4), 0)


def test_a_log_without_token_counts_in_any_row_names_its_columns(tmp_path):
    path = tmp_path / "usage.jsonl"
    path.write_text("".join(json.dumps({"created": UNIX_START + g}) + "\n" for g in GAPS))
    with pytest.raises(InfersimError, match=r"no columns 'usage\.prompt_tokens', 'usage\.comp"):
        generate_requests(workload(path, USAGE, num_requests=4), 0)


def test_a_later_object_missing_a_nested_count_names_its_line(tmp_path):
    path = tmp_path / "usage.jsonl"
    path.write_text('{"t": 0, "usage": {"p": 1, "o": 1}}\n{"t": 1, "usage": {"p": 1}}\n')
    columns = {"arrival": "t", "prompt": "usage.p", "output": "usage.o"}
    with pytest.raises(InfersimError, match=r"usage\.jsonl: line 2: missing field 'usage\.o'"):
        generate_requests(workload(path, columns, num_requests=2), 0)


# ---- 5. a vLLM bench serve result -------------------------------------------------------


def bench_file(tmp_path: Path, **changes) -> Path:
    """A result as `vllm bench serve --save-result --save-detailed` writes it (the keys
    `infersim replay` reads), its send times on the client's clock."""
    data = {
        "request_rate": 4.0,
        "burstiness": 1.0,
        "input_lens": PROMPTS,
        "output_lens": OUTPUTS,
        "ttfts": [0.05] * 4,
        "itls": [[0.02] * (n - 1) for n in OUTPUTS],
        "errors": [""] * 4,
        "start_times": [1000.0 + gap for gap in GAPS],
        **changes,
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    return path


def test_a_bench_result_with_start_times_is_a_trace(tmp_path):
    config = workload(bench_file(tmp_path), num_requests=4)
    with pytest.warns(InfersimWarning, match=r"start_times 1,000 s, request 0, is t = 0"):
        batch = generate_requests(config, 0)
    np.testing.assert_allclose(batch.arrival_s, GAPS, rtol=0, atol=1e-12)
    assert batch.prompt_tokens.tolist() == PROMPTS and batch.output_tokens.tolist() == OUTPUTS


def test_failed_requests_of_a_bench_result_are_left_out_and_said(tmp_path):
    path = bench_file(tmp_path, errors=["", "Connection reset", "", ""],
                      output_lens=[152, 0, 151, 9], start_times=GAPS)  # fmt: skip
    with pytest.warns(InfersimWarning, match="1 of its 4 requests failed"):
        batch = generate_requests(workload(path, num_requests=3), 0)
    assert batch.arrival_s.tolist() == [0.0, 0.363, 1.5]
    assert batch.prompt_tokens.tolist() == [377, 1870, 20]


def test_a_bench_result_without_start_times_gives_lengths_not_arrivals(tmp_path):
    """An older vLLM saves only the rate the send times were drawn from: drawing them
    again is `infersim replay`'s job (it says so); a trace replay refuses."""
    path = bench_file(tmp_path, start_times=None)
    with pytest.raises(InfersimError) as err:
        generate_requests(workload(path, num_requests=4), 0)
    message = str(err.value)
    assert "bench.json: this vLLM bench serve result records no send times (no " \
        "'start_times'" in message and "`infersim replay`" in message  # fmt: skip
    lengths = {"kind": "trace", "path": str(path)}
    config = validate_model(
        WorkloadConfig,
        {"arrivals": {"kind": "poisson", "rate_per_s": 2.0}, "prompt_tokens": lengths,
         "output_tokens": lengths, "num_requests": 50},
        "scenario.yaml",
    )  # fmt: skip
    batch = generate_requests(config, 0)
    assert set(zip(batch.prompt_tokens, batch.output_tokens, strict=True)) <= set(
        zip(PROMPTS, OUTPUTS, strict=True)
    )


def test_a_bench_result_saved_without_detail_is_refused(tmp_path):
    path = bench_file(tmp_path, input_lens=None, output_lens=None, start_times=None)
    with pytest.raises(InfersimError, match="not a vLLM bench serve result saved with"):
        read_trace(path, ["num_prefill_tokens"])


def test_a_bench_result_takes_no_column_mapping_and_names_its_columns(tmp_path):
    path = bench_file(tmp_path)
    with pytest.raises(InfersimError, match=r"arrivals\.columns does not apply to a vLLM bench"):
        generate_requests(workload(path, OPENAI, num_requests=4), 0)
    with pytest.raises(InfersimError) as err:
        read_trace(path, ["ttfts"])
    assert str(err.value).endswith(
        "bench.json: no column 'ttfts': as a trace, a vLLM bench "
        "serve result gives input_lens, output_lens, start_times"
    )


def test_a_run_written_as_a_bench_result_replays_as_a_trace(tmp_path):
    """`infersim run --bench-json` (vLLM's format) read back as a trace: the same
    requests at the same times."""
    (tmp_path / "s.yaml").write_text(json.dumps(scenario_dict(workload={
        "num_requests": 12, "arrivals": {"kind": "poisson", "rate_per_s": 4.0}})))  # fmt: skip
    bench = tmp_path / "b.json"
    args = ["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--quiet"]
    assert main([*args, "--no-plots", "--bench-json", str(bench)]) == 0
    data = json.loads(bench.read_text())
    trace = read_trace(bench, ["num_prefill_tokens", "num_decode_tokens"], arrivals=True)
    starts = np.asarray(data["start_times"])
    np.testing.assert_allclose(trace.arrived_at, starts - starts.min(), rtol=0, atol=1e-12)
    assert trace.tokens["num_prefill_tokens"].tolist() == data["input_lens"]
    assert trace.tokens["num_decode_tokens"].tolist() == data["output_lens"]


# ---- 6. what was assumed, and what the file has ---------------------------------------------


def test_a_layout_assumed_from_one_column_is_named_with_the_columns_found(tmp_path):
    """`timestamp` alone made this file Mooncake's, and the error only listed Mooncake's
    missing columns."""
    path = tmp_path / "flat.jsonl"
    path.write_text('{"timestamp": "2026-11-30T12:00:00", "prompt_tokens": 3, '
                    '"completion_tokens": 4}\n')  # fmt: skip
    with pytest.raises(InfersimError) as err:
        generate_requests(workload(path, num_requests=1), 0)
    assert str(err.value).endswith(
        "flat.jsonl: missing column(s) 'input_length', 'output_length' of the mooncake "
        "(timestamp, input_length, output_length, hash_ids) layout, assumed from its "
        "column(s) 'timestamp' (found: timestamp, prompt_tokens, completion_tokens); or name "
        "the columns with a mapping (arrivals.columns: {arrival, prompt, output, time_unit}; "
        "for trace lengths, `column`)"
    )


def test_a_mistyped_arrival_column_lists_the_columns_found(tmp_path):
    path = openai_csv(tmp_path)
    with pytest.raises(InfersimError) as err:
        generate_requests(workload(path, {**OPENAI, "arrival": "created_at"}, num_requests=1), 0)
    message = str(err.value)
    assert message.endswith(
        "openai.csv: no column 'created_at' (from arrivals.columns); its columns: "
        "created, model, prompt_tokens, completion_tokens"
    )
    assert "lengths-only" not in message


def test_a_lengths_only_trace_still_says_so_with_its_columns(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n5,5\n")
    with pytest.raises(InfersimError) as err:
        generate_requests(workload(path, num_requests=1), 0)
    assert "lengths.csv: no 'arrived_at' column (found: num_prefill_tokens, num_decode_tokens)" \
        ": a lengths-only trace can give prompt/output lengths but not arrivals" \
        in str(err.value)  # fmt: skip


def test_the_shipped_openai_usage_sample_replays_as_documented():
    """scenarios/openai-usage-log.yaml: a log written at completion, on the Unix clock,
    with nested counts (the README quotes its two warnings)."""
    from simulator.scenario import Scenario

    scenario = Scenario.from_yaml(Path(__file__).parents[1] / "scenarios/openai-usage-log.yaml")
    with pytest.warns(InfersimWarning) as record:
        batch = generate_requests(scenario.workload, 0, scenario.base_dir)
    messages = [str(w.message) for w in record]
    assert "3 of its 30 rows arrive before a row above them (first: line 14, created " \
        "1733011215, before line 12's 1733011216)" in messages[0]  # fmt: skip
    assert "every arrival 1,733,011,200 s (54.9 years) earlier" in messages[1]
    assert len(batch) == 30 and batch.arrival_s[0] == 0 and np.all(np.diff(batch.arrival_s) >= 0)
