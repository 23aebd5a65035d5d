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
            # per order: its partition read, its delete, its customer-index row's delete (search.forget)
            assert f.table <= 3 * f.archived + 2 * min(f.archived, 16) + 2, table_of(figures)
            assert f.requests["table get"] == f.archived + (1 if f.archived == 10 else 2), table_of(figures)
            assert f.blob == (4 if f.archived else 0), table_of(figures)
    # The same reads in both rounds, ten times the finished orders waiting in the second.
    assert [f.requests["table get"] for f in rounds[20]] == [f.requests["table get"] for f in rounds[220]]


def test_make_bench_keeps_the_retention_section_as_it_keeps_the_soaks(tmp_path):
    from benchmarks.report import kept_sections, soak_section, write_retention_section, write_soak_section

    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n\n## Machine\n\n| date | 2026-01-01 |\n\n## Idle cost\n\nidle\n")
    write_soak_section(report, "## Chaos soak\n\nthe soak\n")
    write_retention_section(report, "## Retention tick vs history\n\nthe first run\n")
    write_retention_section(report, "## Retention tick vs history\n\nthe second run\n")  # replaces the first
    kept = soak_section(report)
    assert "the soak" in kept and "the second run" in kept and "the first run" not in kept
    assert kept.index("the soak") < kept.index("the second run")
    # Neither is taken for a phase's section.
    sections = kept_sections(report, {"idle": "Idle cost", "x": "Retention tick vs history"})
    assert [s.key for s in sections] == ["idle"] and "the soak" not in sections[0].kept
