"""The chaos soak, short form: every failure mode at once on the whole local stack,
with the three-step workflow and faults at every remote service."""

import json

from benchmarks.machine import describe
from benchmarks.report import write_soak_section
from benchmarks.soak import print_verdict, run_soak, verdict_json, verdict_markdown, write_soak_report
from tools.storage_faults import StorageFaults


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


#: Azure Storage's push-back at rates well above what Azure sheds under load, so 40
#: orders meet every ambiguous case (each order makes ~25 storage requests).
PUSHBACK = "503=0.05,500-applied=0.03,reset-applied=0.03,latency=0.05:0.3"


def test_short_chaos_soak_under_azure_storage_push_back(tmp_path, report_figure):
    # No host crash and no operator phase (the plain soak above has both; make soak
    # --azure-faults has all at once): the push-back alone, under a minute.
    verdict = run_soak(40, seed=13, time_limit=150, out=tmp_path, storage_faults=StorageFaults.parse(PUSHBACK),
                       kill_host=False, operator=False)
    print_verdict(verdict)
    figures = verdict_json(verdict)
    report_figure(f"soak under push-back: {json.dumps({k: figures[k] for k in list(figures)[:9]})}, "
                  f"{figures['storage_requests']} storage requests, recognised {figures['recognised']}, "
                  f"{verdict.orders_per_second} orders/s, phases {verdict.phases}")
    assert verdict.ok, verdict.problems
    assert {k: figures[k] for k in ("orders", "not_terminal", "lost", "applied_twice", "late_calls")} == {
        "orders": 40, "not_terminal": 0, "lost": 0, "applied_twice": 0, "late_calls": 0,
    }
    assert figures["alerts"] == figures["error_orders"] == verdict.errors  # an alert for each real Error only
    # ...and the only Error orders are the scripted ones (each in Error: verdict.ok): push-back costs time, not outcomes.
    assert verdict.errors == len(verdict.scripted), (verdict.errors, verdict.scripted)
    # Every kind of push-back was injected, at both services, and survived.
    assert all(figures["faults"][kind] > 0 for kind in ("503", "500-applied", "reset-applied", "latency")), figures
    assert set(figures["faults_by_service"]) == {"table", "queue"}
    assert figures["recognised"].get("write", 0) > 0, "no ambiguous write was met and recognised"
    report = tmp_path / "BENCHMARKS.md"
    write_soak_report(report, verdict_markdown(verdict, seed=13, machine=describe(), baseline=10.0))
    assert "## Chaos soak under Azure's push-back" in report.read_text() and "| storage faults injected: 503 |" in report.read_text()
