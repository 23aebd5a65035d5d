"""The chaos soak, short form: every failure mode at once on the whole local stack,
with the three-step workflow and faults at every remote service."""

from benchmarks.machine import describe
from benchmarks.report import write_soak_section
from benchmarks.soak import print_verdict, run_soak, verdict_markdown


def test_short_chaos_soak(tmp_path, report_figure):
    verdict = run_soak(150, seed=11, time_limit=240, out=tmp_path)
    print_verdict(verdict)
    report_figure(
        f"soak: {verdict.orders} orders, {verdict.processed} processed, {verdict.compensated} compensated "
        f"({verdict.compensated_refused} refused, {verdict.compensated_gave_up} gave up), {verdict.errors} error "
        f"({verdict.error_undo_failed} undo failed, {verdict.error_stopped} ship gave up), "
        f"effects {verdict.audit.totals}, after the operator's resubmits {verdict.after_resubmit}, "
        f"{verdict.duplicates_sent} duplicate orders, {verdict.responses_replayed} replayed responses, "
        f"host killed at {verdict.host_killed_at} s, {verdict.elapsed_s} s"
    )
    assert verdict.ok, verdict.problems
    assert not verdict.not_terminal
    assert verdict.processed + verdict.compensated + verdict.errors == 150
    assert verdict.audit.ok and verdict.audit_after_resubmit is not None and verdict.audit_after_resubmit.ok
    # Every path was taken: undone after a refusal, an undo that failed, a ship that
    # gave up; the operator's resubmits end both ways.
    assert verdict.compensated_refused > 0 and verdict.error_undo_failed > 0 and verdict.error_stopped > 0
    assert len(verdict.scripted) >= 3 and verdict.resubmitted == verdict.errors
    assert verdict.after_resubmit.get("Compensated", 0) > 0 and verdict.after_resubmit.get("Processed", 0) > 0
    assert sum(verdict.alerts_by_order.values()) == verdict.errors
    assert verdict.host_killed_at is not None and verdict.duplicates_sent > 0

    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n")
    for _ in range(2):  # a second soak replaces the first one's section
        write_soak_section(report, verdict_markdown(verdict, seed=11, machine=describe()))
    text = report.read_text()
    assert text.startswith("# Benchmarks\n") and text.count("## Chaos soak") == 1
    assert "**Result: all checks passed**" in text
    assert f"| Processed | {verdict.processed} |" in text
    assert "| Compensated: a step refused |" in text and "| Error: an undo failed |" in text
    assert "`STEP_TIMEOUT_SECONDS=3`" in text and "{" not in text, "the soak's settings are not filled in"
