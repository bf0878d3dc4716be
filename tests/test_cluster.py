"""Several replicas behind a router, and placements a deployment would refuse."""

from __future__ import annotations

import pytest

from hardware_models.errors import InfeasibleError
from simulator.simulation import simulate

ROUTERS = ["round_robin", "random", "least_outstanding", "least_kv_load", "power_of_two"]
LOAD = {"arrivals": {"kind": "poisson", "rate_per_s": 24.0}, "num_requests": 600}


def _cluster(make_scenario, router, **extra):
    return make_scenario(
        parallelism={"replicas": 4, "router": router, **extra}, workload=LOAD,
        serving={"max_num_seqs": 32},
    )  # fmt: skip


@pytest.mark.parametrize("router", ROUTERS)
def test_every_router_serves_everything_on_every_replica(make_scenario, router):
    results = simulate(_cluster(make_scenario, router))
    req = results.requests
    assert (req["outcome"] == "completed").all()
    assert sorted(req["replica"].unique()) == [0, 1, 2, 3]
    assert set(results.steps["replica"].unique()) == {0, 1, 2, 3}
    if router == "round_robin":
        assert req["replica"].value_counts().tolist() == [150] * 4


def test_load_aware_routing_beats_random_on_tail_latency(make_scenario):
    def p99_e2e(router):
        req = simulate(_cluster(make_scenario, router)).requests
        return req["e2e"].quantile(0.99)

    assert p99_e2e("least_outstanding") < p99_e2e("random")
    assert p99_e2e("power_of_two") < p99_e2e("random")


def test_routing_is_deterministic(make_scenario):
    a = simulate(_cluster(make_scenario, "power_of_two")).requests["replica"]
    b = simulate(_cluster(make_scenario, "power_of_two")).requests["replica"]
    assert a.equals(b)


@pytest.mark.parametrize(
    ("sections", "needle"),
    [
        ({"parallelism": {"pp": 33}}, "exceeds"),
        ({"parallelism": {"replicas": 9, "nodes": 1}}, "need 9 GPUs"),
        ({"hardware": {"gpu": "a100-80gb-sxm", "node": "dgx-h100"}}, "built from"),
    ],
)  # fmt: skip
def test_invalid_placements_are_explained(make_scenario, sections, needle):
    with pytest.raises(InfeasibleError, match=needle):
        simulate(make_scenario(**sections))


def test_tensor_parallel_beyond_a_node_without_network_is_refused(make_scenario, tmp_path):
    node = tmp_path / "box.yaml"
    node.write_text(
        "name: box\ndisplay_name: a lone 2-GPU box\ngpu: a100-80gb-sxm\ngpus_per_node: 2\n"
        "intra_node_fabric: nvlink_mesh\n"
        "intra_node_link: {kind: nvlink, bandwidth_gbps: 300, latency_us: 3}\n"
        "nics_per_node: 0\nnic_bandwidth_gbps: 0\nhost_memory_gb: 512\n"
    )
    with pytest.raises(InfeasibleError, match="no inter-node link"):
        simulate(make_scenario(hardware={"node": str(node)}, parallelism={"tp": 4}))
    assert simulate(make_scenario(hardware={"node": str(node)}, parallelism={"tp": 2}))


def test_heterogeneous_pools_share_one_router(make_scenario):
    scenario = make_scenario(
        hardware=None,
        pools=[
            {"name": "fast", "hardware": {"gpu": "h100-sxm"}, "replicas": 1},
            {"name": "slow", "hardware": {"gpu": "a100-80gb-sxm"}, "replicas": 2},
        ],
        parallelism={"router": "least_outstanding"},
        workload=LOAD,
    )
    results = simulate(scenario)
    summary = results.summary()
    assert set(summary["per_pool"]) == {"fast", "slow"}
    assert summary["per_pool"]["slow"]["replicas"] == 2
    assert summary["run"]["gpu_types"] == ["a100-80gb-sxm", "h100-sxm"]
    # each pool's GPU energy is its own, within its GPUs' idle and limit
    pools = summary["per_pool"]
    kwh = sum(pool["gpu_energy_kwh"] for pool in pools.values())
    assert kwh == pytest.approx(summary["energy"]["gpu_energy_kwh"], rel=1e-12)
    assert 75 < pools["fast"]["average_power_w"] < 700
    assert 55 < pools["slow"]["average_power_w"] < 400
    per_replica = results.requests.groupby("replica").size()
    assert per_replica[0] > per_replica[1]  # the H100 takes more under least-outstanding
    assert (results.requests["outcome"] == "completed").all()


def test_hardware_or_pools_not_both(make_scenario):
    from hardware_models.errors import InfersimError

    with pytest.raises(InfersimError, match="either hardware or pools"):
        make_scenario(pools=[{"name": "x", "hardware": {"gpu": "h100-sxm"}}])


def _disaggregated(make_scenario, **extra):
    return make_scenario(
        hardware=None,
        model={"name": "llama-3.1-8b"},
        pools=[
            {"name": "prefill", "hardware": {"gpu": "h100-sxm"}, "replicas": 1, "role": "prefill"},
            {"name": "decode", "hardware": {"gpu": "h100-sxm"}, "replicas": 2, "role": "decode"},
        ],
        parallelism={"router": "least_outstanding"},
        workload=LOAD,
        **extra,
    )


def test_disaggregated_prefill_and_decode_pools(make_scenario):
    results = simulate(_disaggregated(make_scenario))
    req, steps = results.requests, results.steps
    assert (req["outcome"] == "completed").all()
    assert set(req["replica"]) <= {1, 2}  # finished on a decode replica
    prefill_steps = steps[steps["replica"] == 0]
    decode_steps = steps[steps["replica"] != 0]
    assert (prefill_steps["decode_tokens"] == 0).all() and prefill_steps["prefill_tokens"].sum()
    # A decode replica computes each request's last prompt token again, to sample from.
    assert req["preemptions"].sum() == 0 and decode_steps["prefill_tokens"].sum() == len(req)
    assert (req["generated"] == req["output"]).all()
    two = req[req["output"] >= 2]
    assert (two["finish"] > two["first_token"]).all()
    pools = results.summary()["per_pool"]
    assert set(pools) == {"prefill", "decode"} and pools["decode"]["completed"] == len(req)


def test_disaggregated_needs_both_roles(make_scenario):
    from hardware_models.errors import InfersimError

    with pytest.raises(InfersimError, match="prefill and decode pools"):
        make_scenario(hardware=None, pools=[{"name": "p", "hardware": {"gpu": "h100-sxm"},
                                             "role": "prefill"}])  # fmt: skip


def test_closed_loop_over_replicas_matches_step_by_step(make_scenario):
    import pandas as pd

    workload = {"arrivals": {"kind": "closed_loop", "users": 24, "think_time_s": 0.2},
                "num_requests": 300}  # fmt: skip
    par = {"replicas": 3, "router": "least_outstanding"}
    fast = simulate(make_scenario(workload=workload, parallelism=par))
    slow = simulate(make_scenario(workload=workload, parallelism=par,
                                  engine={"multi_step": False}))  # fmt: skip
    cols = ["arrival", "first_token", "finish", "replica"]
    pd.testing.assert_frame_equal(fast.requests[cols], slow.requests[cols])


@pytest.mark.parametrize("router", ["round_robin", "random"])
def test_prerouted_replicas_match_step_by_step(make_scenario, router):
    import pandas as pd

    fast = simulate(_cluster(make_scenario, router))
    slow = simulate(
        make_scenario(
            parallelism={"replicas": 4, "router": router}, workload=LOAD,
            serving={"max_num_seqs": 32}, engine={"multi_step": False},
        )
    )  # fmt: skip
    cols = ["first_token", "finish", "replica", "generated"]
    pd.testing.assert_frame_equal(fast.requests[cols], slow.requests[cols])
    assert len(fast.steps) == len(slow.steps)
