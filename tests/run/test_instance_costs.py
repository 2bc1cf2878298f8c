"""Convert instances sized by what they cost: the measurement of a run's instances and the size it gives."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from olmocr_tasks.location.layout import OutputLocation
from olmocr_tasks.run import instance_costs
from olmocr_tasks.run.instance_costs import MAX_CONVERTING_S, InstanceCosts, InstanceTiming, measure
from olmocr_tasks.storage.store import Storage


def _two_slots_four_instances(fixed: float, converting: float, pages: int) -> list[InstanceTiming]:
    """Two slots, each running two instances in turn; each instance spends ``fixed`` seconds not
    converting (start-up and the turnover before it) and ``converting`` seconds on ``pages`` pages."""
    timings = []
    for slot in range(2):
        start = 100.0 + slot * 0.5
        for _ in range(2):
            end = start + fixed + converting
            timings.append(InstanceTiming(start, end, converting, pages))
            start = end
    return timings


def test_the_measurement_is_the_slot_time_not_spent_converting_per_instance_and_the_rate_of_one() -> None:
    costs = measure(_two_slots_four_instances(fixed=2.0, converting=14.0, pages=112))
    assert costs is not None
    assert costs.concurrency == 2
    assert costs.instances == 4
    assert costs.pages_per_s == pytest.approx(8.0)  # 112 pages in 14 s of converting
    # 2 slots x 32.5 s span - 56 s converting = 9 s, over 4 instances: their 2 s plus the half second
    # one slot stood empty at the end, shared.
    assert costs.fixed_cost_s == pytest.approx(2.25)


def test_an_instance_starting_as_another_ends_reuses_its_slot() -> None:
    back_to_back = [InstanceTiming(0, 10, 9, 90), InstanceTiming(10, 20, 9, 90)]
    assert measure(back_to_back).concurrency == 1  # type: ignore[union-attr]
    overlapping = [InstanceTiming(0, 10, 9, 90), InstanceTiming(9, 20, 9, 90)]
    assert measure(overlapping).concurrency == 2  # type: ignore[union-attr]


def test_nothing_converted_or_too_little_to_fill_a_window_measures_nothing() -> None:
    assert measure([]) is None
    assert measure([InstanceTiming(0, 5, 0.0, 0)]) is None
    # A warm-up of 4 pages an instance: its set-up inside the batch would pass for a slow server.
    assert measure([InstanceTiming(0, 2, 0.76, 4), InstanceTiming(0, 2, 0.77, 4)]) is None
    assert measure([InstanceTiming(0, 5, 2.0, 64), InstanceTiming(0, 5, 2.0, 64)]) is not None
    # A timing whose end precedes its start (a clock step) is left out, not trusted.
    assert measure([InstanceTiming(10, 5, 3.0, 3)]) is None


def test_the_size_that_pays_for_an_instance_scales_with_its_rate_and_fixed_cost() -> None:
    costs = InstanceCosts(fixed_cost_s=2.0, pages_per_s=8.0, concurrency=2, instances=4)
    # At most a tenth of the slot's time: 18 s of converting at 8 pages/s.
    assert costs.min_pages(0.1) == 144
    assert costs.min_pages(0.5) == 16  # 2 s of converting
    assert InstanceCosts(2.0, 16.0, 2, 4).min_pages(0.1) == 2 * costs.min_pages(0.1)
    assert InstanceCosts(4.0, 8.0, 2, 4).min_pages(0.1) == 2 * costs.min_pages(0.1)
    assert InstanceCosts(0.0, 8.0, 2, 4).min_pages(0.1) == 1
    # A fixed cost inflated by another run's instances never sizes an instance past ten minutes.
    assert InstanceCosts(600.0, 8.0, 2, 4).min_pages(0.1) == 8 * MAX_CONVERTING_S
    with pytest.raises(ValueError, match="overhead_fraction"):
        costs.min_pages(1.0)


@pytest.mark.parametrize(
    "stored",
    [
        b"[]",
        b"not json",
        b'{"fixed_cost_s": "Infinity", "pages_per_s": 8, "concurrency": 2, "instances": 4}',
        b'{"fixed_cost_s": 2, "pages_per_s": 0, "concurrency": 2, "instances": 4}',
        b'{"fixed_cost_s": 1e308, "pages_per_s": 8, "concurrency": 2, "instances": 4}',
        b'{"fixed_cost_s": 2, "pages_per_s": 8}',
        b'{"fixed_cost_s": 2, "pages_per_s": 8, "concurrency": 2, "instances": 4, "pad": "' + b"x" * 5000 + b'"}',
    ],
)
def test_a_stored_measurement_that_is_not_sane_is_ignored(tmp_path: Path, stored: bytes) -> None:
    state = OutputLocation(str(tmp_path)).state("conv1")
    Path(state.instance_costs).parent.mkdir(parents=True)
    Path(state.instance_costs).write_bytes(stored)
    assert instance_costs.load(Storage(), state) is None


def test_a_measurement_is_kept_per_conversion_key_and_read_back(tmp_path: Path) -> None:
    location = OutputLocation(str(tmp_path))
    costs = measure(_two_slots_four_instances(fixed=2.0, converting=14.0, pages=112))
    assert costs is not None
    assert instance_costs.load(Storage(), location.state("conv1")) is None
    instance_costs.save(Storage(), location.state("conv1"), costs)
    assert instance_costs.load(Storage(), location.state("conv1")) == costs
    assert instance_costs.load(Storage(), location.state("conv2")) is None
    assert json.loads(Path(location.state("conv1").instance_costs).read_text())["recent"][-1]["concurrency"] == 2


def test_the_plan_sizes_by_the_median_of_the_last_runs_so_one_disturbed_run_resizes_nothing(tmp_path: Path) -> None:
    state = OutputLocation(str(tmp_path)).state("conv1")
    quiet = InstanceCosts(fixed_cost_s=2.0, pages_per_s=8.0, concurrency=2, instances=4)
    # A run that shared the server: its instances converted slowly and waited long between each other.
    disturbed = InstanceCosts(fixed_cost_s=30.0, pages_per_s=1.0, concurrency=2, instances=4)
    for costs in (quiet, quiet, disturbed):
        instance_costs.save(Storage(), state, costs)
    assert instance_costs.load(Storage(), state) == replace(disturbed, fixed_cost_s=2.0, pages_per_s=8.0)
    # Only the last RECENT_RUNS are kept: once the quiet ones are older than that, the new figures rule.
    for _ in range(instance_costs.RECENT_RUNS):
        instance_costs.save(Storage(), state, disturbed)
    assert instance_costs.load(Storage(), state) == disturbed
    kept = json.loads(Path(state.instance_costs).read_text())["recent"]
    assert len(kept) == instance_costs.RECENT_RUNS


def test_a_single_measurement_kept_by_an_earlier_release_is_read(tmp_path: Path) -> None:
    state = OutputLocation(str(tmp_path)).state("conv1")
    Path(state.instance_costs).parent.mkdir(parents=True)
    single = InstanceCosts(fixed_cost_s=2.0, pages_per_s=8.0, concurrency=2, instances=4)
    Path(state.instance_costs).write_text(json.dumps(single.to_dict()))
    assert instance_costs.load(Storage(), state) == single
