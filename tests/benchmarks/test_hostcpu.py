"""Where an instance's CPU goes: the worker processes (the app side) apart from the host process,
the workers' CPU split into Microsoft's runtime and the functions' own by py-spy's samples, and
the local host's worker processes found and named for the CPU meter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from benchmarks.hostcpu import (
    APP, FUNCTIONS, LIBRARY, RUNTIME, RUNTIME_CODE, STDLIB, Sampler, origin, per_thread, read_profile, split_per_order,
    thread_names,
)
from benchmarks.procstat import ThreadTimes, by_group, own_cpu_seconds, process_group, thread_times
from benchmarks.stack import host_workers
from tests.polling import wait_until

ROOT = "/srv/app"
SITE = "/srv/app/.venv/lib/python3.13/site-packages"
STDLIB_DIR = "/usr/lib/python3.13"


def test_the_cpu_is_split_by_process_group_per_order():
    used = {"worker-1": 0.030, "worker-1.2": 0.010, "host-1": 0.020, "azurite": 0.016, "servicebus": 0.004,
            "wall": 9.0}
    assert by_group(used) == pytest.approx({"workers": 0.040, "host_process": 0.020, "azurite": 0.016,
                                            "servicebus": 0.004})
    split = split_per_order(used, orders=2)
    assert split["workers"] == pytest.approx(20.0) and split["host_process"] == pytest.approx(10.0)
    assert split["instance"] == pytest.approx(30.0) and split["azurite"] == pytest.approx(8.0)
    assert [process_group(name) for name in ("worker-2", "host-2", "temporal")] == ["workers", "host_process",
                                                                                    "temporal"]


def test_frames_are_the_apps_a_librarys_the_runtimes_or_the_standard_librarys():
    from pathlib import Path

    root = Path(ROOT)
    assert origin(f"{ROOT}/scheduler/dispatch.py", root) == (APP, "scheduler/dispatch")
    assert origin(f"{ROOT}/function_app.py", root) == (APP, "function_app")
    # py-spy's short names would make azure.core the app's core/: full file names tell them apart.
    assert origin(f"{ROOT}/core/models.py", root) == (APP, "core/models")
    assert origin(f"{SITE}/azure/core/pipeline/_base.py", root) == (LIBRARY, "azure/core/pipeline/_base")
    assert origin(f"{SITE}/aiohttp/client.py", root)[0] == LIBRARY
    for runtime in ("azure_functions_runtime/handle_event.py", "azure/functions/meta.py", "grpc/_channel.py",
                    "google/protobuf/json_format.py", "typing_extensions.py"):
        assert origin(f"{SITE}/{runtime}", root)[0] == RUNTIME_CODE, runtime
    assert origin(f"{ROOT}/tools/funchost/worker.py", root) == (RUNTIME_CODE, "tools/funchost/worker")
    assert origin(f"{STDLIB_DIR}/asyncio/base_events.py", root) == (STDLIB, "stdlib/asyncio/base_events")
    assert origin("<frozen runpy>", root)[0] == STDLIB


def _line(thread: str, frames: list[tuple[str, str]], count: int) -> str:
    return ";".join([thread, *(f"{name} ({file}:1)" for name, file in frames)]) + f" {count}"


THREAD_BOOT = [("Thread._bootstrap", f"{STDLIB_DIR}/threading.py"),
               ("_worker", f"{STDLIB_DIR}/concurrent/futures/thread.py")]
LOOP = [("run", f"{STDLIB_DIR}/asyncio/runners.py"), ("_run_once", f"{STDLIB_DIR}/asyncio/base_events.py")]
RAW = "\n".join([
    # A sync function on the runtime's pool, in the Table SDK it called: the functions' own.
    _line("thread (11): ThreadPoolExecutor-0_0", [*THREAD_BOOT, ("run_sync_func", f"{SITE}/azure_functions_runtime/"
          "utils/executor.py"), ("complete_step", f"{ROOT}/scheduler/blueprint.py"),
          ("get_entity", f"{SITE}/azure/data/tables/_table_client.py")], 6),
    # The runtime's wrapper around it, with no app frame: the runtime's.
    _line("thread (11): ThreadPoolExecutor-0_0", [*THREAD_BOOT, ("run_sync_func", f"{SITE}/azure_functions_runtime/"
          "utils/executor.py")], 2),
    # An async agent on the event loop: the functions' own; the loop itself: the runtime's.
    _line("thread (10): MainThread", [*LOOP, ("run", f"{ROOT}/agents/remote.py")], 3),
    _line("thread (10): MainThread", [*LOOP, ("invocation_request", f"{SITE}/azure_functions_runtime/"
          "handle_event.py")], 4),
    _line("thread (10): MainThread", [*LOOP, ("select", f"{STDLIB_DIR}/selectors.py")], 1),
    # aiohttp called back by the loop for the agent's request: a library only the app uses.
    _line("thread (10): MainThread", [*LOOP, ("data_received", f"{SITE}/aiohttp/client_proto.py")], 2),
    # The FunctionRpc stream.
    _line("thread (12): grpc-thread", [("Thread._bootstrap", f"{STDLIB_DIR}/threading.py"),
                                       ("_poll", f"{ROOT}/tools/funchost/worker.py"),
                                       ("_next", f"{SITE}/grpc/_channel.py")], 2),
    "thread (0) 5",  # no stack read
])


def test_samples_are_the_functions_own_with_an_app_or_app_only_library_frame_else_the_runtimes(tmp_path):
    from pathlib import Path

    raw = tmp_path / "profile-worker-1.txt"
    raw.write_text(RAW + "\n")
    profile = read_profile({"worker-1": raw}, Path(ROOT))
    assert profile.samples == {FUNCTIONS: 11, RUNTIME: 9} and profile.unread == 5 and profile.libraries_only == 2
    assert profile.threads[FUNCTIONS] == {"ThreadPoolExecutor-0": 6, "MainThread": 5}
    assert profile.threads[RUNTIME] == {"ThreadPoolExecutor-0": 2, "MainThread": 5, "grpc-thread": 2}
    assert profile.own[FUNCTIONS]["get_entity (azure/data/tables/_table_client)"] == 6
    assert profile.within[FUNCTIONS]["azure_functions_runtime"] == 6 and profile.within[FUNCTIONS]["scheduler"] == 6
    assert profile.within[RUNTIME]["grpc"] == 2 and profile.within[RUNTIME]["tools/funchost"] == 2
    assert profile.thread_samples[("worker-1", 11)] == {FUNCTIONS: 6, RUNTIME: 2}
    # Not weighed yet: the shares are the samples'.
    assert profile.share(FUNCTIONS) == pytest.approx(11 / 20)

    # Each thread's CPU split by its own samples; a thread with no sample (grpc's C-core) is the runtime's.
    profile.weigh({("worker-1", 11): (0.8, "python"), ("worker-1", 10): (0.3, "python"),
                   ("worker-1", 12): (0.1, "python"), ("worker-1", 13): (0.2, "event_engine"),
                   ("worker-1", 14): (0.0, "python")})
    functions = 0.8 * 6 / 8 + 0.3 * 5 / 10
    assert profile.cpu[FUNCTIONS] == pytest.approx(functions)
    assert profile.cpu[RUNTIME] == pytest.approx(1.4 - functions)
    assert profile.unsampled == {"event_engine": 0.2}
    assert profile.share(FUNCTIONS) == pytest.approx(functions / 1.4)
    assert profile.share(FUNCTIONS, by_samples=True) == pytest.approx(11 / 20)
    split = profile.split(28.0)  # the workers' CPU per order, from /proc
    assert split[FUNCTIONS] == pytest.approx(28.0 * functions / 1.4)
    assert split[FUNCTIONS] + split[RUNTIME] == pytest.approx(28.0)


SPINNING_APP = """
import threading, time

def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
"""
SPINNING_WORKER = """
import sys, threading, time
sys.path.insert(0, sys.argv[1])
from scheduler.busy import spin

def runtime_spin():
    end = time.thread_time() + 10
    while time.thread_time() < end:
        sum(range(1000))

threading.Thread(target=lambda: spin(10), name="ThreadPoolExecutor-0_0", daemon=True).start()
threading.Thread(target=runtime_spin, name="grpc-thread", daemon=True).start()
print("spinning", flush=True)
time.sleep(60)
"""


def test_a_real_process_is_sampled_without_pausing_and_its_threads_cpu_split(tmp_path):
    """py-spy for real (the flags, the raw format with thread ids and full file names): a thread
    in the app's code and a thread outside it, each busy, split by their own CPU."""
    app = tmp_path / "app"
    (app / "scheduler").mkdir(parents=True)
    (app / "scheduler" / "__init__.py").write_text("")
    (app / "scheduler" / "busy.py").write_text(textwrap.dedent(SPINNING_APP))
    child = subprocess.Popen([sys.executable, "-c", SPINNING_WORKER, str(app)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "spinning"
        with Sampler({"worker-1": child.pid}, tmp_path / "profiles", app_root=app) as sampler:
            wait_until(lambda: sum(t.user for t in thread_times(child.pid).values()) >= 0.4, timeout=30,
                       what="the child's threads to spin")
        profile = sampler.profile
        assert profile.samples[FUNCTIONS] > 0 and profile.samples[RUNTIME] > 0
        assert {"ThreadPoolExecutor-0"} == set(profile.threads[FUNCTIONS])
        assert "grpc-thread" in profile.threads[RUNTIME]
        assert 0.2 < profile.share(FUNCTIONS) < 0.8, profile.cpu  # two threads each as busy as the other
        assert sum(profile.cpu.values()) > 0.2
    finally:
        child.kill()
        child.wait()


def test_a_hosts_live_workers_are_named_after_it_from_its_log(tmp_path):
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        log = (f"... [funchost] worker 0: ready (process {gone.pid})\n"  # exited: a restart replaced it
               f"... [funchost] worker 1: ready (process {children[0].pid})\n"
               f"... [funchost] worker 2: ready (process {children[1].pid})\n")
        assert host_workers(3, os.getpid(), log) == {"worker-3": children[0].pid, "worker-3.2": children[1].pid}
        assert host_workers(3, children[0].pid, log) == {}  # not that host's children
    finally:
        for child in children:
            child.kill()
            child.wait()


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
    names = {1: "grpc-thread", 2: "ThreadPoolExecutor-0", 3: "ThreadPoolExecutor-0"}
    rows = per_thread(before, after, names, orders=10)
    assert [row[0] for row in rows] == ["ThreadPoolExecutor-0", "grpc-thread"]  # 4 used no CPU
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
threading.Thread(target=spin, name="ThreadPoolExecutor-0_3").start()
time.sleep(60)
"""


def test_a_real_process_threads_are_read_from_proc_and_named_by_py_spy():
    child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "spun"
        times = thread_times(child.pid)
        names = wait_until(lambda: thread_names(child.pid) or None, timeout=30, what="py-spy naming the threads")
        assert set(names) == set(times) and sorted(names.values()) == ["MainThread", "ThreadPoolExecutor-0"]
        (spinner,) = [tid for tid, name in names.items() if name == "ThreadPoolExecutor-0"]
        assert times[spinner].user + times[spinner].system >= 0.25
        assert times[child.pid].user + times[child.pid].system < 0.25
    finally:
        child.kill()
        child.wait()


GRANDPARENT = """
import subprocess, sys
grandchild = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
print(grandchild.pid, grandchild.stdout.readline().strip(), flush=True)
grandchild.wait()
"""


def test_the_benchmarks_own_cpu_counts_its_grandchildren_a_hosts_workers():
    """A local host's worker processes are the benchmark's grandchildren: their CPU is its own, not other load."""
    before = own_cpu_seconds()
    child = subprocess.Popen([sys.executable, "-c", GRANDPARENT, BUSY_CHILD], stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild, spun = child.stdout.readline().split()
        assert spun == "spun"
        assert own_cpu_seconds() - before >= 0.25
    finally:
        if grandchild is not None:
            os.kill(int(grandchild), signal.SIGKILL)
        child.kill()
        child.wait()
