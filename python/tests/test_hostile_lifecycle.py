"""The package under hostile use (issue 31): a Python backend stuck for
good, Ctrl-C inside waits, store tasks interrupted at the preemption fence,
concurrent calls on one object, objects used after ``os.fork()``. Each test
fails on the build before its fix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from kvtier import BusyError, ForkError, Lookup, SaveScheduler, SaveTracker, ShutdownError
from kvtier._native import VllmTransfers

from conftest import PATIENCE, GatedTask, Request, watchdog


STUCK: list = []


@pytest.fixture(autouse=True)
def release_stuck_backends():
    """Lets every stuck backend return once its test ended, passed or
    failed: a failed assertion must not leave a worker (and the run's
    exit) waiting for ever."""
    yield
    while STUCK:
        STUCK.pop().release.set()


class Stuck:
    """A backend whose calls never return (until the test lets them)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        STUCK.append(self)

    def batch_lookup(self, keys, req_id):
        self.entered.set()
        self.release.wait()
        return [True] * len(keys)


def stuck_lookup(grace: float = 0.3):
    backend = Stuck()
    lookup = Lookup.python(backend, name="kvtier-stuck", shutdown_grace=grace)
    lookup.lookup(b"k", "r")
    lookup.flush()
    assert backend.entered.wait(PATIENCE)
    return lookup, backend


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Python installs its KeyboardInterrupt handler only when SIGINT is at
    its default: a run started in the background of a shell without job
    control inherits SIGINT ignored, and an interrupt test there would
    wait for its watchdog. Each test here gets the handler, then the
    disposition it had."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def interrupt_after(seconds: float) -> threading.Thread:
    """Sends this process SIGINT (Ctrl-C) from another thread."""

    def send():
        time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


# D4: a stuck backend made shutdown, the exit hook and Ctrl-C hang.
def test_a_stuck_backend_makes_shutdown_give_up_after_its_grace():
    lookup, backend = stuck_lookup(grace=0.3)
    started = time.monotonic()
    with watchdog(), pytest.raises(ShutdownError, match="did not stop"):
        lookup.shutdown()
    took = time.monotonic() - started
    assert 0.3 <= took < 5, took
    assert lookup.closed
    backend.release.set()


def test_ctrl_c_during_wait_idle_is_raised():
    lookup, backend = stuck_lookup()
    sender = interrupt_after(0.2)
    started = time.monotonic()
    with watchdog(), pytest.raises(KeyboardInterrupt):
        lookup.wait_idle()
    assert time.monotonic() - started < 5
    sender.join()
    backend.release.set()
    assert lookup.wait_idle() == 1, "the lookup still works after the interrupt"
    assert lookup.lookup(b"k", "r") is True
    lookup.shutdown()


def test_ctrl_c_during_shutdown_is_raised_once_its_grace_ran_out():
    lookup, backend = stuck_lookup(grace=0.5)
    sender = interrupt_after(0.1)
    started = time.monotonic()
    with watchdog(), pytest.raises(KeyboardInterrupt):
        try:
            lookup.shutdown()
        except ShutdownError:
            pass  # the grace ran out first
        time.sleep(2)  # a pending Ctrl-C is raised here at the latest
    took = time.monotonic() - started
    assert took < 2, f"raised {took:.2f} s after shutdown began"
    assert lookup.closed
    sender.join()
    backend.release.set()


@pytest.mark.parametrize("shut_down", [False, True])
def test_the_interpreter_exits_with_a_backend_stuck_for_good(shut_down):
    code = f"""
        import threading, kvtier
        entered = threading.Event()
        def stuck(keys, req_id):
            entered.set()
            threading.Event().wait()
        lookup = kvtier.Lookup.python(stuck, shutdown_grace=0.2)
        lookup.lookup(b"k", "r")
        lookup.flush()
        entered.wait()
        if {shut_down}:
            try:
                lookup.shutdown()
            except kvtier.ShutdownError as error:
                print("gave up:", error)
        print("exiting")
        """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert "exiting" in result.stdout


# D5: a KeyboardInterrupt inside a task's wait() became a task failure, and
# the fence passed while the save still ran.
class Interrupting(GatedTask):
    """A store task whose next ``interruptions`` waits (or done()s) raise
    KeyboardInterrupt, as a Ctrl-C inside them would."""

    def __init__(self, interruptions: int = 1, in_done: bool = False) -> None:
        super().__init__()
        self.interruptions = interruptions
        self.in_done = in_done

    def done(self) -> bool:
        if self.in_done and self.interruptions:
            self.interruptions -= 1
            raise KeyboardInterrupt
        return super().done()

    def wait(self) -> None:
        if self.interruptions:
            self.interruptions -= 1
            raise KeyboardInterrupt
        super().wait()


def tracker_with(task, request="r1"):
    scheduler = SaveScheduler()
    tracker = SaveTracker()
    tracker.begin_step(scheduler.record_step([(request, 4)]))
    tracker.submit(task, [request])
    return scheduler, tracker


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupted_fence_raises_and_does_not_pass(interrupt):
    task = Interrupting()
    scheduler, tracker = tracker_with(task)
    scheduler.preempt(["r1"])
    step = scheduler.record_step([])
    with pytest.raises(KeyboardInterrupt):
        tracker.begin_step(step)
    assert tracker.running_tasks == 1, "the save still reads its blocks"
    assert tracker.next_step == step.step, "the step was not taken"
    assert tracker.stats()["task_failures"] == 0, "an interrupt is no task failure"
    task.finish()
    tracker.begin_step(step)
    assert tracker.running_tasks == 0 and task.waits == 1


def test_an_interrupted_wait_all_and_handle_preemptions_raise_and_keep_the_task():
    task = Interrupting(interruptions=2)
    _, tracker = tracker_with(task)
    with pytest.raises(KeyboardInterrupt):
        tracker.handle_preemptions(["r1"])
    with pytest.raises(KeyboardInterrupt):
        tracker.wait_all()
    assert tracker.running_tasks == 1
    task.finish()
    assert tracker.wait_all() == []
    assert tracker.get_finished(["r1"]) == ["r1"]


def test_a_done_that_raises_an_interrupt_in_poll_raises_it():
    task = Interrupting(in_done=True)
    _, tracker = tracker_with(task)
    with pytest.raises(KeyboardInterrupt):
        tracker.poll()
    assert tracker.running_tasks == 1
    task.finish()
    assert tracker.poll() == 1


def test_a_req_id_property_that_raises_an_interrupt_raises_it():
    class Interrupts:
        @property
        def req_id(self):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        SaveScheduler().request_finished(Interrupts())
    with Lookup.python(lambda keys, req: [False] * len(keys)) as lookup:
        with pytest.raises(KeyboardInterrupt):
            lookup.lookup(b"k", Interrupts())
        with pytest.raises(TypeError, match="req_id"):
            lookup.lookup(b"k", object())


# D11: other calls during a wait got PyO3's "Already borrowed".
def test_a_call_during_another_threads_wait_idle_raises_busy_naming_it():
    lookup, backend = stuck_lookup()
    waiter = threading.Thread(target=lookup.wait_idle)
    waiter.start()
    time.sleep(0.1)
    with watchdog():
        with pytest.raises(BusyError, match=r"Lookup\.flush: Lookup\.wait_idle\(\) is in progress"):
            lookup.flush()
        with pytest.raises(BusyError, match="wait_idle"):
            lookup.shutdown()
    backend.release.set()
    waiter.join(PATIENCE)
    assert lookup.lookup(b"k", "r") is True
    lookup.shutdown()


def test_a_backend_calling_its_own_lookup_during_wait_idle_gets_busy():
    seen = []
    holder = {}

    def backend(keys, req_id):
        try:
            holder["lookup"].stats()
        except BusyError as error:
            seen.append(str(error))
        return [True] * len(keys)

    with Lookup.python(backend) as lookup:
        holder["lookup"] = lookup
        lookup.lookup(b"k", "r")
        lookup.flush()
        lookup.wait_idle()
        assert lookup.lookup(b"k", "r") is True
    holder.clear()
    assert seen and "wait_idle" in seen[0], seen


def test_a_task_calling_its_tracker_during_wait_all_gets_busy():
    seen = []

    class Reentrant(GatedTask):
        def wait(self):
            try:
                tracker.poll()
            except BusyError as error:
                seen.append(str(error))
            super().wait()

    task = Reentrant()
    task.finish()
    _, tracker = tracker_with(task)
    assert tracker.wait_all() == []
    assert seen and "SaveTracker.poll: SaveTracker.wait_all() is in progress" in seen[0], seen


def test_a_call_during_another_threads_tracker_wait_raises_busy():
    task = GatedTask()
    _, tracker = tracker_with(task)
    waiter = threading.Thread(target=tracker.wait_all)
    waiter.start()
    time.sleep(0.1)
    with pytest.raises(BusyError, match="wait_all"):
        tracker.stats()
    task.finish()
    waiter.join(PATIENCE)
    assert tracker.running_tasks == 0


# D6: in a forked child, inherited objects hung (no threads) or panicked.
def in_child(body) -> str:
    """Runs ``body()`` in a forked child; returns what it printed."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            out = body()
        except BaseException as error:  # report anything to the parent
            out = f"raised {type(error).__name__}: {error}"
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + PATIENCE
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            # A hung child is killed here: left running, it would outlive
            # the test run (and hold its output open).
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read)
            pytest.fail(f"the forked child hung for {PATIENCE} s")
        time.sleep(0.01)
    out = os.read(read, 1 << 16).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


def test_an_inherited_lookup_raises_fork_error_in_the_child(tmp_path):
    lookup = Lookup.vllm_fs(str(tmp_path))
    lookup.lookup(b"k", "r")

    def child():
        outcomes = []
        for call in (lambda: lookup.flush(), lambda: lookup.wait_idle(), lambda: lookup.shutdown()):
            try:
                call()
                outcomes.append("worked")
            except ForkError as error:
                outcomes.append("ForkError" if "os.fork()" in str(error) else str(error))
        fresh = Lookup.vllm_fs(str(tmp_path))
        fresh.lookup(b"k", "r")
        fresh.flush()
        fresh.wait_idle()
        outcomes.append(str(fresh.lookup(b"k", "r")))
        fresh.shutdown()
        return ",".join(outcomes)

    assert in_child(child) == "ForkError,ForkError,ForkError,False"
    lookup.flush()
    lookup.wait_idle()
    assert lookup.lookup(b"k", "r") is False, "the parent's lookup still works"
    lookup.shutdown()


def test_inherited_transfers_raise_fork_error_and_drop_quietly(tmp_path):
    view = memoryview(bytearray(128)).cast("B", (2, 64))
    transfers = VllmTransfers(str(tmp_path / "m_r0"), view, load_threads=1, store_threads=1)

    def child():
        outcomes = []
        for call in (transfers.drain, transfers.shutdown, transfers.finished):
            try:
                call()
                outcomes.append("worked")
            except ForkError:
                outcomes.append("ForkError")
        return ",".join(outcomes)

    assert in_child(child) == "ForkError,ForkError,ForkError"
    transfers.shutdown()


def test_dropping_inherited_objects_in_a_child_prints_nothing(tmp_path):
    code = f"""
        import os, kvtier
        from kvtier._native import VllmTransfers
        lookup = kvtier.Lookup.vllm_fs({str(tmp_path)!r})
        python = kvtier.Lookup.python(lambda keys, req: [True] * len(keys))
        view = memoryview(bytearray(128)).cast("B", (2, 64))
        transfers = VllmTransfers({str(tmp_path / "m_r0")!r}, view, load_threads=1, store_threads=1)
        pid = os.fork()
        if pid == 0:
            del lookup, python, transfers
            print("child done", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        print("parent done")
        """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert "child done" in result.stdout and "parent done" in result.stdout
    assert "Panic" not in result.stderr and "Exception" not in result.stderr, result.stderr
