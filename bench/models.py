"""Models: the classic MNIST CNN, and any torchvision classification model by name."""

from __future__ import annotations

import torch
import torchvision
from torch import nn

from bench.config import ConfigError


class MnistCNN(nn.Module):
    """The two-conv network of the classic MNIST example (~1.2 M parameters)."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.25) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(dropout),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(9216, 128),
            nn.ReLU(),
            nn.Dropout(2 * dropout),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def torchvision_models() -> list[str]:
    return sorted(torchvision.models.list_models(module=torchvision.models))


def model_names() -> list[str]:
    return ["mnist_cnn", *torchvision_models()]


def input_shape(model: str, image_size: int) -> tuple[int, int, int]:
    return (1, 28, 28) if model == "mnist_cnn" else (3, image_size, image_size)


def check_model(model: str) -> None:
    if model != "mnist_cnn" and model not in torchvision_models():
        raise ConfigError(
            f"unknown model {model!r}; use mnist_cnn or a torchvision classification model "
            "(e.g. resnet18, resnet50; `parabench list` shows all)"
        )


def build_model(model: str, num_classes: int, **kwargs) -> nn.Module:
    check_model(model)
    if model == "mnist_cnn":
        return MnistCNN(num_classes, **kwargs)
    return torchvision.models.get_model(model, weights=None, num_classes=num_classes, **kwargs)
