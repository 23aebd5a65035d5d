"""The split of the host's CPU: the functions' own (from the invocations' ``Cpu=``) and the local host's."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.hostcpu import function_cpu, per_thread, read_profile, split_per_order, thread_names
from benchmarks.procstat import ThreadTimes, thread_times
from tests.polling import wait_until

LOG = """\
2026-11-25 02:43:11,149 INFO    [scheduler.dispatch] order o-1 claimed
2026-11-25 02:43:11,150 INFO    [funchost] Executed 'Functions.submit_order' (Succeeded, Id=a, Duration=31ms) Cpu=9.50ms trigger=serviceBusTrigger queue=orders message_id=o-1 delivery_count=1
2026-11-25 02:43:11,151 INFO    [funchost] Executed 'Functions.schedule_order_3' (Succeeded, Id=b, Duration=12ms) Cpu=6.00ms trigger=queueTrigger queue=q3 message_id=m
2026-11-25 02:43:11,152 ERROR   [funchost] Executed 'Functions.complete_step' (Failed, Id=c, Duration=40ms) Cpu=8.50ms trigger=serviceBusTrigger queue=agent-responses error=ValueError: x
"""


def test_the_functions_cpu_is_read_by_function_and_trigger_after_the_offset(tmp_path):
    log = tmp_path / "host-1.log"
    earlier = "... [funchost] Executed 'Functions.submit_order' (Succeeded, Id=z, Duration=1ms) Cpu=99.00ms trigger=serviceBusTrigger\n"
    log.write_text(earlier + LOG)
    found = function_cpu([log], [len(earlier)])
    assert dict(found.by_function) == {"submit_order": 9.5, "schedule_order_3": 6.0, "complete_step": 8.5}
    assert dict(found.by_trigger) == {"serviceBusTrigger": 18.0, "queueTrigger": 6.0}
    assert found.total_ms == 24.0 and found.invocations["complete_step"] == 1


def test_per_order_the_host_is_the_functions_plus_its_own_emulation(tmp_path):
    log = tmp_path / "host-1.log"
    log.write_text(LOG)
    split = split_per_order(0.060, function_cpu([log], [0]), orders=2)  # 60 ms of process CPU, 2 orders
    assert split["host"] == 30.0 and split["functions"] == 12.0 and split["host_emulation"] == 18.0
    assert split["functions_by_trigger"] == {"queueTrigger": 3.0, "serviceBusTrigger": 9.0}


def test_profile_samples_are_split_by_the_thread_that_ran_them(tmp_path):
    raw = tmp_path / "profile.txt"
    raw.write_text(
        "thread (11): worker-sync_0;_worker (concurrent/futures/thread.py:83);"
        "get_entity (azure/data/tables/_table_client.py:578);readinto (socket.py:692) 3\n"
        "thread (12): queue-schedule_order_1_0;poll (tools/funchost/queue_trigger.py:120);"
        "receive_messages (azure/storage/queue/_queue_client.py:900) 5\n"
        "thread (13): funchost-event-loop;run (agents/remote.py:140) 2\n"
    )
    profile = read_profile(raw)
    assert profile.samples == {"functions": 5, "host": 5}
    assert profile.own["functions"] == {"readinto (stdlib/socket)": 3, "run (agents/remote)": 2}
    assert profile.within["functions"]["azure/data/tables"] == 3
    assert profile.own["host"] == {"receive_messages (azure/storage/queue)": 5}


def test_the_hand_written_cpu_section_is_kept_by_make_bench_and_not_read_as_a_phase(tmp_path):
    from benchmarks.report import CPU_BEGIN, CPU_END, cpu_section, kept_sections

    notes = f"{CPU_BEGIN}\n## Where the CPU goes, and what was cut\n\n| change | before | after |\n{CPU_END}\n"
    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n\n## Machine\n\n| date | d |\n\n## Idle cost\n\nidle body\n\n" + notes)
    assert cpu_section(report) == notes
    kept = kept_sections(report, {"idle": "Idle cost", "cpu": "Where the CPU goes, and what was cut"})
    assert [section.key for section in kept] == ["idle"] and "CPU" not in kept[0].kept


def test_threads_are_grouped_by_kind_per_order_busiest_first():
    before = {1: ThreadTimes(1.0, 0.5, 10, 1), 2: ThreadTimes(0.0, 0.0, 0, 0)}
    after = {1: ThreadTimes(1.2, 0.6, 30, 3), 2: ThreadTimes(0.1, 0.1, 10, 1),  # 3 started after the reading
             3: ThreadTimes(0.5, 0.0, 4, 0), 4: ThreadTimes(0.0, 0.0, 5, 0)}
    names = {1: "listener-complete_step", 2: "worker-sync", 3: "worker-sync"}
    rows = per_thread(before, after, names, orders=10)
    assert [row[0] for row in rows] == ["worker-sync", "listener-complete_step"]  # 4 used no CPU
    name, user, system, voluntary, involuntary = rows[0]
    assert (round(user, 6), round(system, 6), voluntary, involuntary) == (60.0, 10.0, 1.4, 0.1)
    assert [round(x, 6) for x in rows[1][1:]] == [20.0, 10.0, 2.0, 0.2]


BUSY_CHILD = """
import threading, time
def spin():
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        pass
    print("spun", flush=True)
    time.sleep(60)
threading.Thread(target=spin, name="worker-sync_3").start()
time.sleep(60)
"""


def test_a_real_process_threads_are_read_from_proc_and_named_by_py_spy():
    child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "spun"
        times = thread_times(child.pid)
        names = wait_until(lambda: thread_names(child.pid) or None, timeout=30, what="py-spy naming the threads")
        assert set(names) == set(times) and sorted(names.values()) == ["MainThread", "worker-sync"]
        (spinner,) = [tid for tid, name in names.items() if name == "worker-sync"]
        assert times[spinner].user + times[spinner].system >= 0.25
        assert times[child.pid].user + times[child.pid].system < 0.25
    finally:
        child.kill()
        child.wait()
