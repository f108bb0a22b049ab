"""Deferred save completion from Python: a scheduler process's side and a
worker's, with Python store tasks, shipped through the wire form."""

from __future__ import annotations

import threading

import pytest

from conftest import GatedTask
from kvtier import (
    ConfigError,
    ReportAggregator,
    ReportError,
    SaveScheduler,
    SaveStep,
    SaveTracker,
    StepError,
    WireError,
    WorkerReport,
)


class Cluster:
    """A scheduler and `workers` workers, every step and report shipped as
    bytes, as between vLLM's scheduler and its worker processes."""

    def __init__(self, workers: int = 1) -> None:
        self.scheduler = SaveScheduler()
        self.frees = ReportAggregator(workers)
        self.trackers = [SaveTracker() for _ in range(workers)]
        self.freed: list[str] = []

    def step(self, saves=(), tasks=None):
        """One step: every worker takes it, submits its task for the saving
        requests, then reports; returns what the scheduler may free."""
        wire = self.scheduler.record_step(list(saves)).encode()
        freed = []
        for rank, tracker in enumerate(self.trackers):
            step = SaveStep.decode(wire)
            tracker.begin_step(step)
            if step.requests and tasks is not None:
                tracker.submit(tasks[rank], step.requests)
            report = WorkerReport.decode(tracker.finish_step(rank, step).encode())
            free, refused = self.frees.accept(report)
            assert refused == []
            freed += free
        self.freed += freed
        return freed

    def finish(self, req_id: str) -> bool:
        delayed = self.scheduler.request_finished(req_id)
        if delayed:
            self.frees.expect(req_id)
        return delayed


def test_a_finished_request_is_reported_only_after_its_task_is_done_exactly_once():
    cluster = Cluster(workers=2)
    tasks = [GatedTask(), GatedTask()]
    cluster.step([("req-1", 4), ("req-2", 0)], tasks)
    assert cluster.finish("req-1") is True, "its blocks wait for the saves"
    assert cluster.finish("req-2") is False, "nothing saved: freed at once"
    for _ in range(3):
        assert cluster.step() == [], "a save still reads req-1's blocks"
    tasks[0].finish()
    assert cluster.step() == [], "worker 1's save is still running"
    tasks[1].finish()
    assert cluster.step() == ["req-1"]
    for _ in range(3):
        cluster.step()
    assert cluster.freed == ["req-1"], "reported exactly once"
    for tracker in cluster.trackers:
        stats = tracker.stats()
        assert stats["reported"] == 1
        assert stats["tasks_submitted"] == 1
        assert tracker.running_tasks == 0 and tracker.tracked_requests == 0
    assert all(task.waits <= 1 for task in tasks)


def test_a_failed_save_is_still_reported_once():
    cluster = Cluster()
    task = GatedTask(fail="disk full")
    cluster.step([("req", 1)], [task])
    cluster.finish("req")
    task.finish()
    assert cluster.step() == ["req"]
    stats = cluster.trackers[0].stats()
    assert stats["task_failures"] == 1 and stats["reported"] == 1


def test_a_refused_submission_still_reports():
    cluster = Cluster()
    tracker = cluster.trackers[0]
    step = SaveStep.decode(cluster.scheduler.record_step([("req", 2)]).encode())
    tracker.begin_step(step)
    tracker.submit_failed(step.requests, "store refused the save")
    assert cluster.frees.accept(tracker.finish_step(0, step)) == ([], [])
    cluster.finish("req")
    assert cluster.step() == ["req"]
    assert tracker.stats()["submit_failures"] == 1


def test_preemption_waits_only_for_the_preempted_requests_saves():
    scheduler = SaveScheduler()
    tracker = SaveTracker()
    preempted, other = GatedTask(), GatedTask()
    step = scheduler.record_step([("p", 1), ("o", 1)])
    tracker.begin_step(step)
    tracker.submit(preempted, ["p"])
    tracker.submit(other, ["o"])
    scheduler.preempt(["p"])
    next_step = scheduler.record_step([])
    assert next_step.preempted == ["p"]
    # The fence waits for p's save; another thread finishes it meanwhile,
    # which it can only do while begin_step has let go of the GIL.
    threading.Timer(0.05, preempted.finish).start()
    tracker.begin_step(next_step)
    assert preempted.waits == 1 and preempted.done()
    assert other.waits == 0 and not other.done(), "o's save is not waited for"
    assert tracker.stats()["preemption_fences"] == 1
    other.finish()
    tracker.wait_all()


def test_a_blocking_tracker_waits_in_get_finished():
    tracker = SaveTracker(blocking=True)
    scheduler = SaveScheduler()
    task = GatedTask()
    step = scheduler.record_step([("req", 1)])
    tracker.begin_step(step)
    tracker.submit(task, ["req"])
    threading.Timer(0.05, task.finish).start()
    assert tracker.get_finished(["req"]) == ["req"]
    assert tracker.stats()["tasks_waited"] == 1


def test_steps_and_reports_round_trip_and_garbage_is_refused():
    scheduler = SaveScheduler()
    scheduler.record_step({"a": 1, "b": 2})
    scheduler.request_finished("a")
    scheduler.preempt(["b"])
    step = scheduler.record_step([("c", 1)])
    wire = step.encode()
    assert isinstance(wire, bytes)
    decoded = SaveStep.decode(wire)
    assert decoded == step
    assert (decoded.step, decoded.requests, decoded.preempted, decoded.finished) == (1, ["c"], ["b"], ["a"])
    for bad in [b"", b"KVTW", wire[:-1], b"x" * len(wire), wire[:4] + b"\x09" + wire[5:]]:
        with pytest.raises(WireError):
            SaveStep.decode(bad)
    with pytest.raises(WireError):
        WorkerReport.decode(wire)  # a step is not a report
    tracker = SaveTracker()
    tracker.begin_step(SaveStep.decode(scheduler_step_zero()))
    report = tracker.finish_step(3, SaveStep.decode(scheduler_step_zero()))
    again = WorkerReport.decode(report.encode())
    assert again == report and (again.worker, again.step, again.finished) == (3, 0, [])
    assert again.stats()["steps"] == 1


def scheduler_step_zero() -> bytes:
    return SaveScheduler().record_step([]).encode()


def test_steps_out_of_sequence_are_refused_and_change_nothing():
    scheduler = SaveScheduler()
    steps = [scheduler.record_step([("r%d" % i, 1)]) for i in range(3)]
    tracker = SaveTracker()
    tracker.begin_step(steps[0])
    with pytest.raises(StepError, match="missing"):
        tracker.begin_step(steps[2])  # step 1 was lost
    with pytest.raises(StepError):
        tracker.begin_step(steps[0])  # step 0 again
    assert tracker.next_step == 1
    tracker.begin_step(steps[1])
    tracker.begin_step(steps[2])


def test_the_aggregator_refuses_what_would_free_early_or_never():
    with pytest.raises(ConfigError):
        ReportAggregator(0)
    frees = ReportAggregator(2)
    frees.expect("a")
    tracker = SaveTracker()
    scheduler = SaveScheduler()
    step0 = scheduler.record_step([])
    tracker.begin_step(step0)
    report = tracker.finish_step(0, step0)
    assert frees.accept(report) == ([], [])
    with pytest.raises(ReportError, match="step 0"):
        frees.accept(report)  # repeated
    step1 = scheduler.record_step([])
    tracker.begin_step(step1)
    with pytest.raises(ReportError):
        frees.accept(tracker.finish_step(5, step1))  # no worker 5
    assert frees.waiting == 1 and frees.is_waiting("a")


def test_bad_arguments_raise_type_errors():
    tracker = SaveTracker()
    with pytest.raises(TypeError, match="done"):
        tracker.submit(object(), ["r"])
    with pytest.raises(TypeError, match="single str"):
        tracker.submit(GatedTask(), "req-1")
    with pytest.raises(OverflowError):
        SaveScheduler().record_step([("r", -1)])  # a negative block count
