"""The baseline: one process, one device, no wrapper. Every speed-up is measured against it."""

from __future__ import annotations

from strategies.base import Strategy, Variant


class Single(Strategy):
    variants = {"single": Variant("inprocess", "one device, no wrapper (the baseline)")}
