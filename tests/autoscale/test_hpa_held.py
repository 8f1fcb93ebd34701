"""A sync whose winning metric asks for the replicas there keeps them, whatever the windows and policies remember:
`hpa.decide` takes that case without consulting them (most syncs of a replay are this one), so these pin what it
answers to what consulting them gives."""

import pytest

from exporter.autoscale import hpa
from exporter.scaling import Behavior, Policy, Rules

# Both windows and both policies in play, so a consulted rule would show in the answer.
HELD_BACK = Behavior(
    scale_up=Rules(30, "Min", (Policy("Pods", 2, 60), Policy("Percent", 50, 60))),
    scale_down=Rules(45, "Min", (Policy("Pods", 1, 60),)),
)
NOW = 270.0


def _history() -> hpa.History:
    """From 6 replicas asked for 9, then 4, then 8 (each held back by a window or a policy on the way): at NOW the
    replicas stand at 8, one removed 45 s ago and one added 15 s ago, both within their policies' period."""
    history, current = hpa.first_history(0.0, 6), 6
    for index, wanted in enumerate([9] * 9 + [4] * 7 + [8] * 2):
        reading = hpa.Reading("m", "AverageValue", 1000, float(wanted))
        decision, history = hpa.decide(HELD_BACK, (1, 20), history, index * 15.0, current, current, [reading])
        current = decision.replicas
    assert current == 8
    assert (history.scale_up, history.scale_down) == ((hpa.ScaleEvent(255.0, 1),), (hpa.ScaleEvent(225.0, 1),))
    return history


@pytest.mark.parametrize(
    ("reading", "ready", "reason"),
    [
        (hpa.Reading("m", "AverageValue", 1000, 8.5), 8, hpa.WITHIN_TOLERANCE),  # 8.5 / 8: within 10% of 1
        (hpa.Reading("m", "Value", 1000, 2.0), 4, hpa.METRIC),  # ceil(2 x 4 ready) = 8, outside the tolerance
    ],
)
def test_a_proposal_of_the_current_replicas_is_kept_with_its_own_reason(
    reading: hpa.Reading, ready: int, reason: str
) -> None:
    history, now = _history(), NOW
    decision, after = hpa.decide(HELD_BACK, (1, 20), history, now, 8, ready, [reading])
    assert (decision.proposed_replicas, decision.stabilized_replicas, decision.replicas) == (8, 8, 8)
    assert decision.reason == reason
    # What consulting the rules gives: the windows hold 8, and the policies allow 7 to 10 (from 8 at the start of
    # their periods: 8 now, one added and one removed since).
    assert hpa.stabilize(HELD_BACK, history, now, 8, 8) == 8
    assert hpa.scale_down_limit(HELD_BACK.scale_down, history, now, 8) == 7
    assert hpa.scale_up_limit(HELD_BACK.scale_up, history, now, 8) == 10
    # The sync is remembered as the controller would: its recommendation added, no scale event.
    assert after.recommendations[-1] == (now, 8)
    assert (after.scale_up, after.scale_down) == (history.scale_up, history.scale_down)
