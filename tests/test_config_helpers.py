"""The one deep merge (`trm.config.merged`) and the one dotted-key lookup (`config_value`, `set_config_value`) that
run configs and the workflow's settings share."""

from __future__ import annotations

import pytest

from trm.config import config_value, merged, set_config_value


def test_one_deep_merge_and_one_dotted_lookup_serve_configs_and_settings():
    base = {"launch": {"hosts": 1, "tpu": {"zone": "a", "slices": ["s"]}}, "scale": "smoke"}
    over = {"launch": {"tpu": {"zone": "b"}}, "scale": {"odd": 1}}
    result = merged(base, over)
    assert result == {"launch": {"hosts": 1, "tpu": {"zone": "b", "slices": ["s"]}}, "scale": {"odd": 1}}
    result["launch"]["tpu"]["slices"].append("t")  # a copy: neither input changes
    assert base["launch"]["tpu"] == {"zone": "a", "slices": ["s"]} and over == {
        "launch": {"tpu": {"zone": "b"}},
        "scale": {"odd": 1},
    }
    assert config_value(result, "launch.tpu.zone") == "b"
    set_config_value(result, "launch.hosts", 8)
    set_config_value(result, "seed", 3)
    assert result["launch"]["hosts"] == 8 and result["seed"] == 3
    for missing in ("launch.port", "scale.odd.deeper"):
        with pytest.raises((KeyError, TypeError)):
            config_value(result, missing)
