"""ArrivalPace: whether new programs keep arriving (the `auto` pause victim's switch)."""

from __future__ import annotations

import pytest

from thunder_mw.policies.arrival_pace import ArrivalPace


def test_a_batch_start_is_no_stream_however_spread_its_first_requests() -> None:
    pace = ArrivalPace()
    for i in range(50):
        pace.arrived(i * 0.5)  # a ramp of sandboxes starting
        assert not pace.streaming(i * 0.5)
    assert pace.gap_s is None


def test_arrivals_while_programs_end_are_a_stream_until_they_stop() -> None:
    pace = ArrivalPace(patience=4.0)
    pace.ended()
    for i in range(20):
        pace.arrived(10.0 * i)
    assert pace.gap_s == pytest.approx(10.0)
    assert pace.streaming(190.0 + 39.0)  # within four usual gaps of the last arrival
    assert not pace.streaming(190.0 + 41.0)  # the stream stopped: the drain


def test_a_burst_at_one_instant_is_over_at_once() -> None:
    pace = ArrivalPace()
    pace.ended()
    for _ in range(32):
        pace.arrived(100.0)
    assert pace.gap_s == 0.0
    assert pace.streaming(100.0)
    assert not pace.streaming(100.001)


def test_the_pace_follows_a_slower_stream() -> None:
    pace = ArrivalPace(patience=4.0, weight=0.5)
    pace.ended()
    now = 0.0
    for gap in [1.0] * 5 + [20.0] * 10:
        now += gap
        pace.arrived(now)
    assert pace.gap_s == pytest.approx(20.0, rel=0.01)
    assert pace.streaming(now + 60.0)


def test_the_offering_is_over_only_past_its_longest_gap() -> None:
    pace = ArrivalPace(patience=4.0)
    assert pace.over(0.0)  # a batch being offered: nothing counted yet
    for i in range(5):
        pace.arrived(float(i))  # before any program ended: the batch, not counted
    assert pace.over(5.0)
    pace.ended()
    pace.arrived(10.0)
    assert not pace.over(1_000.0)  # one counted arrival: a stream has begun
    for t in (11.0, 21.0, 22.0, 23.0):  # gaps 1, 10, 1, 1
        pace.arrived(t)
    # A lull of 9 s ends the stream (patience x its pace) but not the offering (10 s once).
    assert not pace.streaming(32.0)
    assert not pace.over(32.0)
    assert pace.over(33.5)


@pytest.mark.parametrize(("patience", "weight"), [(0.0, 0.1), (4.0, 0.0), (4.0, 1.5)])
def test_bad_settings_are_refused(patience: float, weight: float) -> None:
    with pytest.raises(ValueError):
        ArrivalPace(patience, weight)
