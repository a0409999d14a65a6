"""An engine that reports no KV capacity is planned from its model, as `thunder-mw plan` does."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from support.asgi_servers import serving
from support.fake_engine import FakeEngine

from thunder_mw.cli.config_loader import ConfigError, load_config
from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig

# 2 x 4 layers x 2 KV heads x 64 head dim x 2 bytes (bf16) = 2,048 bytes per token.
MODEL = {
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "hidden_size": 512,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(MODEL))
    return tmp_path


def test_admission_plans_capacity_when_the_engine_reports_none(model_dir: Path) -> None:
    engine = FakeEngine(report_capacity=False)
    with serving(engine) as es:
        plan = {"model": str(model_dir), "kv_space_gib": 1}
        config = ThunderConfig(backends=[{"name": "e", "url": es.url, "plan": plan}])
        app = create_app(config)
        with serving(app) as gw:
            backend = httpx.get(f"{gw.url}/health").json()["backends"][0]
    expected = (1 << 30) // 2048
    assert backend["capacity_tokens"] == expected and backend["capacity_source"] == "plan"
    assert app.core.scheduler.core.backends["e"].capacity == expected


def test_the_engines_own_capacity_wins_over_the_plan(model_dir: Path) -> None:
    engine = FakeEngine(num_blocks=100, block_size=16)
    with serving(engine) as es:
        plan = {"model": str(model_dir), "kv_space_gib": 1}
        config = ThunderConfig(backends=[{"name": "e", "url": es.url, "plan": plan}])
        with serving(create_app(config)) as gw:
            backend = httpx.get(f"{gw.url}/health").json()["backends"][0]
    assert backend["capacity_tokens"] == 1600 and backend["capacity_source"] == "engine"


def test_a_plan_that_cannot_be_computed_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "backends:\n  - url: http://127.0.0.1:1\n    plan:\n      model: /nonexistent\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems[0].startswith("backends[0].plan")
    assert "config.json" in info.value.problems[0]
