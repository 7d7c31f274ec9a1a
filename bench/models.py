"""Models: the classic MNIST CNN, a small vision transformer built for model parallelism,
and any torchvision classification model by name."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from bench.config import ConfigError, RunConfig


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

    def layers(self) -> list[nn.Module]:
        """Its forward as a sequence of modules (for splitting it into pipeline stages)."""
        return [*self.features, *self.classifier]


class Attention(nn.Module):
    """Multi-head self-attention with separate q, k, v and output projections, so that a
    tensor-parallel plan can split them (q, k, v column-wise: whole heads per rank; the
    output projection row-wise). The number of heads is read off the tensor, so the same
    code runs on a rank that holds only its share of them."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def heads(z: torch.Tensor) -> torch.Tensor:  # (b, t, h*d) -> (b, h, t, d)
            return z.view(b, t, -1, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)))
        return self.proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, dropout: float) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), MLP(dim, mlp_ratio * dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """Non-overlapping patches, each projected to `dim`, plus a learned position embedding."""

    def __init__(self, shape: tuple[int, int, int], patch: int, dim: int) -> None:
        super().__init__()
        c, h, w = shape
        self.patch = patch
        self.proj = nn.Linear(c * patch * patch, dim)
        self.pos = nn.Parameter(torch.randn(1, (h // patch) * (w // patch), dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch
        b, c = x.shape[:2]
        x = x.unfold(2, p, p).unfold(3, p, p)  # (b, c, h/p, w/p, p, p)
        x = x.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * p * p)
        return self.proj(x) + self.pos


class Head(nn.Module):
    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(dim), nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x).mean(dim=1))


def default_patch(size: int) -> int:
    """A patch size that cuts the image into a grid of 8x8, 4x4 or 7x7 (MNIST: 7 -> 4x4)."""
    for grid in (8, 4, 7, 2, 1):
        if size % grid == 0:
            return size // grid
    return size


class Transformer(nn.Module):
    """A small vision transformer (~0.8 M parameters at the defaults): patch embedding,
    `depth` pre-norm blocks, mean-pooled head. Its `blocks` are FSDP's units, its `layers()`
    the pipeline's, and its q/k/v/proj/fc1/fc2 the tensor-parallel plan's."""

    def __init__(
        self,
        num_classes: int = 10,
        shape: tuple[int, int, int] = (1, 28, 28),
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: int = 4,
        patch: int = 0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        patch = patch or default_patch(shape[1])
        if shape[1] % patch or shape[2] % patch:
            raise ConfigError(f"transformer: patch {patch} does not divide {shape[1]}x{shape[2]}")
        if dim % heads:
            raise ConfigError(f"transformer: dim {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.embed = PatchEmbed(shape, patch, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, dropout) for _ in range(depth))
        self.head = Head(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def layers(self) -> list[nn.Module]:
        return [self.embed, *self.blocks, self.head]


#: models defined here, by name
OWN_MODELS = {"mnist_cnn": MnistCNN, "transformer": Transformer}


def torchvision_models() -> list[str]:
    return sorted(torchvision.models.list_models(module=torchvision.models))


def model_names() -> list[str]:
    return [*OWN_MODELS, *torchvision_models()]


def input_shape(model: str, image_size: int, dataset: str = "") -> tuple[int, int, int]:
    """The (channels, height, width) a model is fed: MNIST's for mnist_cnn, and for the
    transformer on MNIST; else 3 x image_size x image_size."""
    if model == "mnist_cnn" or (model == "transformer" and dataset == "mnist"):
        return (1, 28, 28)
    return (3, image_size, image_size)


def check_model(model: str) -> None:
    if model not in OWN_MODELS and model not in torchvision_models():
        raise ConfigError(
            f"unknown model {model!r}; use mnist_cnn, transformer or a torchvision "
            "classification model (e.g. resnet18, resnet50; `parabench list` shows all)"
        )


def meta_model(cfg: RunConfig) -> nn.Module:
    """The run's model built on the meta device (no memory, no weights), with its input
    shape and constructor arguments: what checks made before anything starts look at."""
    with torch.device("meta"):
        return build_model(
            cfg.model, 10, input_shape(cfg.model, cfg.image_size, cfg.dataset), **cfg.model_kwargs
        )


def check_model_args(cfg: RunConfig) -> None:
    """Build the model on the meta device with the run's constructor arguments, so a wrong
    --model-arg is one line before anything starts."""
    if not cfg.model_kwargs:
        return
    try:
        meta_model(cfg)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in cfg.model_kwargs.items())
        raise ConfigError(f"--model-arg {given}: {cfg.model} does not take it ({exc})") from None


def build_model(
    model: str, num_classes: int, shape: tuple[int, int, int] | None = None, **kwargs
) -> nn.Module:
    check_model(model)
    if model == "mnist_cnn":
        return MnistCNN(num_classes, **kwargs)
    if model == "transformer":
        return Transformer(num_classes, shape or (1, 28, 28), **kwargs)
    return torchvision.models.get_model(model, weights=None, num_classes=num_classes, **kwargs)


def without_dropout(model: nn.Module) -> int:
    """Turn off every dropout layer of any model (nn.Dropout*, and nn.MultiheadAttention's
    own); returns how many were on."""
    n = 0
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            m.p, n = 0.0, n + 1
        elif isinstance(m, nn.MultiheadAttention) and m.dropout > 0:
            m.dropout, n = 0.0, n + 1
    return n


def batch_norms(cfg: RunConfig) -> int:
    """How many BatchNorm layers the run's model has."""
    return sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in meta_model(cfg).modules())


def sequence(model: nn.Module) -> list[nn.Module] | None:
    """The model's forward as consecutive modules (what a pipeline cuts into stages), or
    None if it does not say (torchvision models: their forwards are not plain sequences)."""
    layers = getattr(model, "layers", None)
    return list(layers()) if callable(layers) else None
