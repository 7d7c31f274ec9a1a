from __future__ import annotations

import pytest

from bench.config import ConfigError, RunConfig


def test_defaults_fill_model_from_dataset():
    assert RunConfig(dataset="mnist").model == "mnist_cnn"
    assert RunConfig(dataset="imagenet-subset").model == "resnet18"
    assert RunConfig(dataset="synthetic", model="resnet50").model == "resnet50"


def test_data_root_from_environment(monkeypatch):
    monkeypatch.setenv("PARABENCH_DATA_ROOT", "/somewhere")
    assert RunConfig().data_root == "/somewhere"
    assert RunConfig(data_root="/explicit").data_root == "/explicit"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"dataset": "cifar"}, "unknown dataset 'cifar'"),
        ({"device": "tpu"}, "unknown device 'tpu'"),
        ({"global_batch": 0}, "--global-batch must be a positive integer"),
        ({"epochs": 0}, "--epochs must be at least 1"),
        ({"max_steps": 0}, "--max-steps"),
        ({"warmup_steps": -1}, "--warmup-steps"),
        ({"repeats": 0}, "--repeats"),
        ({"world_sizes": (0,)}, "world sizes must be positive"),
        ({"world_sizes": (2, 2)}, "lists a size twice"),
        ({"strategies": ("single", "single")}, "lists a strategy twice"),
        ({"timeout_s": 0}, "--timeout"),
    ],
)
def test_bad_values_say_what_to_do(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("-", r"\-")):
        RunConfig(**kwargs)


def test_round_trip_through_dict():
    cfg = RunConfig(strategies=("single", "dp"), world_sizes=(1, 2), options={"opt_level": "O2"})
    again = RunConfig.from_dict(cfg.to_dict())
    assert again == cfg
