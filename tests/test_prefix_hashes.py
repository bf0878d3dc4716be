"""A prefix cache shared by block hash (Mooncake's hash_ids), as vLLM's automatic prefix
caching: shared system prompts and documents hit, the hit rate counts them, memory holds
a shared block once, and the engine stays exact under preemption and eviction."""

import json
from pathlib import Path

import numpy as np
import pytest

import simulator as sim
from hardware_models.errors import InfersimWarning
from simulator.engine.prefix_hashes import BlockKeys, HashedBlockManager
from simulator.metrics.writer import summary_json
from simulator.scenario import Scenario
from simulator.workload.generate import PromptHashes
from tests.conftest import scenario_dict

SAMPLE = Path(__file__).parents[1] / "scenarios" / "traces" / "mooncake_sample.jsonl"


def mooncake(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(trace: Path, n: int, caching: bool = True, **sections):
    data = scenario_dict(
        model={"name": "llama-3.1-8b"},  # a context long enough for the sample's prompts
        serving={"enable_prefix_caching": caching, **sections.pop("serving", {})},
        workload={
            "arrivals": {"kind": "trace", "path": str(trace)},
            "num_requests": n,
            "prompt_tokens": None,
            "output_tokens": None,
            **sections.pop("workload", {}),
        },
        **sections,
    )
    data["workload"] = {k: v for k, v in data["workload"].items() if v is not None}
    return sim.simulate(Scenario.from_dict(data), progress=False)


def expected_hits(rows: list[dict], block: int, trace_block: int = 512) -> list[int]:
    """Cached prompt tokens of each request when each one finishes before the next
    arrives and nothing is evicted: engine block k hits when an earlier request had the
    same hashes up to the trace block holding k's last token, and k whole in its covered
    prompt; never the prompt's last token."""
    seen: set[tuple[tuple[int, ...], int]] = set()
    hits = []
    for r in rows:
        covered = min(len(r["hash_ids"]) * trace_block, r["input_length"])
        shared = covered // block
        cap = (r["input_length"] - 1) // block
        ident = [(tuple(r["hash_ids"][: ((k + 1) * block - 1) // trace_block + 1]), k)
                 for k in range(shared)]  # fmt: skip
        k = 0
        while k < min(shared, cap) and ident[k] in seen:
            k += 1
        hits.append(k * block)
        seen.update(ident)
    return hits


def test_shared_prefixes_hit_as_the_hashes_say(tmp_path):
    rng = np.random.default_rng(0)
    rows, ts = [], 0
    for i in range(30):
        doc = [100 + int(rng.integers(3))] if rng.random() < 0.7 else [1000 + i]
        ids = [0, 1, *doc, 2000 + i]
        length = 3 * 512 + int(rng.integers(1, 513))
        rows.append({"timestamp": ts, "input_length": length, "output_length": 3,
                     "hash_ids": ids})  # fmt: skip
        ts += 100_000  # each request is long done before the next arrives
    result = run(mooncake(tmp_path / "m.jsonl", rows), len(rows))
    cached = result.requests["cached_prompt_tokens"].to_numpy()
    np.testing.assert_array_equal(cached, expected_hits(rows, block=16))
    prefix = result.summary()["prefix_cache"]
    assert prefix["cached_prompt_tokens"] == cached.sum() > 0
    assert prefix["hit_rate"] == pytest.approx(cached.sum() / sum(r["input_length"] for r in rows))


def test_engine_block_identity_spans_trace_blocks_of_any_size():
    # trace blocks of 10 tokens, engine blocks of 16: engine block 0 ends in trace block 1
    hashes = PromptHashes(
        ids=(np.array([5, 6, 7]), np.array([5, 6, 9]), np.array([5, 8, 7])),
        block_tokens=10,
        covered=np.array([30, 30, 30]),
    )
    keys = BlockKeys(hashes, block_size=16)
    assert keys.shared_blocks(0) == 1
    assert keys.of(0) == keys.of(1)  # same hashes through trace block 1
    assert keys.of(0) != keys.of(2)  # differs in trace block 1


def test_without_prefix_caching_nothing_hits_and_the_run_says_so():
    with pytest.warns(InfersimWarning, match="hash_ids are not used: serving.enable_prefix"):
        result = run(SAMPLE, 48, caching=False)
    assert result.summary()["prefix_cache"]["cached_prompt_tokens"] == 0


def test_sample_trace_hits_and_saves_prefill():
    with_cache, without = run(SAMPLE, 48), run(SAMPLE, 48, caching=False)
    again = summary_json(run(SAMPLE, 48).summary(), include_wall_time=False)
    assert summary_json(with_cache.summary(), include_wall_time=False) == again
    assert with_cache.summary()["prefix_cache"]["hit_rate"] > 0.5
    assert with_cache.steps["prefill_tokens"].sum() < 0.5 * without.steps["prefill_tokens"].sum()
    assert (
        with_cache.summary()["latency"]["ttft"]["mean"]
        < without.summary()["latency"]["ttft"]["mean"]
    )


def test_requests_running_together_hold_a_shared_block_once(tmp_path):
    rows = [{"timestamp": 0, "input_length": 3000, "output_length": 64, "hash_ids": list(range(6))}
            for _ in range(8)]  # fmt: skip
    trace = mooncake(tmp_path / "same.jsonl", rows)
    shared, private = run(trace, 8), run(trace, 8, caching=False)
    # 8 identical 3,000-token prompts: 188 blocks each without sharing, 187 shared with
    assert private.steps["kv_blocks_used"].max() >= 8 * 188
    assert shared.steps["kv_blocks_used"].max() <= 187 + 8 * 6
    cached = shared.requests["cached_prompt_tokens"].to_numpy()
    assert cached[0] == 0 and (cached[1:] > 0).all()
    assert (shared.requests["outcome"] == "completed").all()


CLASSES = [{"name": "chat", "priority": 0}, {"name": "batch", "priority": 1, "weight": 3}]


@pytest.mark.parametrize(
    ("policy", "classes"),
    [("chunked_prefill", None), ("continuous", None), ("continuous", CLASSES)],
)
def test_exact_under_kv_pressure_and_same_stepping(policy, classes):
    """A cache far too small: preemptions (by a more important class too, vLLM v0's
    priority preemption), recomputes and evictions; every request completes within the
    cache, and stepping one by one agrees to the last bit."""
    serving = {
        "policy": policy,
        "num_gpu_blocks": 900,
        "max_num_batched_tokens": 8192,
        "max_model_len": 8192,
    }  # fmt: skip (vLLM refuses a prefill-first budget below it)
    workload = {"priorities": classes} if classes else {}
    if classes:
        serving["scheduling_policy"] = "priority"
    fast = run(SAMPLE, 48, serving=serving, workload=workload)
    slow = run(SAMPLE, 48, serving=serving, workload=workload, engine={"multi_step": False})
    assert (fast.requests["outcome"] == "completed").all()
    assert fast.requests["preemptions"].sum() > 0
    if classes:  # chat preempts batch to get in at once: never waits for a batch request
        chat = fast.requests[fast.requests["priority"] == 0]
        assert (chat["preemptions"] == 0).all()
        assert (chat["first_scheduled"] - chat["arrival"]).max() < 0.25
    assert fast.summary()["prefix_cache"] == slow.summary()["prefix_cache"]
    assert fast.summary()["prefix_cache"]["hit_rate"] > 0.3
    np.testing.assert_array_equal(fast.requests["finish"], slow.requests["finish"])
    assert fast.steps["kv_blocks_used"].max() <= 900


# A low-priority request with a long private prompt, a second low one sharing a system
# prompt (trace blocks 0-7) with a high-priority request arriving while both run.
PRIORITY_ROWS = [
    {"timestamp": 0, "input_length": 5280, "output_length": 3000,
     "hash_ids": list(range(900, 911))},
    {"timestamp": 14000, "input_length": 4200, "output_length": 3000, "hash_ids": [*range(8), 50]},
    {"timestamp": 15000, "input_length": 5596, "output_length": 10,
     "hash_ids": [*range(8), 60, 61, 62]},
]  # fmt: skip
TWO_CLASSES = [{"name": "hi", "priority": 0}, {"name": "lo", "priority": 1}]


def run_priority_rows(tmp_path, caching: bool = True, step_by_step: bool = False, **serving):
    """PRIORITY_ROWS with seed 6: requests 0 and 1 draw the low class, 2 the high one."""
    trace = mooncake(tmp_path / "prio.jsonl", PRIORITY_ROWS)
    result = run(
        trace, 3, caching, seed=6, engine={"multi_step": not step_by_step},
        serving={"max_num_batched_tokens": 8192, "scheduling_policy": "priority", **serving},
        workload={"priorities": TWO_CLASSES},
    )  # fmt: skip
    assert result.requests["priority"].tolist() == [1, 1, 0]
    return result


@pytest.mark.parametrize("policy", ["chunked_prefill", "continuous"])
@pytest.mark.parametrize("blocks", [735, 760])
def test_preempting_the_last_holder_of_a_shared_prefix(tmp_path, policy, blocks):
    """The high-priority request hits the system prompt the low ones hold; preempting
    them frees those blocks, which it must then take from the free ones (it used to
    ask for more than was freed: KV over-allocation)."""
    serving = {"policy": policy, "num_gpu_blocks": blocks}
    if policy == "continuous":  # prefill-first: vLLM wants a budget of max_model_len
        serving |= {"max_num_batched_tokens": 10240, "max_model_len": 10240}
    fast = run_priority_rows(tmp_path, **serving)
    slow = run_priority_rows(tmp_path, step_by_step=True, **serving)
    assert (fast.requests["outcome"] == "completed").all()
    assert fast.steps["kv_blocks_used"].max() <= blocks
    np.testing.assert_array_equal(fast.requests["finish"], slow.requests["finish"])


def test_priority_preemption_frees_shared_blocks_of_its_victims(tmp_path):
    """Victims that are the only holders of their prompt blocks free them: the
    high-priority request gets in as soon as it would without prefix caching (it used
    to wait ~6 s for a low-priority request to finish). Prefill-first (vLLM v0): vLLM
    v1 never preempts for a waiting request."""
    waits = []
    v0 = {"policy": "continuous", "max_num_batched_tokens": 10240, "max_model_len": 10240}
    for caching in (True, False):
        result = run_priority_rows(tmp_path, caching, num_gpu_blocks=650, **v0)
        hi = result.requests.iloc[2]
        waits.append(hi["first_scheduled"] - hi["arrival"])
        assert result.requests["preemptions"].iloc[:2].sum() > 0
    assert waits[0] == pytest.approx(waits[1], abs=0.05) and waits[0] < 0.05


def test_manager_accounting_balances():
    hashes = PromptHashes(
        ids=(np.array([1, 2]), np.array([1, 2]), np.array([1, 3])),
        block_tokens=32,
        covered=np.array([64, 64, 64]),
    )
    kv = HashedBlockManager(20, 16, 0.0, BlockKeys(hashes, 16))
    kv.allocate(5)  # request 0: 64 prompt tokens (4 blocks) and an output block
    kv.name_blocks(0, 64)
    assert kv.find(1, 3) == (3, 3)  # up to 3 blocks (never its last token): in use by 0
    assert kv.acquire(1, 3) == 3
    kv.allocate(5 - 3)
    kv.name_blocks(1, 64)  # its block 3 is a copy of request 0's: its own
    assert kv.used == 4 + 1 + 2
    kv.leave(0, 5, 70, finished=True)
    assert kv.used == 3 + 2 and kv.cached_total == 1  # request 0's block 3 stays cached
    kv.leave(1, 5, 70, finished=True)
    assert kv.used == 0 and kv.cached_total == 4
    assert kv.find(2, 3) == (2, 0)  # request 2 shares trace block 0 (engine blocks 0, 1)
    kv.allocate(20)  # every free block taken: the cache is evicted
    assert kv.cached_total == 0 and kv.find(2, 3) == (0, 0)
