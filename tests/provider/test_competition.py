"""The competition watch of low-priority convert instances: whom it counts and when it gives way."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from olmocr_tasks.provider.competition import CompetitionWatch, conversion_dags, other_active_runs


def test_other_active_runs_counts_every_conversion_dag_but_not_the_own_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLMOCR_CONVERSION_DAGS", "team_pdfs, olmocr_ingest,")
    asked: list[tuple[str, tuple[str, ...]]] = []
    active = {"my_dag": 1, "olmocr_ingest": 2, "olmocr_s3_events": 0, "team_pdfs": 1}

    def get_dr_count(dag_id: str, states: list[str]) -> int:
        asked.append((dag_id, tuple(states)))
        return active[dag_id]

    ti = SimpleNamespace(dag_id="my_dag", get_dr_count=get_dr_count)
    assert conversion_dags("my_dag") == ["my_dag", "olmocr_ingest", "olmocr_s3_events", "team_pdfs"]
    assert other_active_runs({"ti": ti}) == 3  # 4 active, one of them this task's own run
    assert {dag for dag, _ in asked} == set(active) and all(states == ("queued", "running") for _, states in asked)
    active.update(olmocr_ingest=0, team_pdfs=0)
    assert other_active_runs({"ti": ti}) == 0


def test_the_watch_gives_way_once_at_the_first_poll_that_sees_others_and_survives_failed_polls() -> None:
    answers = iter([0, RuntimeError("api-server restarting"), 0, 2, 5])
    polls: list[object] = []
    gave_way: list[int] = []
    polled_after_giving_way = threading.Event()

    def others() -> int:
        answer = next(answers)
        polls.append(answer)
        if gave_way:
            polled_after_giving_way.set()
        if isinstance(answer, Exception):
            raise answer
        return answer

    watch = CompetitionWatch(others, lambda: gave_way.append(len(polls)), poll_s=0.001).start()
    assert watch.gave_way.wait(10)
    watch.stop()
    assert gave_way == [4]  # at the fourth poll, the first that saw another run, and only once
    assert not polled_after_giving_way.is_set()


def test_a_stopped_watch_that_never_saw_others_never_gives_way() -> None:
    polled = threading.Event()

    def others() -> int:
        polled.set()
        return 0

    watch = CompetitionWatch(others, lambda: pytest.fail("gave way while alone"), poll_s=3600).start()
    assert polled.wait(10)
    watch.stop()  # ends the wait of an hour at once
    assert not watch.gave_way.is_set()


def test_where_the_channel_to_airflow_is_not_thread_safe_the_watch_asks_once_on_the_calling_thread() -> None:
    """``airflow dags test``'s in-process channel (and no channel at all, here) must not be used from a
    second thread: the watch asks once, at start, on the caller's thread, and starts no thread."""
    from olmocr_tasks.provider.competition import polls_from_a_thread_are_safe

    assert not polls_from_a_thread_are_safe()
    callers: list[str] = []

    def others() -> int:
        callers.append(threading.current_thread().name)
        return 0

    watch = CompetitionWatch(others, lambda: pytest.fail("gave way while alone"), poll_s=0.001, repeat=False).start()
    watch.stop()
    assert callers == [threading.current_thread().name]
    seen = CompetitionWatch(lambda: 1, lambda: None, repeat=False).start()
    assert seen.gave_way.is_set()
