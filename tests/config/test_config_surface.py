"""The size of the configuration surface, and what an old config meets for a key that is gone."""

import pytest

from pipeline.config.loading import load_config
from pipeline.config.schema import REMOVED_KEYS, Config
from pipeline.core.errors import ConfigError

MOST_KEYS = 70
"""Issue 37's bound on the whole config: knobs a measurement or the hardware decides are not keys."""


def test_the_whole_config_has_at_most_70_keys():
    keys = Config().flat()
    assert len(keys) <= MOST_KEYS, f"{len(keys)} config keys: {sorted(keys)}"


def test_no_removed_key_is_still_a_key():
    assert not set(REMOVED_KEYS) & set(Config().flat()), "a key is both live and listed as removed"


@pytest.mark.parametrize("key", sorted(REMOVED_KEYS))
def test_a_removed_key_stops_with_one_line_that_says_what_decides_it_now(key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{key}=1"])
    message = str(info.value)
    assert message.startswith(f"{key} is no longer a config key: "), message
    assert "\n" not in message and len(message) > len(f"{key} is no longer a config key: ") + 10
