"""The dry run's step timing (bench.harness.estimate.per_sample_ms): the fastest of a few
steps, so one step slowed by other work on the machine does not become the estimate."""

from __future__ import annotations

import pytest

from bench.config import RunConfig
from bench.harness import estimate
from bench.workload import data


class Clock:
    """perf_counter for per_sample_ms: each step (two readings) lasts the next of
    `steps` seconds."""

    def __init__(self, steps: list[float]) -> None:
        self.steps, self.now, self.reads = list(steps), 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # a step's end
            self.now += self.steps.pop(0)
        return self.now


@pytest.fixture
def mnist(data_root):
    cfg = RunConfig(dataset="mnist", data_root=str(data_root), device="cpu", limit=64)
    return cfg, data.load(cfg)


@pytest.mark.parametrize(
    "steps, timed, fastest",
    [
        # a warm-up, then a busy machine's slow steps and one at its own speed: 5 fit
        ([5.0, 0.3, 0.3, 0.004, 0.3, 0.3], 5, 0.004),
        # slow steps: two timed ones past a second, as many as before
        ([9.0, 0.8, 0.6], 2, 0.6),
    ],
)
def test_the_fastest_of_as_many_steps_as_fit_in_a_second(
    mnist, monkeypatch, steps, timed, fastest
) -> None:
    cfg, bundle = mnist
    clock = Clock(steps)
    monkeypatch.setattr(estimate.time, "perf_counter", clock)
    ms = estimate.per_sample_ms(cfg, bundle, batch=8)
    assert clock.reads == 2 * (timed + 1)  # the warm-up, then the timed steps
    assert ms == pytest.approx(1e3 * fastest / 8)
