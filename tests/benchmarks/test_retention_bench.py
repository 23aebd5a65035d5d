"""A small run of the retention benchmark (benchmarks/retention.py) on its own Azurite: a
tick's requests follow what it archives and deletes, not the finished orders waiting."""

from __future__ import annotations

from benchmarks.retention import run, table_of


def test_a_ticks_requests_follow_what_it_deletes_not_the_history():
    figures = run(first=20, finished_total=220, due=25, max_orders=10, progress=lambda _: None)
    print(table_of(figures))
    rounds = {}
    for figure in figures:
        rounds.setdefault(figure.not_due, []).append(figure)
    assert sorted(rounds) == [20, 220]
    for ticks in rounds.values():
        assert [f.archived for f in ticks] == [10, 10, 5, 0]
        for f in ticks:
            # Per order: its partition read and its delete; per index partition of the batch (16
            # shards at most): a mark and a delete transaction; the due ranges' queries.
            assert f.table <= 2 * f.archived + 2 * min(f.archived, 16) + 2, table_of(figures)
            assert f.requests["table get"] == f.archived + (1 if f.archived == 10 else 2), table_of(figures)
            assert f.blob == (4 if f.archived else 0), table_of(figures)
    # The same reads in both rounds, ten times the finished orders waiting in the second.
    assert [f.requests["table get"] for f in rounds[20]] == [f.requests["table get"] for f in rounds[220]]
