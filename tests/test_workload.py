import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hardware_models.errors import InfersimError
from hardware_models.yaml_io import validate_model
from simulator.workload import (
    ClosedLoopSampler,
    WorkloadConfig,
    generate_requests,
    read_trace,
)

SHARED_TRACES = Path(__file__).parents[1] / ".." / "shared" / "data" / "traces"
needs_shared = pytest.mark.skipif(
    not SHARED_TRACES.is_dir(), reason="../shared/data is absent (a fresh clone)"
)

FIXED_100 = {"kind": "fixed", "tokens": 100}


def workload(**fields) -> WorkloadConfig:
    data = {"prompt_tokens": FIXED_100, "output_tokens": FIXED_100, **fields}
    return validate_model(WorkloadConfig, data, "scenario.yaml")


def poisson(rate: float = 10.0, **fields) -> WorkloadConfig:
    return workload(arrivals={"kind": "poisson", "rate_per_s": rate}, **fields)


def cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


TRACE_CSV = (
    "arrived_at,num_prefill_tokens,num_decode_tokens\n"
    "0.0,100,10\n"
    "0.5,200,20\n"
    "1.5,300,30\n"
    "4.0,400,40\n"
)


# ---- arrivals ----------------------------------------------------------------------------


def test_poisson_rate_and_exponential_gaps():
    batch = generate_requests(poisson(rate=10.0, num_requests=20_000), seed=1)
    gaps = np.diff(batch.arrival_s, prepend=0.0)
    assert len(batch) / batch.arrival_s[-1] == pytest.approx(10.0, rel=0.03)
    assert cv(gaps) == pytest.approx(1.0, abs=0.03)
    assert np.all(gaps >= 0)


def test_gamma_cv_sets_burstiness():
    config = workload(arrivals={"kind": "gamma", "rate_per_s": 5.0, "cv": 3.0}, num_requests=50_000)
    gaps = np.diff(generate_requests(config, seed=2).arrival_s, prepend=0.0)
    assert cv(gaps) == pytest.approx(3.0, rel=0.08)
    assert 1 / gaps.mean() == pytest.approx(5.0, rel=0.08)


def test_constant_arrivals_are_exactly_periodic():
    config = workload(arrivals={"kind": "constant", "rate_per_s": 4.0}, num_requests=1000)
    arrival = generate_requests(config, seed=0).arrival_s
    np.testing.assert_allclose(arrival, np.arange(1, 1001) / 4.0, rtol=0, atol=1e-12)


def test_duration_alone_generates_until_the_horizon():
    batch = generate_requests(poisson(rate=200.0, duration_s=60.0), seed=3)
    assert batch.arrival_s[-1] < 60.0
    assert len(batch) == pytest.approx(200 * 60, rel=0.03)
    assert np.all(np.diff(batch.arrival_s) >= 0)


def test_constant_arrivals_stop_before_the_horizon():
    config = workload(arrivals={"kind": "constant", "rate_per_s": 2.0}, duration_s=10.0)
    arrival = generate_requests(config, seed=0).arrival_s
    assert len(arrival) == 19 and arrival[-1] == 9.5


@pytest.mark.parametrize(
    ("num_requests", "duration_s", "expected"), [(50, 1000.0, 50), (10**6, 5.0, None)]
)
def test_both_stop_conditions_whichever_first(num_requests, duration_s, expected):
    batch = generate_requests(poisson(num_requests=num_requests, duration_s=duration_s), seed=4)
    if expected is not None:
        assert len(batch) == expected
    else:
        assert batch.arrival_s[-1] < duration_s and len(batch) < 200


def test_absurd_open_loop_size_is_refused():
    with pytest.raises(InfersimError, match="open-loop limit"):
        generate_requests(poisson(rate=1e6, duration_s=1e6), seed=0)


def test_a_million_requests():
    config = poisson(
        rate=1000.0,
        num_requests=1_000_000,
        prompt_tokens={"kind": "lognormal", "mean": 1000, "std": 800},
        output_tokens={"kind": "lognormal", "mean": 200, "std": 200},
    )
    batch = generate_requests(config, seed=0)
    assert len(batch) == 1_000_000
    assert batch.prompt_tokens.dtype == np.int64 and batch.arrival_s.dtype == np.float64
    assert batch.output_tokens.min() >= 1


# ---- lengths -----------------------------------------------------------------------------


def lengths(spec: dict, n: int = 50_000, **fields) -> np.ndarray:
    batch = generate_requests(poisson(num_requests=n, prompt_tokens=spec, **fields), seed=5)
    return batch.prompt_tokens


def test_uniform_covers_both_ends():
    x = lengths({"kind": "uniform", "low": 10, "high": 20})
    assert x.min() == 10 and x.max() == 20
    assert x.mean() == pytest.approx(15, rel=0.01)


def test_normal_respects_clips():
    x = lengths({"kind": "normal", "mean": 500, "std": 200, "min": 300, "max": 700})
    assert x.min() == 300 and x.max() == 700
    assert x.mean() == pytest.approx(500, rel=0.02)


def test_lognormal_mean_and_std_are_of_the_lengths():
    x = lengths({"kind": "lognormal", "mean": 1000, "std": 600}, n=200_000)
    assert x.mean() == pytest.approx(1000, rel=0.01)
    assert x.std() == pytest.approx(600, rel=0.03)


def test_lognormal_clip():
    x = lengths({"kind": "lognormal", "mean": 1000, "std": 2000, "min": 50, "max": 4000})
    assert x.min() == 50 and x.max() == 4000


def test_length_scale_applies_after_the_draw():
    x = lengths(FIXED_100, n=10, prompt_length_scale=1.5)
    assert np.all(x == 150)


def test_sampled_lengths_are_at_least_one():
    x = lengths({"kind": "normal", "mean": 0, "std": 1}, n=1000, prompt_length_scale=0.1)
    assert x.min() == 1


def test_zero_output_tokens_is_rejected():
    with pytest.raises(InfersimError, match=r"output_tokens.*greater than or equal to 1"):
        poisson(num_requests=1, output_tokens={"kind": "fixed", "tokens": 0})


@pytest.mark.parametrize(
    ("policy", "prompt", "output", "expected"),
    [
        ("output_first", 3000, 2000, (3000, 1096)),
        ("output_first", 5000, 100, (4095, 1)),
        ("output_first", 1000, 100, (1000, 100)),
        ("proportional", 3000, 2000, (2457, 1638)),
    ],
)
def test_max_total_tokens(policy, prompt, output, expected):
    config = poisson(
        num_requests=3,
        prompt_tokens={"kind": "fixed", "tokens": prompt},
        output_tokens={"kind": "fixed", "tokens": output},
        max_total_tokens=4096,
        max_total_policy=policy,
    )
    batch = generate_requests(config, seed=0)
    assert (batch.prompt_tokens[0], batch.output_tokens[0]) == expected


def test_max_total_holds_for_random_lengths():
    config = poisson(
        num_requests=10_000,
        prompt_tokens={"kind": "lognormal", "mean": 3000, "std": 3000},
        output_tokens={"kind": "lognormal", "mean": 800, "std": 800},
        max_total_tokens=4096,
    )
    batch = generate_requests(config, seed=0)
    assert (batch.prompt_tokens + batch.output_tokens).max() <= 4096
    assert batch.prompt_tokens.min() >= 1 and batch.output_tokens.min() >= 1


# ---- priorities, determinism -------------------------------------------------------------


def test_priority_classes_follow_weights():
    classes = [
        {"name": "chat", "weight": 3, "priority": 0},
        {"name": "batch", "weight": 1, "priority": 5},
    ]
    batch = generate_requests(poisson(num_requests=40_000, priorities=classes), seed=0)
    assert batch.class_names == ("chat", "batch")
    assert np.mean(batch.priority_class == 0) == pytest.approx(0.75, abs=0.01)
    assert np.array_equal(batch.priority, np.where(batch.priority_class == 0, 0, 5))
    assert batch.priority.dtype == np.int8


def test_duplicate_class_names_are_rejected():
    with pytest.raises(InfersimError, match="duplicate class name"):
        poisson(num_requests=1, priorities=[{"name": "a"}, {"name": "a"}])


def test_same_seed_same_requests():
    config = poisson(num_requests=5000, prompt_tokens={"kind": "uniform", "low": 1, "high": 9})
    a, b = generate_requests(config, seed=7), generate_requests(config, seed=7)
    for field in ("arrival_s", "prompt_tokens", "output_tokens", "priority"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    c = generate_requests(config, seed=8)
    assert not np.array_equal(a.arrival_s, c.arrival_s)


def test_changing_one_distribution_keeps_the_other_draws():
    prompts = {"kind": "uniform", "low": 1, "high": 999}
    a = generate_requests(poisson(num_requests=2000, prompt_tokens=prompts), seed=7)
    b = generate_requests(
        poisson(
            num_requests=2000,
            prompt_tokens=prompts,
            output_tokens={"kind": "lognormal", "mean": 50, "std": 10},
        ),
        seed=7,
    )
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)


def test_batch_arrays_are_read_only():
    batch = generate_requests(poisson(num_requests=3), seed=0)
    with pytest.raises(ValueError):
        batch.prompt_tokens[0] = 5


def test_negative_seed_is_rejected():
    with pytest.raises(InfersimError, match="seed"):
        generate_requests(poisson(num_requests=3), seed=-1)


# ---- closed loop -------------------------------------------------------------------------


def closed_loop(**arrivals) -> WorkloadConfig:
    return workload(arrivals={"kind": "closed_loop", "users": 8, **arrivals}, num_requests=100)


def test_closed_loop_sampler():
    sampler = ClosedLoopSampler(closed_loop(think_time_s=2.0), seed=0)
    assert sampler.users == 8 and sampler.num_requests == 100 and sampler.duration_s is None
    think = sampler.think_time(20_000)
    assert think.mean() == pytest.approx(2.0, rel=0.03) and cv(think) == pytest.approx(1, abs=0.03)
    prompt, output = sampler.lengths(4)
    assert np.all(prompt == 100) and np.all(output == 100)
    priority, klass = sampler.classes(4)
    assert np.all(priority == 0) and sampler.class_names[klass[0]] == "default"


def test_closed_loop_constant_think_time():
    sampler = ClosedLoopSampler(closed_loop(think_time_s=0.5, think_distribution="constant"), 0)
    assert np.all(sampler.think_time(5) == 0.5)


def test_closed_loop_is_not_pre_generated():
    with pytest.raises(InfersimError, match="ClosedLoopSampler"):
        generate_requests(closed_loop(), seed=0)
    with pytest.raises(InfersimError, match="closed_loop"):
        ClosedLoopSampler(poisson(num_requests=1), seed=0)


# ---- config errors -----------------------------------------------------------------------


def test_no_stop_condition():
    with pytest.raises(InfersimError, match=r"scenario.yaml: .*num_requests and/or duration_s"):
        poisson()


def test_unknown_kind_suggests_the_closest():
    with pytest.raises(InfersimError, match=r"arrivals: unknown arrivals kind 'poison'.*'poisson'"):
        workload(arrivals={"kind": "poison", "rate_per_s": 1}, num_requests=1)
    with pytest.raises(InfersimError, match=r"prompt_tokens: unknown length kind 'lognorm'"):
        poisson(num_requests=1, prompt_tokens={"kind": "lognorm", "mean": 1, "std": 1})


def test_missing_kind_lists_the_kinds():
    with pytest.raises(InfersimError, match=r"arrivals: missing 'kind' \(one of: poisson"):
        workload(arrivals={"rate_per_s": 1}, num_requests=1)


def test_unknown_field_is_rejected():
    with pytest.raises(InfersimError, match=r"arrivals.poisson.rate: Extra inputs"):
        workload(arrivals={"kind": "poisson", "rate": 1}, num_requests=1)


def test_lengths_required_without_an_arrivals_trace():
    with pytest.raises(InfersimError, match="prompt_tokens is required"):
        validate_model(
            WorkloadConfig,
            {"arrivals": {"kind": "poisson", "rate_per_s": 1}, "num_requests": 1},
            "scenario.yaml",
        )


def test_a_trace_length_without_a_path_says_to_leave_it_out_for_the_arrivals_lengths():
    # `{kind: trace}` alone reads as "the arrivals trace's lengths", which leaving the
    # field out gives; the error says so instead of a bare "path: Field required".
    for role in ("prompt_tokens", "output_tokens"):
        with pytest.raises(
            InfersimError,
            match=rf"{role}.trace: path is required .*arrivals trace row by row, leave "
            r"prompt_tokens/output_tokens out",
        ):
            validate_model(
                WorkloadConfig,
                {
                    "arrivals": {"kind": "trace", "path": "t.csv"},
                    role: {"kind": "trace"},
                    "num_requests": 1,
                },
                "scenario.yaml",
            )


def test_uniform_bounds_ordered():
    with pytest.raises(InfersimError, match=r"high \(5\) is below low \(9\)"):
        poisson(num_requests=1, prompt_tokens={"kind": "uniform", "low": 9, "high": 5})


# ---- traces ------------------------------------------------------------------------------


def trace_workload(path: Path, **fields) -> WorkloadConfig:
    data = {"arrivals": {"kind": "trace", "path": path.name}, **fields}
    return validate_model(WorkloadConfig, data, "scenario.yaml")


def test_trace_replay_with_time_scale(tmp_path):
    path = write(tmp_path, "t.csv", TRACE_CSV)
    config = trace_workload(path, num_requests=4)
    config = config.model_copy(
        update={"arrivals": config.arrivals.model_copy(update={"time_scale": 2.0})}
    )
    batch = generate_requests(config, seed=0, base_dir=tmp_path)
    np.testing.assert_array_equal(batch.arrival_s, [0.0, 1.0, 3.0, 8.0])
    np.testing.assert_array_equal(batch.prompt_tokens, [100, 200, 300, 400])
    np.testing.assert_array_equal(batch.output_tokens, [10, 20, 30, 40])


def test_trace_replay_stops_at_duration(tmp_path):
    write(tmp_path, "t.csv", TRACE_CSV)
    batch = generate_requests(trace_workload(tmp_path / "t.csv", duration_s=1.5), 0, tmp_path)
    np.testing.assert_array_equal(batch.arrival_s, [0.0, 0.5])


def test_a_trace_replay_without_a_stop_condition_replays_the_whole_trace(tmp_path):
    """A trace's last row is its natural end: neither num_requests nor duration_s needed."""
    write(tmp_path, "t.csv", TRACE_CSV)
    batch = generate_requests(trace_workload(tmp_path / "t.csv"), 0, tmp_path)
    np.testing.assert_array_equal(batch.arrival_s, [0.0, 0.5, 1.5, 4.0])


def test_a_run_on_a_trace_without_a_stop_condition_serves_every_row(make_scenario, tmp_path):
    from simulator.simulation import simulate

    path = write(tmp_path, "t.csv", TRACE_CSV)
    workload = {"arrivals": {"kind": "trace", "path": str(path)}, "prompt_tokens": None,
                "output_tokens": None, "num_requests": None, "duration_s": None}  # fmt: skip
    results = simulate(make_scenario(workload=workload))
    assert (results.requests["outcome"] == "completed").sum() == 4
    assert "trace (to its end)" in results.summary_table()


def test_trace_shorter_than_num_requests(tmp_path):
    write(tmp_path, "t.csv", TRACE_CSV)
    with pytest.raises(InfersimError, match=r"t.csv: the trace has 4 requests, fewer than"):
        generate_requests(trace_workload(tmp_path / "t.csv", num_requests=5), 0, tmp_path)


def test_trace_arrivals_with_synthetic_output(tmp_path):
    write(tmp_path, "t.csv", TRACE_CSV)
    config = trace_workload(tmp_path / "t.csv", num_requests=4, output_tokens=FIXED_100)
    batch = generate_requests(config, 0, tmp_path)
    np.testing.assert_array_equal(batch.prompt_tokens, [100, 200, 300, 400])
    assert np.all(batch.output_tokens == 100)


def test_trace_lengths_keep_prompt_output_pairs(tmp_path):
    write(
        tmp_path,
        "l.csv",
        "num_prefill_tokens,num_decode_tokens\n"
        + "".join(f"{10 * i},{i}\n" for i in range(1, 200)),
    )
    trace = {"kind": "trace", "path": "l.csv"}
    config = poisson(num_requests=5000, prompt_tokens=trace, output_tokens=trace)
    batch = generate_requests(config, seed=0, base_dir=tmp_path)
    assert np.array_equal(batch.prompt_tokens, 10 * batch.output_tokens)
    assert len(np.unique(batch.output_tokens)) > 150


def test_trace_length_column_option(tmp_path):
    write(tmp_path, "l.csv", "a,b\n5,7\n")
    config = poisson(
        num_requests=3, prompt_tokens={"kind": "trace", "path": "l.csv", "column": "b"}
    )
    assert np.all(generate_requests(config, 0, tmp_path).prompt_tokens == 7)


def test_jsonl_matches_csv(tmp_path):
    csv_trace = read_trace(
        write(tmp_path, "t.csv", TRACE_CSV), ["num_prefill_tokens"], arrivals=True
    )
    rows = pd.read_csv(tmp_path / "t.csv").to_dict("records")
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    jsonl_trace = read_trace(
        write(tmp_path, "t.jsonl", text), ["num_prefill_tokens"], arrivals=True
    )
    assert len(jsonl_trace) == 4
    np.testing.assert_array_equal(csv_trace.arrived_at, jsonl_trace.arrived_at)
    np.testing.assert_array_equal(
        csv_trace.tokens["num_prefill_tokens"], jsonl_trace.tokens["num_prefill_tokens"]
    )


@needs_shared
@pytest.mark.shared_data
def test_azure_conv_replay_reproduces_the_file():
    expected = pd.read_csv(SHARED_TRACES / "azure_conv_2023.csv")
    config = trace_workload(SHARED_TRACES / "azure_conv_2023.csv", num_requests=len(expected))
    batch = generate_requests(config, seed=0, base_dir=SHARED_TRACES)
    np.testing.assert_array_equal(batch.arrival_s, expected["arrived_at"].to_numpy())
    np.testing.assert_array_equal(batch.prompt_tokens, expected["num_prefill_tokens"].to_numpy())
    np.testing.assert_array_equal(batch.output_tokens, expected["num_decode_tokens"].to_numpy())


@needs_shared
@pytest.mark.shared_data
def test_azure_conv_clipped_to_4096():
    config = trace_workload(
        SHARED_TRACES / "azure_conv_2023.csv", duration_s=3600.0, max_total_tokens=4096
    )
    batch = generate_requests(config, seed=0, base_dir=SHARED_TRACES)
    assert len(batch) == 19_366
    assert (batch.prompt_tokens + batch.output_tokens).max() == 4096


@needs_shared
@pytest.mark.shared_data
def test_lengths_only_trace_cannot_give_arrivals():
    config = trace_workload(SHARED_TRACES / "arxiv_summarization_lengths.csv", num_requests=1)
    with pytest.raises(InfersimError, match="lengths-only trace"):
        generate_requests(config, seed=0, base_dir=SHARED_TRACES)


HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
JSON_ROW = '{"arrived_at": 0, "num_prefill_tokens": 1, "num_decode_tokens": 1}\n'


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.csv", None, "no such trace file"),
        ("empty.csv", "", "file is empty"),
        ("header.csv", HEADER, "no data rows"),
        (
            "cols.csv",
            "arrived_at,num_prefill_tokens\n0,1\n",
            "missing column(s) 'num_decode_tokens'",
        ),
        (
            "bad.csv",
            HEADER + "0,1,1\n1,2,2\n2,3,3\n3,x4,4\n",
            "line 5: num_prefill_tokens: not a number ('x4')",
        ),
        ("blank.csv", HEADER + "0,1,1\n1,,2\n", "line 3: num_prefill_tokens: not a number (empty)"),
        ("neg.csv", HEADER + "0,1,1\n1,2,-2\n", "line 3: num_decode_tokens: -2 is negative"),
        ("nan.csv", HEADER + "0,1,1\nnan,2,2\n", "line 3: arrived_at: nan is not finite"),
        ("inf.csv", HEADER + "0,inf,1\n", "line 2: num_prefill_tokens: inf is not finite"),
        ("frac.csv", HEADER + "0,1.5,1\n", "line 2: num_prefill_tokens: 1.5 is not a whole number"),
        (
            "short.csv",
            HEADER + "0,1,1\n1,2",
            "line 3: expected 3 fields (arrived_at, num_prefill_tokens, num_decode_tokens), "
            "got 2 (truncated last line?)",
        ),
        ("utf.csv", HEADER.encode() + b"0,1,1\n1,\xff2,2\n", "line 3: not UTF-8"),
        (
            "t.jsonl",
            JSON_ROW + '{"arrived_at": 1, "num_pre',
            "line 2: invalid JSON",
        ),
        (
            "s.jsonl",
            JSON_ROW + '{"arrived_at": 1, "num_prefill_tokens": "2", "num_decode_tokens": 1}\n',
            "line 2: num_prefill_tokens: not a number ('2')",
        ),
        (
            "k.jsonl",
            JSON_ROW + '\n{"arrived_at": 1, "num_prefill_tokens": 2}\n',
            "line 3: missing field 'num_decode_tokens'",
        ),
        (
            "n.jsonl",
            '{"arrived_at": NaN, "num_prefill_tokens": 1, "num_decode_tokens": 1}\n',
            "line 1: arrived_at: nan is not finite",
        ),
        ("trace.parquet", "x", "unknown trace format '.parquet'"),
    ],
)
def test_malformed_traces(tmp_path, name, content, message):
    if content is not None:
        write(tmp_path, name, content)
    with pytest.raises(InfersimError) as err:
        read_trace(tmp_path / name, ["num_prefill_tokens", "num_decode_tokens"], arrivals=True)
    assert str(err.value).startswith(str(tmp_path / name))
    assert message in str(err.value)


def test_blank_csv_rows_are_skipped_and_lines_still_count(tmp_path):
    """An empty line and a row of blank cells (spaces, a tab) are not requests; the rows
    after them are, and a message names their own file line."""
    write(tmp_path, "t.csv", HEADER + "0,1,1\n\n , ,\t\n1,2,2\n2,x,3\n")
    with pytest.raises(InfersimError, match=r"t.csv: line 6: num_prefill_tokens"):
        read_trace(tmp_path / "t.csv", ["num_prefill_tokens"], arrivals=True)
    write(tmp_path, "ok.csv", HEADER + "0,1,1\n\n , ,\t\n1,2,2\n")
    trace = read_trace(tmp_path / "ok.csv", ["num_prefill_tokens"], arrivals=True)
    assert trace.tokens["num_prefill_tokens"].tolist() == [1, 2]
    assert [trace.line(0), trace.line(1)] == [2, 5]


def test_bad_trace_reported_through_the_workload(tmp_path):
    write(tmp_path, "t.csv", HEADER + "0,1,1\n1,2,2\n2,3,3\n3,x4,4\n")
    with pytest.raises(InfersimError, match=r"t.csv: line 5: num_prefill_tokens"):
        generate_requests(trace_workload(tmp_path / "t.csv", num_requests=1), 0, tmp_path)
