"""Models: the classic MNIST CNN, a small vision transformer built for model parallelism,
a decoder-only language model (`lm`) in several sizes, any torchvision classification
model by name, and a user's own model from a factory (bench.workload.plugins).

What a model is fed is an `InputSpec`: per-sample shape and dtype, and for token models
the vocabulary (targets are then the next tokens, and rows count tokens/s)."""

from __future__ import annotations

import contextlib
import inspect
import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench import program
from bench.config import ConfigError, RunConfig, one_line
from bench.workload import plugins


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

    #: parameters that cannot change the output (bench.analysis.verify leaves them out of the
    #: weights it compares): softmax cancels the key bias, which shifts each query's scores
    #: all alike, so its gradient is zero but for rounding, and Adam scales that rounding up
    #: to steps of its own (a correct DDP under Adam: 6.9e-4 of an update from single)
    inert = ("k.bias",)

    def __init__(self, dim: int, heads: int, causal: bool = False) -> None:
        super().__init__()
        self.head_dim, self.causal = dim // heads, causal
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def heads(z: torch.Tensor) -> torch.Tensor:  # (b, t, h*d) -> (b, h, t, d)
            return z.view(b, t, -1, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(
        self, dim: int, heads: int, mlp_ratio: int, dropout: float, causal: bool = False
    ) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads, causal)
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


#: the most blocks a BlockStack takes: more than any model trained has (GPT-3: 96). Each
#: block is built before a run can start, on the meta device for the checks (about 2 ms and
#: 36 KiB of Python objects a block): depth=100000000 climbed past 8 GiB in minutes with
#: nothing said, where a typed zero too many is one line
MAX_DEPTH = 1000


class BlockStack(nn.Module):
    """An embedding, `depth` pre-norm transformer blocks and a head, run in that order: the
    vision transformer and the language model. Its `blocks` are FSDP's units, its `layers()`
    the pipeline's, and its q/k/v/proj/fc1/fc2 the tensor-parallel plan's."""

    def __init__(
        self,
        embed: nn.Module,
        head: Callable[[], nn.Module],
        dims: tuple[int, int, int, int],
        dropout: float,
        causal: bool,
    ) -> None:
        super().__init__()
        dim, depth, heads, mlp_ratio = dims
        self.heads = heads
        self.embed = embed
        self.blocks = nn.ModuleList(
            Block(dim, heads, mlp_ratio, dropout, causal) for _ in range(depth)
        )
        self.head = head()  # built last: parameters drawn in forward order

    @staticmethod
    def check(name: str, dims: tuple[int, int, int, int]) -> None:
        dim, depth, heads, mlp_ratio = dims
        if min(dims) < 1:
            raise ConfigError(
                f"{name}: dim, depth, heads and mlp_ratio must be at least 1, got dim={dim} "
                f"depth={depth} heads={heads} mlp_ratio={mlp_ratio}"
            )
        if dim % heads:
            raise ConfigError(f"{name}: dim {dim} is not divisible by {heads} heads")
        if depth > MAX_DEPTH:
            raise ConfigError(
                f"{name}: depth {depth} is more than {MAX_DEPTH} blocks, deeper than any model "
                "trained (each is built before the run starts): lower --model-arg depth"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def layers(self) -> list[nn.Module]:
        return [self.embed, *self.blocks, self.head]


class Transformer(BlockStack):
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
        patch = patch or default_patch(shape[1])
        if shape[1] % patch or shape[2] % patch:
            raise ConfigError(f"transformer: patch {patch} does not divide {shape[1]}x{shape[2]}")
        dims = (dim, depth, heads, mlp_ratio)
        self.check("transformer", dims)
        embed = PatchEmbed(shape, patch, dim)
        super().__init__(embed, lambda: Head(dim, num_classes), dims, dropout, causal=False)


class TokenEmbed(nn.Module):
    """Token and learned position embeddings."""

    def __init__(self, vocab_size: int, seq_len: int, dim: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.randn(1, seq_len, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tok(x) + self.pos[:, : x.shape[1]]


class TokenHead(nn.Module):
    """Final norm and a logit per vocabulary entry for every position."""

    def __init__(self, dim: int, vocab_size: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(dim), nn.Linear(dim, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x))


#: language-model sizes: (dim, depth, heads); parameters at a byte vocabulary (256) and
#: 128 positions, counted by `parabench list`
LM_SIZES = {
    "tiny": (128, 2, 4),  # 0.5 M: tests
    "small": (384, 6, 6),  # 10.9 M
    "base": (768, 12, 12),  # 85 M (GPT-2 small's blocks)
    "medium": (1024, 24, 16),  # 303 M (GPT-2 medium's blocks)
}


class LanguageModel(BlockStack):
    """A decoder-only transformer trained on next-token prediction (GPT-2's layout: pre-norm
    blocks with causal self-attention, learned positions, untied head). Its blocks are the
    vision transformer's (same Attention and MLP, so FSDP, the pipeline and the
    tensor-parallel plan treat both alike). Output: (batch, seq, vocab) logits."""

    input_dtype = torch.long

    def __init__(
        self,
        vocab_size: int = 256,
        seq_len: int = 128,
        size: str = "small",
        dim: int = 0,
        depth: int = 0,
        heads: int = 0,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
    ) -> None:
        if size not in LM_SIZES:
            raise ConfigError(f"lm: unknown size {size!r}; choose {', '.join(LM_SIZES)}")
        if vocab_size < 2:
            raise ConfigError(f"lm: vocab_size must be at least 2 tokens, got {vocab_size}")
        d0, l0, h0 = LM_SIZES[size]
        dims = (dim or d0, depth or l0, heads or h0, mlp_ratio)
        self.check("lm", dims)
        embed = TokenEmbed(vocab_size, seq_len, dims[0])
        super().__init__(embed, lambda: TokenHead(dims[0], vocab_size), dims, dropout, causal=True)
        self.vocab_size, self.input_shape = vocab_size, (seq_len,)


#: models defined here, by name
OWN_MODELS = {"mnist_cnn": MnistCNN, "transformer": Transformer, "lm": LanguageModel}
#: the byte-level vocabulary of the language model's data
BYTE_VOCAB = 256


@dataclass(frozen=True)
class InputSpec:
    """What a model is fed, per sample: shape and dtype; `vocab` > 0 for token ids in
    [0, vocab), whose targets are the next tokens (same shape as the input)."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    vocab: int = 0

    @property
    def tokens(self) -> int:
        """Tokens per sample (0: not a token model): what tokens/s counts."""
        return math.prod(self.shape) if self.vocab else 0

    def describe(self) -> str:
        kind = f"token ids < {self.vocab}" if self.vocab else str(self.dtype).replace("torch.", "")
        return f"{tuple(self.shape)} {kind}"


def torchvision_models() -> list[str]:
    # imported here, not at the top: torchvision pulls in torch._dynamo (about 2 s), which
    # every rank of every cell would pay at start-up for models it does not use
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def model_names() -> list[str]:
    return [*OWN_MODELS, *sorted(plugins.registered(plugins.MODEL_GROUP)), *torchvision_models()]


def is_plugin(model: str) -> bool:
    return model not in OWN_MODELS and plugins.is_plugin(model, plugins.MODEL_GROUP)


def input_shape(model: str, image_size: int, dataset: str = "") -> tuple[int, int, int]:
    """The (channels, height, width) a built-in image model is fed: MNIST's for mnist_cnn,
    and for the transformer on MNIST; else 3 x image_size x image_size."""
    if model == "mnist_cnn" or (model == "transformer" and dataset == "mnist"):
        return (1, 28, 28)
    return (3, image_size, image_size)


def check_model(model: str) -> None:
    if model in OWN_MODELS or is_plugin(model):
        return
    if model not in torchvision_models():
        raise ConfigError(
            f"unknown model {model!r}; use mnist_cnn, transformer, lm, a torchvision "
            "classification model (e.g. resnet18), or your own as package.module:factory or "
            f"path/to/file.py:factory (`{program()} list` shows all)"
        )


def _vocab(cfg: RunConfig) -> int:
    return int(cfg.model_kwargs.get("vocab_size", BYTE_VOCAB))


def default_classes(cfg: RunConfig) -> int | None:
    """Classes (or vocabulary) of the run where no data set states them (synthetic data):
    the language model's vocabulary, 10 for mnist_cnn, else ImageNet's 1000; None for a
    user's model, which is built with its factory's own default and says with its
    `num_classes` or `vocab_size` attribute, or its output (bench.workload.data)."""
    if is_plugin(cfg.model):
        return None
    if cfg.model == "lm":
        return _vocab(cfg)
    return 10 if cfg.model == "mnist_cnn" or cfg.dataset == "mnist" else 1000


def build_model(
    model: str,
    num_classes: int | None,
    shape: tuple[int, ...] | None = None,
    /,
    **kwargs: Any,
) -> nn.Module:
    """Model `model` with `num_classes` outputs (a token model: vocabulary) for inputs of
    per-sample `shape`; `kwargs` go to its constructor (--model-arg). A user's factory is
    offered `num_classes` where it takes it (None: its own default). The first three are
    positional only, so a --model-arg named `model`, `shape` or `num_classes` reaches the
    factory instead of colliding with them."""
    check_model(model)
    if is_plugin(model):
        offered = {} if num_classes is None else {"num_classes": num_classes}
        # no data says (synthetic): a factory that requires num_classes gets ImageNet's
        fallback = {"num_classes": 1000}
        built = plugins.call(model, plugins.MODEL_GROUP, kwargs, offered, fallback)
        if not isinstance(built, nn.Module):
            raise ConfigError(
                f"{model} returned {type(built).__name__}, not a torch.nn.Module; a model "
                "factory returns the model"
            )
        return built
    num_classes = num_classes or 1000
    if model == "mnist_cnn":
        return MnistCNN(num_classes, **kwargs)
    if model == "transformer":
        return Transformer(num_classes, shape or (1, 28, 28), **kwargs)  # type: ignore[arg-type]
    if model == "lm":
        if "seq_len" in kwargs:
            raise ConfigError("lm: its context is --seq-len (the data's), not --model-arg seq_len")
        # 0 is the constructor's "the size's": given, it would train the size's silently
        zero = [k for k in ("dim", "depth", "heads") if kwargs.get(k) == 0]
        if zero:
            raise ConfigError(
                f"lm: {', '.join(f'{k}=0' for k in zero)}: dim, depth and heads must be at "
                f"least 1 (left out, they are --model-arg size's)"
            )
        kwargs = {"vocab_size": num_classes, **kwargs}
        return LanguageModel(seq_len=shape[0] if shape else 128, **kwargs)
    import torchvision

    if model in AUX_HEADS:
        # in training these return their auxiliary heads' logits beside the output (a
        # named tuple): parabench trains on the output alone, as every other model
        if kwargs.get("aux_logits"):
            raise ConfigError(
                f"--model-arg aux_logits: parabench trains {model} on its main output alone"
            )
        kwargs = {"aux_logits": False, "init_weights": True, **kwargs}
    return torchvision.models.get_model(model, weights=None, num_classes=num_classes, **kwargs)


#: torchvision models with auxiliary classifier heads, built without them
AUX_HEADS = ("googlenet", "inception_v3")


def build(cfg: RunConfig, num_classes: int | None, spec: InputSpec | None = None) -> nn.Module:
    """The run's model for data with `num_classes` classes (or vocabulary)."""
    shape = spec.shape if spec else builtin_spec(cfg).shape
    return build_model(cfg.model, num_classes, shape, **cfg.model_kwargs)


def builtin_spec(cfg: RunConfig) -> InputSpec:
    """The input of a built-in model (a user's model states its own: `spec`)."""
    if cfg.model == "lm":
        return InputSpec((cfg.seq_len,), torch.long, _vocab(cfg))
    return InputSpec(input_shape(cfg.model, cfg.image_size, cfg.dataset))


def spec(cfg: RunConfig, model: nn.Module | None = None) -> InputSpec:
    """What the run's model is fed when the data does not decide (synthetic data). A user's
    model may state it with attributes: `input_shape` (one sample), `input_dtype`
    (default float32) and, for a token model, `vocab_size`; without them it is fed images
    of 3 x image_size x image_size, as torchvision's models are."""
    if not is_plugin(cfg.model):
        return builtin_spec(cfg)
    model = model if model is not None else meta_model(cfg)
    shape = getattr(model, "input_shape", None) or (3, cfg.image_size, cfg.image_size)
    dtype = getattr(model, "input_dtype", torch.float32)
    vocab = int(getattr(model, "vocab_size", 0) or 0)
    if not isinstance(dtype, torch.dtype):
        raise ConfigError(f"{cfg.model}: input_dtype must be a torch.dtype, not {dtype!r}")
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{cfg.model}: input_shape must be a tuple of ints (one sample), not {shape!r}"
        ) from None
    return InputSpec(shape, dtype, vocab)


def stated_classes(model: nn.Module) -> int | None:
    """The classes (or vocabulary) a user's model says it has, if it says."""
    n = getattr(model, "vocab_size", None) or getattr(model, "num_classes", None)
    return int(n) if n else None


def meta_model(cfg: RunConfig, num_classes: int | None = None) -> nn.Module:
    """The run's model built on the meta device (no memory, no weights), with its input
    shape and constructor arguments: what checks made before anything starts look at."""
    return build_on("meta", cfg, num_classes if num_classes is not None else default_classes(cfg))


def build_on(
    device: str, cfg: RunConfig, num_classes: int | None, spec: InputSpec | None = None
) -> nn.Module:
    """`build` with `device` as the default device. On the meta device (no memory, no
    weights) a constructor that computes with tensors and reads the result back (RegNet
    turns its block widths into a list) fails; it is built again with its arithmetic on
    the CPU and each parameter and buffer moved to the meta device as it is registered,
    before its initialisation runs, so it still takes no memory."""
    try:
        with torch.device(device):
            return build(cfg, num_classes, spec)
    except ConfigError:
        raise
    except Exception:
        if device != "meta":
            raise
    with _registered_on_meta():
        return build(cfg, num_classes, spec)


@contextlib.contextmanager
def _registered_on_meta():
    """Modules built inside put each parameter and buffer on the meta device as they
    register it (a layer's initialisation then runs on the meta copy, costing nothing).
    Tensors a constructor keeps without registering them stay where they were made (the
    CPU). One parameter registered twice (tied) gets one meta copy."""
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer
    copies: dict[int, tuple[weakref.ref, nn.Parameter]] = {}

    def parameter(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if type(param) is nn.Parameter and param.device.type != "meta":
            source, copy = copies.get(id(param), (None, None))
            if source is None or source() is not param:  # (an id outlives its object)
                copy = nn.Parameter(param.detach().to("meta"), param.requires_grad)
                copies[id(param)] = (weakref.ref(param), copy)
            param = copy
        register_parameter(self, name, param)

    def buffer(self: nn.Module, name: str, tensor: Any, persistent: bool = True) -> None:
        if isinstance(tensor, torch.Tensor):
            tensor = tensor.to("meta")
        register_buffer(self, name, tensor, persistent)

    nn.Module.register_parameter, nn.Module.register_buffer = parameter, buffer  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
        nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]


#: constructor arguments of the built-in models that the run sets (from the data)
SET_BY_RUN = {"mnist_cnn": ("num_classes",), "transformer": ("num_classes", "shape")}


def _check_own_args(model: str, kwargs: dict[str, Any]) -> None:
    """A built-in model's --model-arg against its constructor: a name it does not take, or
    a value of another type than its default's, is a ConfigError naming what it takes."""
    params = inspect.signature(OWN_MODELS[model].__init__).parameters
    takes = [n for n in params if n != "self" and n not in SET_BY_RUN.get(model, ())]
    for key, value in kwargs.items():
        if key in SET_BY_RUN.get(model, ()):
            raise ConfigError(f"--model-arg {key}: {model}'s {key} is the data's, not an argument")
        if key not in params or key == "self":
            if model == "lm" and key == "seq_len":
                continue  # build_model says where the context comes from
            raise ConfigError(f"--model-arg {key}: {model} takes {', '.join(takes)}")
        default = params[key].default
        kind = type(default)
        fits = (
            isinstance(value, (int, float)) and not isinstance(value, bool)
            if kind is float
            else isinstance(value, kind) and isinstance(value, bool) == isinstance(default, bool)
        )
        if kind in (int, float, str, bool) and not fits:
            what = {int: "an int", float: "a number", str: "a string", bool: "True or False"}
            raise ConfigError(
                f"--model-arg {key}={value!r}: {model}'s {key} takes {what[kind]} "
                f"(default {default!r})"
            )


def check_model_args(cfg: RunConfig) -> None:
    """Build the model on the meta device with the run's constructor arguments, so a wrong
    --model-arg (or a user's factory that fails) is one line before anything starts."""
    if not cfg.model_kwargs and not is_plugin(cfg.model):
        return
    if cfg.model in OWN_MODELS:
        _check_own_args(cfg.model, dict(cfg.model_kwargs))
    try:
        meta_model(cfg)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in cfg.model_kwargs.items())
        # a name it has no parameter for is Python's "unexpected keyword argument"; anything
        # else a value it refuses (lm's dropout=2, a ValueError; a str where it computes, a
        # TypeError)
        unknown = isinstance(exc, TypeError) and "unexpected keyword argument" in str(exc)
        said = "does not take it" if unknown else "refuses a value given"
        raise ConfigError(f"--model-arg {given}: {cfg.model} {said} ({exc})") from None


def check_forward(cfg: RunConfig, spec: InputSpec, num_classes: int) -> None:
    """Run a user's model (or any model on a user's data) forward on a batch of two samples
    of `spec`, and check it gives `num_classes` scores per sample (per token for a token
    model): on the meta device first (no memory, no weights), on the CPU where an operation
    has no meta kernel. ConfigError naming the model and what went wrong."""
    try:
        out = _forward(cfg, spec, num_classes)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"{cfg.model}: forward on a batch of {spec.describe()} fails: {one_line(exc)}"
        ) from None
    if not isinstance(out, torch.Tensor):
        raise ConfigError(f"{cfg.model}: forward returned {type(out).__name__}, not a tensor")
    want = (2, *spec.shape, num_classes) if spec.vocab else (2, num_classes)
    if tuple(out.shape) != want:
        what = "per token" if spec.vocab else "per sample"
        raise ConfigError(
            f"{cfg.model}: output of shape {tuple(out.shape)} on a batch of 2 x {spec.describe()}; "
            f"the data has {'a vocabulary of ' if spec.vocab else ''}{num_classes}"
            f"{'' if spec.vocab else ' classes'}, so "
            f"{num_classes} scores {what} were expected: {want}"
        )


def output_classes(cfg: RunConfig, spec: InputSpec) -> int | None:
    """Scores per sample of a user's model built with its factory's defaults, read off a
    forward (meta device, else CPU); None if the forward fails (check_forward says why)."""
    try:
        return int(_forward(cfg, spec, None).shape[-1])
    except ConfigError:
        raise
    except Exception:
        return None


def _forward(cfg: RunConfig, spec: InputSpec, num_classes: int | None) -> Any:
    """The model's output on a batch of two samples of `spec`: on the meta device, or on
    the CPU where an operation has no meta kernel (the CPU's error if both fail)."""
    try:
        return _forward_on(cfg, spec, num_classes, "meta")
    except ConfigError:
        raise
    except Exception:
        return _forward_on(cfg, spec, num_classes, "cpu")


def _forward_on(cfg: RunConfig, spec: InputSpec, num_classes: int | None, device: str) -> Any:
    model = build_on(device, cfg, num_classes, spec)
    with torch.device(device):
        if spec.vocab:
            x = torch.randint(0, spec.vocab, (2, *spec.shape))
        else:
            x = torch.randn((2, *spec.shape)).to(spec.dtype)
    with torch.no_grad():
        return model.eval()(x)


def loss_of(model: nn.Module):
    """The loss a model trains with: its own `loss(output, target)` if it has one, else
    cross-entropy over the last dimension (classes, or the vocabulary at every position)."""
    own = getattr(model, "loss", None)
    return own if callable(own) else cross_entropy


def cross_entropy(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every score vector: (batch, classes) against (batch,) labels,
    or (batch, seq, vocab) against (batch, seq) next tokens."""
    if out.dim() > 2:  # (a classifier's scores go as they are: a reshape is a step's cost)
        out = out.reshape(-1, out.shape[-1])
    if target.dim() > 1:
        target = target.reshape(-1)
    return F.cross_entropy(out if out.dtype == torch.float32 else out.float(), target)


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


def norm_layers(model: nn.Module) -> list[nn.Module]:
    """The model's BatchNorm layers (SyncBatchNorm included), in module order."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def inert_parameters(model: nn.Module) -> set[str]:
    """The names of the parameters its modules declare cannot change its output (`inert`:
    Attention's key bias)."""
    return {
        f"{name}.{p}" if name else p
        for name, module in model.named_modules()
        for p in getattr(module, "inert", ())
    }


def batch_norms(cfg: RunConfig) -> int:
    """How many BatchNorm layers the run's model has."""
    return len(norm_layers(meta_model(cfg)))


def sequence(model: nn.Module) -> list[nn.Module] | None:
    """The model's forward as consecutive modules (what a pipeline cuts into stages), or
    None if it does not say (torchvision models: their forwards are not plain sequences).
    It says with a `layers()` method; a submodule named `layers` (an nn.Sequential or
    nn.ModuleList, as many models name their blocks) is callable too, but calling it would
    run that submodule's forward: it says nothing. ConfigError where layers() raises or
    returns what is no sequence (the model's own code: named, not the pipeline that asked)."""
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.Module) or not callable(layers):
        return None
    try:
        listed = layers()
        items = list(listed) if isinstance(listed, Iterable) else None
    except Exception as exc:
        raise ConfigError(f"its layers() raised {one_line(exc)}") from exc
    if items is None:
        raise ConfigError(
            f"its layers() returned a {type(listed).__name__}, not a list of its modules in "
            "forward order"
        )
    return items
