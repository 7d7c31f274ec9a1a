"""A data set of your own, as parabench takes it: `--dataset examples.own_data:shapes`
(a module on the Python path: run from the repository root, or install your package) or
`--dataset examples/own_data.py:shapes`.

The contract (README, "Your own model and data"): a factory returns either a map-style
`torch.utils.data.Dataset` of (input, target) pairs that says how many classes it has
(`num_classes`, `classes`, or `vocab_size` for token data), or a tuple of tensors
(inputs, targets[, num_classes]). `--dataset-arg key=value` become the factory's keyword
arguments. parabench holds out the last tenth (at most --eval-samples); targets shaped like
the input (not one label) make it token data, counted in tokens/s.

This one draws 32x32 grey images of four shapes (disc, square, cross, ring) at random
places and sizes, deterministically from `seed`: real, learnable, and no download.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

SHAPES = ("disc", "square", "cross", "ring")


class Shapes(Dataset):
    classes = SHAPES

    def __init__(self, n: int, seed: int, size: int = 32) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, len(SHAPES), (n,), generator=g)
        self.centres = torch.randint(10, size - 10, (n, 2), generator=g)
        self.radii = torch.randint(4, 9, (n,), generator=g)
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        self.grid = (yy.float(), xx.float())

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        yy, xx = self.grid
        (cy, cx), r, label = self.centres[i].float(), self.radii[i].float(), int(self.labels[i])
        dy, dx = (yy - cy).abs(), (xx - cx).abs()
        dist = (dy**2 + dx**2).sqrt()
        mask = {
            0: dist <= r,
            1: (dy <= r) & (dx <= r),
            2: ((dy <= r) & (dx <= r / 3)) | ((dx <= r) & (dy <= r / 3)),
            3: (dist <= r) & (dist >= r - 2),
        }[label]
        return (mask.float().unsqueeze(0) - 0.5) * 2, self.labels[i]


def shapes(n: int = 4096, seed: int = 0) -> Dataset:
    return Shapes(n, seed)
