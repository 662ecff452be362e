"""AdvanceTimeSettings and Frequency: validated at construction, errors name the field and the fix."""

import pytest

from ctiflow.operators.errors import ConfigError
from ctiflow.operators.time import AdvanceTimeSettings, Frequency, ViolationPolicy


def test_seed_generation_settings_map_to_advance_time_settings():
    # new AdvanceTimeGenerationSettings(10, TimeSpan.FromSeconds(5), true)
    s = AdvanceTimeSettings(delay=5000, frequency=Frequency(events=10), flush_at_end=True)
    assert s.frequency == Frequency(events=10)
    assert s.policy is ViolationPolicy.DROP
    assert s.import_from is None


def test_defaults_generate_a_cti_after_each_event_without_delay():
    s = AdvanceTimeSettings()
    assert (s.delay, s.frequency, s.flush_at_end) == (0, Frequency(events=1), True)


def test_negative_delay_is_allowed():
    assert AdvanceTimeSettings(delay=-1).delay == -1


@pytest.mark.parametrize("events", [0, -3, 1.5, True])
def test_frequency_events_must_be_a_positive_integer(events):
    with pytest.raises(ConfigError, match="frequency.events must be an integer >= 1"):
        Frequency(events=events)


def test_frequency_duration_must_be_positive():
    with pytest.raises(ConfigError, match="frequency.duration"):
        Frequency(duration=0)


def test_frequency_needs_events_or_duration():
    with pytest.raises(ConfigError, match="neither events nor duration"):
        Frequency()


def test_frequency_can_combine_events_and_duration():
    assert Frequency(events=10, duration=5000).duration == 5000


def test_policy_accepts_its_string_value():
    assert AdvanceTimeSettings(policy="adjust").policy is ViolationPolicy.ADJUST


def test_invalid_policy_lists_valid_choices():
    with pytest.raises(ConfigError, match='Invalid "policy" value: .*Valid choices are: drop, adjust'):
        AdvanceTimeSettings(policy="retract")


@pytest.mark.parametrize("delay", ["5s", 1.0, None])
def test_delay_must_be_an_integer(delay):
    with pytest.raises(ConfigError, match="delay must be an integer"):
        AdvanceTimeSettings(delay=delay)


def test_import_from_must_name_a_stream():
    with pytest.raises(ConfigError, match="import_from"):
        AdvanceTimeSettings(import_from="")


def test_from_dict_builds_nested_frequency():
    s = AdvanceTimeSettings.from_dict(
        {"delay": 5000, "frequency": {"events": 10}, "policy": "adjust", "import_from": "events"}
    )
    assert s == AdvanceTimeSettings(5000, Frequency(events=10), True, ViolationPolicy.ADJUST, "events")


def test_from_dict_null_frequency_disables_generation():
    assert AdvanceTimeSettings.from_dict({"frequency": None}).frequency is None


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="unknown advance-time setting"):
        AdvanceTimeSettings.from_dict({"dealy": 5})
    with pytest.raises(ConfigError, match="unknown frequency setting"):
        AdvanceTimeSettings.from_dict({"frequency": {"every": 5}})
