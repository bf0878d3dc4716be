"""Type hints that say what the code does (review 14, item 10): a hint that lies misleads a
reader and hides bugs from a type checker, so where one was wrong a test pins it to the
values the code really produces."""

import typing

from simulator.build import batch_limits_of
from simulator.engine.kv_cache import CacheKey
from simulator.engine.prefix_hashes import Key
from simulator.engine.requests import _COLUMNS, RequestTable


def test_request_table_declares_every_column_it_sets():
    """Columns were set with setattr only: each is now a declared attribute too."""
    assert list(typing.get_type_hints(RequestTable)) == list(_COLUMNS)
    table = RequestTable(4)
    for name, dtype in _COLUMNS.items():
        assert getattr(table, name).dtype == dtype


def test_batch_limits_say_none_where_the_policy_has_no_such_limit(make_scenario):
    """A static batch has no token budget: the dict holds None, as its hint now says."""
    limits = batch_limits_of(make_scenario(serving={"policy": "static", "max_num_seqs": 8}))
    assert limits["max_num_batched_tokens"] is None and limits["max_num_seqs"] == 8
    values = typing.get_args(typing.get_type_hints(batch_limits_of)["return"])[1]
    assert type(None) in typing.get_args(values)


def test_the_lru_key_type_covers_hashed_prefix_caching_keys():
    """HashedBlockManager keeps its blocks in the base class's LRU under its own keys."""
    assert Key in typing.get_args(CacheKey)
