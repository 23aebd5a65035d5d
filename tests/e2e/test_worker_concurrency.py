"""The worker's pool limit, reproduced on the local host.

The real Python worker runs every sync function on one shared pool of
``min(32, cores + 4)`` threads (tools/funchost/README.md). A sync agent holds one of
them for its whole call, so with a slow remote service requests wait in the worker
until they arrive past complete-by and are dropped. The app's agents are async: on the
same pool, with the same slow service, nothing is dropped. The same load on the sync
variant (benchmarks/sync_agents.py, the agents as they were) must drop requests: the day
it does not, the reproduction is gone.
"""

from __future__ import annotations

from benchmarks import sync_agents
from core.models import ProcessState
from devtools.orders import order_json
from tests.e2e.conftest import wait_until

#: The worker's default pool on a 2-core instance: min(32, 2 + 4) (tools/funchost/README.md).
#: Fixed, so the load below reproduces the limit on any development machine.
WORKER_THREADS = min(32, 2 + 4)
#: What the agent logs when it drops a request (agents/agent.py).
DROPPED = ("arrived past complete-by", "no result before complete-by")


def slow_remote_run(stack, app_dir=None):
    """30 reserves of 2 s on one host with the worker's default pool: the host, the order
    ids, and how many requests its agents dropped once every order finished or one was dropped."""
    stack.remote.set_faults(service="inventory", apply_seconds=2)  # every reserve takes 2 s
    (host,) = stack.start_hosts(
        app_dir=app_dir,
        PYTHON_THREADPOOL_THREAD_COUNT=str(WORKER_THREADS),
        # 6 s: a request waits for up to 16 queued agent calls (host.json's limit) on 6 threads
        # of 2 s each (~5.3 s) and then runs its own 2 s: ~7.3 s for a sync agent, so 7 s left a
        # margin of a few hundred ms that a quick host sometimes kept within; the async agents
        # answer in ~4 s.
        STEP_TIMEOUT_SECONDS="6",
        REMOTE_CALL_TIMEOUT_SECONDS="5",
    )
    # 30 reserves of 2 s: async, two rounds of host.json's 16 concurrent calls (~4 s);
    # sync, five rounds of the pool's threads (~10 s, shared with the scheduler).
    ids = [f"w-{i}" for i in range(30)]
    stack.send([(order_id, order_json(order_id)) for order_id in ids])

    def dropped() -> int:
        log = host.log_text()
        return sum(log.count(marker) for marker in DROPPED)

    def settled():
        if dropped():
            return True
        states = stack.states(ids)
        return all(s is not None and s.process_state.terminal for s in states.values())

    wait_until(settled, timeout=90, what="every order to finish, or a request to be dropped", interval=1.0)
    return host, ids, dropped()


def test_async_agents_on_the_workers_default_pool_drop_nothing_with_a_slow_remote(stack):
    host, ids, dropped = slow_remote_run(stack)
    assert dropped == 0, f"{dropped} request(s) dropped past complete-by with {host.sync_threads} worker threads"
    states = stack.wait_closed(ids, timeout=30)
    assert {s.process_state for s in states.values()} == {ProcessState.PROCESSED}
    assert all(line.failure_count == 0 for order_id in ids for line in stack.lines(order_id).values())


def test_sync_agents_on_the_same_pool_drop_requests_past_complete_by(stack, tmp_path):
    host, _, dropped = slow_remote_run(stack, sync_agents.write_app(tmp_path / "sync-app"))
    assert host.sync_threads == WORKER_THREADS
    assert dropped > 0, "the sync agents kept up: the pool limit is no longer reproduced"
