"""A data set whose DataLoader worker dies on purpose after `after` samples, for the
failure tests: `how=kill` kills it with SIGKILL (what the kernel's OOM killer sends, but
not the OOM killer), `how=hog` makes it the OOM killer's choice (oom_score_adj 1000) and
allocates until the kernel kills it: run it only inside a memory cgroup with a limit."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
from torch.utils.data import Dataset, get_worker_info


class Hungry(Dataset):
    num_classes = 10

    def __init__(self, n: int, after: int, how: str) -> None:
        self.n, self.after, self.how, self.calls = n, after, how, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if get_worker_info() is not None:  # in a worker: counted per worker process
            self.calls += 1
            if self.calls == self.after and self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.calls == self.after and self.how == "hog":
                Path("/proc/self/oom_score_adj").write_text("1000")
                hog = []
                while True:  # written, so resident: the cgroup's limit is reached
                    hog.append(bytearray(64 << 20))
        return torch.full((1, 28, 28), float(i % 10)), i % 10


def hungry(n: int = 512, after: int = 50, how: str = "kill") -> Dataset:
    return Hungry(n, after, how)
