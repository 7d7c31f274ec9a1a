"""A model of your own, as parabench takes it: `--model examples/own_model.py:build`.

The contract (README, "Your own model and data"):
- a factory returns a `torch.nn.Module`; `--model-arg key=value` become its keyword
  arguments, and parabench adds `num_classes` (the data set's classes, or vocabulary)
  where the factory takes it;
- the module may say what it is fed, for synthetic data: `input_shape` (one sample,
  without the batch), `input_dtype` (default float32; torch.long with `vocab_size` for
  token ids, whose targets are then the next tokens) and `num_classes`;
- it trains with cross-entropy over the last dimension of its output, unless it has its
  own `loss(output, target)` method;
- a `layers()` method listing its forward as consecutive modules lets the pipeline
  strategies cut it into stages.

This one is a small CNN with BatchNorm (so `parabench verify` checks data-parallel runs
of it against the baseline that normalises over the same shares) for 32x32 grey images.
"""

from __future__ import annotations

import torch
from torch import nn


class SmallNet(nn.Module):
    input_shape = (1, 32, 32)

    def __init__(self, num_classes: int, width: int) -> None:
        super().__init__()
        self.num_classes = num_classes

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(),
                nn.MaxPool2d(2),
            )

        self.body = nn.Sequential(block(1, width), block(width, 2 * width), nn.Flatten())
        self.head = nn.Linear(2 * width * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def layers(self) -> list[nn.Module]:
        return [*self.body, self.head]


def build(num_classes: int = 10, width: int = 16) -> nn.Module:
    return SmallNet(num_classes, width)
