"""Disaggregated prefill/decode as a client of vLLM's P/D proxy measures it: the first
token comes from the decode replica after the KV cache crossed, transfers share the
links, and the prefill replica holds the prompt's blocks until they have crossed."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.kv_links import KvLinks
from simulator.simulation import simulate

LONG = {"kind": "fixed", "tokens": 30000}


def _pools(make_scenario, prefill: int = 1, workload=None, serving=None):
    return make_scenario(
        hardware=None,
        model={"name": "llama-3.1-8b"},
        pools=[
            {
                "name": "prefill",
                "hardware": {"gpu": "h100-sxm"},
                "replicas": prefill,
                "role": "prefill",
            },
            {"name": "decode", "hardware": {"gpu": "h100-sxm"}, "replicas": 1, "role": "decode"},
        ],
        serving={"policy": "chunked_prefill", "max_model_len": 32768, **(serving or {})},
        workload=workload
        or {
            "arrivals": {"kind": "offline"},
            "prompt_tokens": LONG,
            "output_tokens": {"kind": "fixed", "tokens": 20},
            "num_requests": prefill,
        },
    )


def _prefill_end(results, replicas: int) -> np.ndarray:
    steps = results.steps
    pre = steps[steps["replica"] < replicas]
    return (pre["start"] + pre["duration"]).to_numpy()


def test_ttft_includes_the_transfer_and_the_decode_side_s_first_step(make_scenario):
    """The client's first token is the decode replica's (vLLM's proxy drops the prefill's),
    so TTFT holds the transfer, and no inter-token gap hides it."""
    results = simulate(_pools(make_scenario))
    req, steps = results.requests, results.steps
    prefill_end = _prefill_end(results, 1).max()
    decode = steps[steps["replica"] == 1]
    first_decode_step = decode["start"].min()
    assert first_decode_step > prefill_end + 0.05  # 30,000 tokens' KV: 3.9 GB crossed
    first = req["first_token"].item()
    assert first == pytest.approx(first_decode_step + decode["duration"].iloc[0])
    gaps = np.repeat(results.itl["seconds"], results.itl["weight"])
    assert len(gaps) == 19 and gaps.max() < 1.5 * np.median(gaps)


def test_transfers_into_one_decode_replica_share_its_link(make_scenario):
    """Four prefill replicas finishing together send four KV caches into one decode
    replica: each gets a quarter of its link, so the four take four times one's time."""

    def transfer(prefill: int) -> float:
        results = simulate(_pools(make_scenario, prefill))
        decode = results.steps[results.steps["replica"] == prefill]
        return decode["start"].min() - _prefill_end(results, prefill).max()

    alone, four = transfer(1), transfer(4)
    assert four == pytest.approx(4 * alone, rel=0.01)


def test_the_prefill_replica_holds_the_prompt_s_blocks_until_sent(make_scenario):
    """A prefill replica whose KV cache holds one prompt admits the next only once the
    first prompt's KV cache has crossed."""
    workload = {
        "arrivals": {"kind": "offline"},
        "prompt_tokens": LONG,
        "output_tokens": {"kind": "fixed", "tokens": 4},
        "num_requests": 2,
    }
    results = simulate(_pools(make_scenario, 1, workload, {"num_gpu_blocks": 1900}))
    req, steps = results.requests.sort_values("first_scheduled"), results.steps
    first_prefill_end = _prefill_end(results, 1).min()
    decode_start = steps[steps["replica"] == 1]["start"].min()  # the first has crossed
    second = req["first_scheduled"].iloc[1]
    assert second == pytest.approx(decode_start) and second > first_prefill_end + 0.05


def test_fair_share_of_links_is_max_min():
    """Two transfers into link 2 split it; a third out of link 0's sender is then held
    to what link 0 has left."""
    env = simpy.Environment()
    links = KvLinks(env)
    a, b, c, d = (links.add(rate) for rate in (100.0, 100.0, 60.0, 1000.0))
    ends: dict[str, float] = {}
    for name, sender, receiver, tokens in (("x", a, c, 30), ("y", b, c, 30), ("z", a, d, 70)):
        links.send(tokens, sender, receiver, 0.0).callbacks.append(
            lambda _, name=name: ends.setdefault(name, env.now)
        )
    env.run()
    # x and y get 30/s each from link c; z gets link a's other 70/s.
    assert ends == pytest.approx({"x": 1.0, "y": 1.0, "z": 1.0})


def test_a_transfer_speeds_up_when_another_ends():
    env = simpy.Environment()
    links = KvLinks(env)
    out, into = links.add(10.0), links.add(10.0)
    ends = []
    for tokens in (10, 30):
        links.send(tokens, out, into, 0.5).callbacks.append(lambda _: ends.append(env.now))
    env.run()
    # Both at 5/s until the first ends at 0.5 + 2 s; the second's last 20 then at 10/s.
    assert ends == pytest.approx([2.5, 4.5])
