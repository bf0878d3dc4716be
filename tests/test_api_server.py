"""vLLM's API server front end (simulator.api_server): the FIFO mechanics on hand-computed
cases, off changes nothing, a saturated front end caps throughput at its processes' rate,
the warning when it is left out, its refusals, and multi-step runs staying exact."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from pytest import approx

from hardware_models.errors import InfersimError, InfersimWarning
from simulator.api_server import ClientView, fifo_done, ingested, instances, unmodelled_load
from simulator.display import summary_html
from simulator.engine.requests import Outcome, RequestTable
from simulator.engine.step_log import GAP_COLUMNS
from simulator.metrics.summary import _frontend_warnings
from simulator.metrics.terminal import summary_table
from simulator.scenario import FrontendSection
from simulator.simulation import simulate

# saturating the front end is these tests' point; each checks the warning where it matters
pytestmark = pytest.mark.filterwarnings("ignore:the busiest replica.s API server processes")
ON = {"kind": "vllm_api_server"}
OFFLINE = {  # every request at once, as benchmark_serving.py's request rate inf
    "arrivals": {"kind": "offline"},
    "prompt_tokens": {"kind": "fixed", "tokens": 128},
    "output_tokens": {"kind": "fixed", "tokens": 100},
    "num_requests": 200,
}


def test_fifo_done_is_the_queue_recurrence():
    # done_k = max(done_k-1, arrive_k) + work_k: 1, 1 + 2, 3 + 0.5, then idle until 5
    done = fifo_done(np.array([0.0, 0.0, 1.0, 5.0]), np.array([1.0, 2.0, 0.5, 1.0]))
    assert done.tolist() == [1.0, 3.0, 3.5, 6.0]


def test_ingest_round_robin_over_processes():
    arrival = np.zeros(3)
    prompt = np.array([100, 0, 1000])
    # 500 us a request + 1 us a prompt token: 0.6, 0.5 and 1.5 ms of work
    one = FrontendSection(kind="vllm_api_server", request_us=500, prompt_token_us=1)
    assert ingested(one, arrival, prompt, replicas=1) * 1e3 == approx([0.6, 1.1, 2.6])
    # two processes: 0 and 2 on the first (0.6, 2.1), 1 on the second (0.5), each its own
    # FIFO: the second request overtakes the first
    two = one.model_copy(update={"api_server_count": 2})
    assert ingested(two, arrival, prompt, replicas=1) * 1e3 == approx([0.6, 0.5, 2.1])
    # one process a replica: a long prompt on one delays nothing on the other
    on = FrontendSection(kind="vllm_api_server")
    both = ingested(on, np.zeros(2), np.array([100000, 0]), replicas=2)
    assert both == approx([0.1005, 0.0005])


def test_the_engine_sees_requests_in_the_order_they_were_taken_in(make_scenario):
    """Two requests sent at once to two processes, 1 ms a prompt token: each reaches the
    engine when its own process has tokenised it, the shorter prompt first whichever was
    sent first, as vLLM's processes do not wait for each other."""
    workload = {
        **OFFLINE,
        "num_requests": 2,
        "prompt_tokens": {"kind": "uniform", "low": 100, "high": 2000},
    }
    frontend = {**ON, "api_server_count": 2, "prompt_token_us": 1000, "request_us": 0}
    req = simulate(make_scenario(workload=workload, frontend=frontend)).requests
    assert req["prompt"].iloc[0] != req["prompt"].iloc[1]
    assert req["first_scheduled"].to_numpy() == approx(req["prompt"].to_numpy() * 1e-3)


def _two_requests() -> tuple[RequestTable, np.ndarray, FrontendSection]:
    """Two requests sent at 0 to replica 0, first tokens at 1 s, their second (last)
    tokens at 2 s; 1 s to take in a request, 0.6 s a token."""
    req = RequestTable(2)
    req.add(np.zeros(2), np.array([10, 10]), np.array([2, 2]), np.zeros(2, np.int16))
    req.replica[:2] = 0
    req.first_scheduled[:2] = 0.5
    req.first_token[:2] = 1.0
    req.last_token[:2] = req.finish[:2] = 2.0
    req.generated[:2] = 2
    req.outcome[:2] = Outcome.COMPLETED
    gaps = np.array([(1.0, 2, 2.0)], dtype=list(GAP_COLUMNS.items()))
    section = FrontendSection(
        kind="vllm_api_server", request_us=1e6, prompt_token_us=0, output_token_us=6e5
    )
    return req, gaps, section


def test_client_view_hand_computed():
    """Two requests sent at 0, first tokens at 1 s, their second (last) tokens at 2 s; one
    process, 1 s to take in a request, 0.6 s a token. The queue: 2 s of ingest from 0 (done
    at 2), two first tokens from max(2, 1) (done 3.2), two last ones (done 4.4)."""
    req, gaps, section = _two_requests()
    view = ClientView(section, req, np.zeros(2), np.zeros(2), [gaps])
    view.apply()
    assert req.first_token[:2].tolist() == approx([3.2, 3.2])
    assert req.finish[:2].tolist() == approx([4.4, 4.4])
    assert gaps["seconds"].tolist() == approx([1.2]) and gaps["end"].tolist() == approx([4.4])
    assert view.last_seen() == approx(4.4)
    with pytest.raises(RuntimeError, match="apply it once"):
        view.apply()  # the times are the client's already
    summary = view.summary(4.4)
    assert summary["utilisation"] == approx(1.0)  # 2 s ingest + 4 tokens x 0.6 s over 4.4 s
    # tokens waited 2.2 s (the first two) and 2.4 s (the last two)
    assert summary["token_delay_s"]["mean"] == approx(2.3)
    # its busiest window (a twentieth of 0 to 2 s) holds the 2 s of ingest at 0
    assert summary["load"] == approx(20) and summary["load_window_s"] == approx(0.1)


def test_the_busiest_replica_is_judged_not_the_fleet_mean():
    """The same two requests on replica 0 of two, replica 1 idle: the fleet's processes
    were half busy, replica 0's throughout, and the warning says so."""
    req, gaps, section = _two_requests()
    none = np.zeros(0, dtype=list(GAP_COLUMNS.items()))
    view = ClientView(section, req, np.zeros(2), np.zeros(2), [gaps, none])
    view.apply()
    summary = view.summary(4.4)
    assert summary["utilisation"] == approx(0.5) and summary["utilisation_max"] == approx(1.0)
    assert summary["processes"] == 2
    assert _frontend_warnings(summary)


def test_left_out_front_end_is_judged_over_its_busiest_window():
    """One replica, 1 ms a streamed token: 10,001 tokens streamed within the first second,
    then one token at 99.5 s. The run's mean is 10 s of work in 99.5 s, but the busiest
    twentieth (4.975 s) holds the 10 s: twice what one process could do."""
    req = RequestTable(2)
    req.add(np.array([0.0, 99.0]), np.array([1, 1]), np.array([10001, 1]), np.zeros(2))
    req.replica[:2] = 0
    req.first_token[:2] = [0.0, 99.5]
    req.last_token[:2] = [1.0, 99.5]
    req.generated[:2] = [10001, 1]
    section = FrontendSection(request_us=0, prompt_token_us=0, output_token_us=1000)
    load, window = unmodelled_load(section, req, np.zeros(1, np.int64))
    assert window == approx(4.975) and load == approx(10.001 / 4.975)


def test_instances_group_dp_ranks():
    assert instances([0, 1, 0, 1]).tolist() == [0, 0, 1, 1]
    assert instances([None, None]).tolist() == [0, 1]
    assert FrontendSection().processes(dp=4) == 4  # vllm serve's default: one a dp rank
    assert FrontendSection(api_server_count=2).processes(dp=4) == 2


@pytest.mark.parametrize(("count", "warns"), [(1, True), (None, False)])
def test_left_out_front_end_is_judged_per_vllm_instance(make_scenario, count, warns):
    """dp 2: both ranks' output goes through one instance's API servers. At 1.8 ms a token
    one process could not keep up with the instance (each rank alone it could), and
    vllm serve's default, one process a dp rank, could."""
    scenario = make_scenario(
        model={"name": "llama-3.1-8b"},
        parallelism={"dp": 2},
        frontend={"output_token_us": 1800, "api_server_count": count},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate(scenario)
    assert any("front end is not modelled" in str(w.message) for w in caught) == warns


def test_off_changes_nothing(make_scenario):
    """Off, the front end's settings do nothing and the results have no trace of it."""
    plain = simulate(make_scenario())
    other = simulate(make_scenario(frontend={"api_server_count": 4, "output_token_us": 1.0}))
    assert "frontend" not in plain.summary()
    pd.testing.assert_frame_equal(plain.requests, other.requests, check_exact=True)
    pd.testing.assert_frame_equal(plain.itl, other.itl, check_exact=True)
    assert list(plain.itl.columns) == ["seconds", "weight"]
    summaries = [plain.summary(), other.summary()]  # copies: changing them leaves the runs
    for summary in summaries:
        summary["provenance"]["scenario"].pop("frontend")
        summary["provenance"].pop("build_id")
        summary["run"].pop("wall")
    assert summaries[0] == summaries[1]


# the offline batch fills max_num_seqs=64 on purpose: the engine outruns the front end
capped_batch = pytest.mark.filterwarnings("ignore:serving.max_num_seqs=64")


def _throughput(make_scenario, **frontend) -> dict:
    costs = {"request_us": 0, "prompt_token_us": 0, "output_token_us": 2000}
    return simulate(make_scenario(workload=OFFLINE, frontend={**ON, **costs, **frontend}))


@capped_batch
def test_saturated_front_end_caps_throughput(make_scenario):
    """At 2 ms a streamed token one process streams 500 tokens/s, far below the engine's
    rate: the client sees about that, two processes about twice it."""
    engine = simulate(make_scenario(workload=OFFLINE)).summary()["throughput"]
    assert engine["output_tokens_per_s"] > 2000
    one = _throughput(make_scenario).summary()
    assert one["throughput"]["output_tokens_per_s"] == approx(500, rel=0.03)
    assert one["frontend"]["utilisation"] > 0.97
    assert any("frontend.api_server_count=1 per replica) were" in w for w in one["warnings"])
    assert "front end   vllm_api_server x1 per replica: busy" in summary_table(one)
    assert "vllm_api_server x1 per replica" in summary_html(one)
    two = _throughput(make_scenario, api_server_count=2).summary()
    assert two["throughput"]["output_tokens_per_s"] == approx(1000, rel=0.05)
    assert two["latency"]["e2e"]["mean"] < one["latency"]["e2e"]["mean"]


@capped_batch
def test_client_latencies_include_the_front_end(make_scenario):
    results = _throughput(make_scenario)
    req = results.requests
    assert (req["first_token"] >= req["first_scheduled"]).all()
    assert (req["e2e"] >= req["ttft"]).all()
    assert results.summary()["frontend"]["token_delay_s"]["mean"] > 1.0
    # every token is counted once, whatever the client's timing
    assert results.itl["weight"].sum() == (req["generated"] - 1).sum()


def test_warns_when_left_out_and_saturated(make_scenario):
    with pytest.warns(InfersimWarning, match="front end is not modelled"):
        results = simulate(make_scenario(frontend={"output_token_us": 5000}))
    assert any("frontend.kind: vllm_api_server" in w for w in results.summary()["warnings"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet = simulate(make_scenario())  # ~4 req/s x 130 tokens: far below one process
    assert not any("front end" in str(w.message) for w in caught)
    assert not any("front end" in w for w in quiet.summary()["warnings"])


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"frontend": {"kind": "vllm"}}, r"frontend\.kind: Input should be 'none' or"),
        ({"frontend": {"api_server_count": 0}}, r"frontend\.api_server_count"),
        ({"frontend": {"output_token_us": -1}}, r"frontend\.output_token_us"),
        ({"frontend": {"costs": 1}}, r"frontend\.costs: unknown key"),
        (
            {"frontend": ON, "workload": {"arrivals": {"kind": "closed_loop", "users": 4}}},
            r"^scenario: workload\.arrivals\.kind: closed-loop users and sessions",
        ),
        (
            {"frontend": ON, "output": {"step_table": False}},
            r"^scenario: output\.step_table: .* set output\.step_table: true",
        ),
        (
            {"frontend": ON, "parallelism": {"dp": 2}},
            r"^scenario: parallelism\.dp: .* set parallelism\.dp: 1",
        ),
        (
            {"frontend": ON, "faults": {"events": [{"replica": 0, "at_s": 1}]}},
            r"^scenario: faults: ",
        ),
    ],
)
def test_refusals(make_scenario, sections, message):
    """Each refusal names the field to change first and what to set."""
    with pytest.raises(InfersimError, match=message) as refused:
        make_scenario(**sections)
    if sections["frontend"] == ON:
        assert str(refused.value).endswith("or frontend.kind: none")


def test_multi_step_matches_step_by_step_with_it_on(make_scenario):
    frontend = {**ON, "output_token_us": 1000}  # busy enough that tokens wait
    fast = simulate(make_scenario(frontend=frontend))
    slow = simulate(make_scenario(frontend=frontend, engine={"multi_step": False}))
    assert fast.summary()["frontend"]["token_delay_s"]["mean"] > 0.01
    assert not any("API server processes" in w for w in fast.summary()["warnings"])
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)

    def gaps(results):
        return results.itl.groupby(["seconds", "end"])["weight"].sum()

    pd.testing.assert_series_equal(gaps(fast), gaps(slow), check_exact=True)
    assert fast.summary()["frontend"] == slow.summary()["frontend"]


@capped_batch
def test_bench_export_spreads_client_gaps(make_scenario):
    """vLLM's bench JSON reads per-request gaps off the engine's steps; through the API
    server the client's tokens come later, so they are estimated and counted as such."""
    from simulator.formats.vllm_bench import ESTIMATED_ITLS_KEY, bench_result

    result = bench_result(_throughput(make_scenario))
    assert result[ESTIMATED_ITLS_KEY] == result["completed"] > 0


def test_intake_delays_when_the_engine_sees_a_request(make_scenario):
    """0.1 s to take each request in, all 200 sent at once: the engine sees the last one
    20 s after it was sent, and its queueing time (from the client's send) says so."""
    frontend = {**ON, "request_us": 1e5, "prompt_token_us": 0, "output_token_us": 0}
    results = simulate(make_scenario(workload=OFFLINE, frontend=frontend))
    ingest = results.summary()["frontend"]["ingest_s"]
    assert ingest["max"] == approx(20.0) and ingest["mean"] == approx(10.05)
    scheduled = np.sort(results.requests["first_scheduled"].to_numpy())
    assert (scheduled >= 0.1 * np.arange(1, 201) - 1e-9).all()
    assert (results.requests["arrival"] == 0).all()  # the client sent them all at 0


@capped_batch
def test_time_series_counts_tokens_when_the_client_sees_them(make_scenario):
    """The series' output tokens are the client's: each token in the bin it reached the
    client (the gaps' end, first tokens at first_token), none at the engine's step ends,
    so no bin streams faster than the processes can (500 tokens/s at 2 ms a token)."""
    results = _throughput(make_scenario)
    ts = results.timeseries
    edges = np.append(ts["t_start"].to_numpy(), ts["t_end"].iloc[-1])
    gaps, req = results.itl, results.requests
    tokens = np.histogram(gaps["end"], edges, weights=gaps["weight"])[0]
    tokens += np.histogram(req["first_token"].dropna(), edges)[0]
    span = ts["t_end"] - ts["t_start"]
    assert (ts["output_tokens_per_s"] * span).to_numpy() == approx(tokens)
    assert (ts["output_tokens_per_s"] * span).sum() == approx(req["generated"].sum())
    full = ts.iloc[len(ts) // 4 : -len(ts) // 4]  # inside the run, whole steps either side
    assert full["output_tokens_per_s"].max() < 1.1 * 500 + 64 / span.iloc[0]


def test_overload_reason_names_the_api_server(make_scenario):
    """8 requests/s of ~130 tokens through one process at 2 ms a token (500 tokens/s):
    the backlog grows in the API server, and the verdict's reason says so."""
    workload = {"arrivals": {"kind": "poisson", "rate_per_s": 8.0}, "num_requests": 1500}
    frontend = {**ON, "output_token_us": 2000}
    summary = simulate(make_scenario(workload=workload, frontend=frontend)).summary()
    assert summary["overloaded"]
    assert "part of it is in the API server processes" in summary["overload_reason"]
