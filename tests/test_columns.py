"""ColumnStore: rows appended one at a time, in runs and as columns come back in order,
and the store calls its fold exactly when the next rows would not fit."""

from __future__ import annotations

import numpy as np

from simulator.engine.columns import ColumnStore

COLUMNS = {"x": "f8", "n": "i4"}


def test_rows_come_back_as_appended_whichever_way_they_went_in():
    store = ColumnStore(COLUMNS, capacity=4)
    store.append((0.5, 1))
    store.append_rows([(1.5, 2), (2.5, 3), (3.5, 4), (4.5, 5)])  # grows past 4
    store.extend(3, x=np.array([5.5, 6.5, 7.5]), n=6)
    store.append((8.5, 7))
    rows = store.rows()
    assert rows["x"].tolist() == [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5]
    assert rows["n"].tolist() == [1, 2, 3, 4, 5, 6, 6, 6, 7]


def test_the_fold_runs_only_when_the_next_rows_would_not_fit():
    folds: list[int] = []

    def fold() -> None:  # as a step log does: take the oldest rows away
        folds.append(store.size)
        store.drain(2)

    store = ColumnStore(COLUMNS, capacity=4, on_full=fold)
    store.append_rows([(0.0, 0), (1.0, 1), (2.0, 2)])
    store.append((3.0, 3))  # exactly full: no fold yet
    assert folds == []
    store.append_rows([(4.0, 4)])  # one more than fits: fold, then room
    assert folds == [4]
    store.append_rows([(5.0, 5)])  # fits beside the three left
    assert folds == [4]
    store.append_rows([(6.0, 6), (7.0, 7), (8.0, 8)])  # 4 + 3 > 4: fold, then grow
    assert folds == [4, 4]
    assert store.rows()["n"].tolist() == [4, 5, 6, 7, 8]


def test_a_full_store_that_folds_nothing_grows():
    store = ColumnStore(COLUMNS, capacity=2, on_full=lambda: None)
    for i in range(9):
        store.append((float(i), i))
    assert store.size == 9
    assert store.rows()["n"].tolist() == list(range(9))
