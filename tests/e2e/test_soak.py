"""The chaos soak, short form: every failure mode at once on the whole local stack."""

from benchmarks.machine import describe
from benchmarks.report import write_soak_section
from benchmarks.soak import print_verdict, run_soak, verdict_markdown


def test_short_chaos_soak(tmp_path, report_figure):
    verdict = run_soak(150, seed=11, time_limit=240, out=tmp_path)
    print_verdict(verdict)
    report_figure(
        f"soak: {verdict.orders} orders, {verdict.processed} processed, {verdict.errors} error "
        f"({verdict.error_permanent} permanent, {verdict.error_exhausted} exhausted), "
        f"{verdict.remote_effects} effects, {len(verdict.applied_twice)} applied twice, "
        f"effects after the operator's resubmits {verdict.effects_after_resubmit} == "
        f"processed {verdict.processed_after_resubmit}, {verdict.duplicates_sent} duplicate orders, {verdict.responses_replayed} replayed responses, "
        f"host killed at {verdict.host_killed_at} s, {verdict.elapsed_s} s"
    )
    assert verdict.ok, verdict.problems
    assert verdict.effects_after_resubmit == verdict.processed_after_resubmit
    assert verdict.host_killed_at is not None and verdict.duplicates_sent > 0

    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n")
    for _ in range(2):  # a second soak replaces the first one's section
        write_soak_section(report, verdict_markdown(verdict, seed=11, machine=describe()))
    text = report.read_text()
    assert text.startswith("# Benchmarks\n") and text.count("## Chaos soak") == 1
    assert "**Result: all checks passed**" in text
    assert f"| Processed | {verdict.processed} |" in text
    assert "`STEP_TIMEOUT_SECONDS=3`" in text and "{" not in text, "the soak's settings are not filled in"
