"""The clock's priority queue: one due time per job, the earliest first, and a wake-up when a job
becomes due before every other one."""

from __future__ import annotations

from muralist_operator.schedule import Schedule, backoff


def test_each_job_has_one_due_time_and_they_pop_in_order() -> None:
    s: Schedule[str] = Schedule()
    s.at("b", 20.0)
    s.at("a", 10.0)
    s.at("c", 30.0)
    s.at("b", 25.0)  # later than what is due already: no change
    assert (s.when("b"), s.next_due(), len(s)) == (20.0, 10.0, 3)
    assert s.pop_due(19.0) == ["a"]
    assert s.pop_due(30.0) == ["b", "c"]
    assert (s.next_due(), len(s), s.pop_due(1e9)) == (None, 0, [])


def test_replace_moves_a_due_time_either_way_and_none_drops_it() -> None:
    s: Schedule[str] = Schedule()
    s.at("a", 10.0)
    s.replace("a", 50.0)
    assert s.pop_due(49.0) == [] and s.when("a") == 50.0
    s.replace("a", 5.0)
    s.replace("b", 7.0)
    s.replace("b", None)
    s.drop("nothing")
    assert s.pop_due(10.0) == ["a"] and s.next_due() is None


def test_wake_is_set_only_when_a_job_becomes_due_before_every_other() -> None:
    s: Schedule[str] = Schedule()
    s.at("a", 10.0)
    assert s.wake.is_set()
    s.wake.clear()
    s.at("b", 20.0)  # the sleeper wakes at 10 anyway
    assert not s.wake.is_set()
    s.at("b", 5.0)
    assert s.wake.is_set()
    s.wake.clear()
    s.replace("b", None)
    s.replace("a", None)
    s.at("c", 100.0)  # earlier than nothing: the stale entries of a and b do not count
    assert s.wake.is_set()


def test_replaced_times_do_not_pile_up() -> None:
    s: Schedule[int] = Schedule()
    for i in range(10_000):
        s.replace(i % 10, 1e6 - i)  # each job moved earlier again and again
    assert len(s) == 10 and len(s._heap) < 100
    assert sorted(s.pop_due(1e6)) == list(range(10))


def test_backoff_doubles_up_to_a_minute() -> None:
    assert [backoff(n) for n in (1, 2, 3, 7, 8, 30)] == [1.0, 2.0, 4.0, 60.0, 60.0, 60.0]
