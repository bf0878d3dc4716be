"""The engine's row store: deferred rows (ColumnStore.defer) must be exactly the rows an
append would have stored, and the store must fold when an append would have, since
what is folded when decides the sums (floating-point addition is not associative)."""

import numpy as np

from simulator.engine.columns import DEFER_ROWS, ColumnStore

COLUMNS = {"start": "f8", "n": "i4", "bound": "i1"}


def _store(events: list):
    store = ColumnStore(COLUMNS, 8, on_full=None)

    def on_full():  # what a fold sees, then drains half of it
        rows = store.rows()
        events.append(rows.copy())
        store.drain(len(rows) // 2)

    store._on_full = on_full
    return store


def test_deferred_rows_are_appended_rows_and_fold_at_the_same_moments():
    rng = np.random.default_rng(0)
    appended_events, deferred_events = [], []
    appended, deferred = _store(appended_events), _store(deferred_events)
    for i in range(300):
        count = int(rng.integers(1, 12))
        starts = rng.random(count).tolist()
        n, bound = int(rng.integers(1, 100)), int(rng.integers(0, 4))
        if i % 7 == 0:  # a single row in between, which must come after the deferred ones
            appended.append((0.5, n, bound))
            deferred.append((0.5, n, bound))
            continue
        appended.append_rows([(s, n, bound) for s in starts])
        deferred.defer(count, starts, n, [bound] * count)
        assert deferred.size == appended.size
    assert len(deferred_events) == len(appended_events) > 10
    for seen, expected in zip(deferred_events, appended_events, strict=True):
        np.testing.assert_array_equal(seen, expected)
    np.testing.assert_array_equal(deferred.rows(), appended.rows())


def test_deferred_rows_wait_at_most_defer_rows():
    store = ColumnStore(COLUMNS, 4 * DEFER_ROWS)
    for _ in range(DEFER_ROWS):
        store.defer(1, [1.0], 2, 3)
    assert store._pending_rows == 0 and store._size == DEFER_ROWS
