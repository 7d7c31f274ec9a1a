"""FSDP2 with the GPU run options that resnet50 takes in gpu-check: channels-last and bf16/fp16
on a model with BatchNorm. Each runs one training step in this process, over a one-rank gloo
group (a FileStore, no network), so what fully_shard accepts and what dtype each layer
computes in is seen directly."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from strategies.base import Setting
from strategies.fsdp import FSDP2


def step(strategy: FSDP2, channels_last: bool) -> tuple[torch.Tensor, dict[str, set]]:
    """One training step of a small resnet18 through the strategy; the dtypes each kind of
    layer saw (its weight and its input) during the forward."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    strategy.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    seen: dict[str, set] = {"conv": set(), "norm": set(), "conv_in_nhwc": set()}

    def record(module, args):
        kind = "norm" if isinstance(module, nn.BatchNorm2d) else "conv"
        seen[kind].add((module.weight.dtype, args[0].dtype))
        if kind == "conv":
            seen["conv_in_nhwc"].add(args[0].is_contiguous(memory_format=torch.channels_last))

    for m in strategy.fsdp_module().modules():
        if isinstance(m, nn.Conv2d | nn.BatchNorm2d):
            m.register_forward_pre_hook(record)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    out = strategy.model(x)

    def grad_of_output(g: torch.Tensor) -> None:
        seen["out_grad_finite"] = {bool(torch.isfinite(g).all())}

    out.register_hook(grad_of_output)
    strategy.backward(nn.functional.cross_entropy(out, y))
    strategy.optimizer_step(strategy.optimizer)
    return out, seen


def test_fsdp_channels_last_shards_contiguous_params_and_runs_nhwc(one_rank):
    """fully_shard raises NotImplementedError on NHWC parameters: under --channels-last FSDP
    keeps them NCHW and the NHWC inputs carry the layout through every convolution."""
    fsdp = FSDP2(one_rank, {}, Setting(channels_last=True))
    out, seen = step(fsdp, channels_last=True)
    assert torch.isfinite(out).all()
    assert seen["conv_in_nhwc"] == {True}
    assert all(p.is_contiguous() for p in fsdp.fsdp_module().parameters())
    assert any("NCHW parameters" in n for n in fsdp.notes)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_fsdp_low_precision_keeps_batchnorm_in_fp32_and_the_loss_in_fp32(one_rank, precision):
    """Convolutions compute in the low dtype; BatchNorm keeps fp32 weights (its running
    statistics are fp32) and takes the low-precision activations; the root's output is fp32,
    so the loss and its gradient are fp32."""
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    fsdp = FSDP2(one_rank, {}, Setting(precision=precision))
    torch.manual_seed(0)  # the weights step() starts from
    before = [p.detach().clone() for p in torchvision.models.resnet18(num_classes=10).parameters()]
    out, seen = step(fsdp, channels_last=False)
    assert out.dtype == torch.float32
    assert seen["conv"] == {(low, low)}
    assert seen["norm"] == {(torch.float32, low)}
    after = [p.detach().full_tensor() for p in fsdp.fsdp_module().parameters()]
    # the loss's gradient is the GradScaler's scale (65536 at first): fp16 cannot hold it
    assert seen["out_grad_finite"] == {True}
    if precision == "bf16":  # (fp16's first step is skipped: the scale overflows this
        # model's fp16 gradients deeper in, as under autocast, until it has come down)
        assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert any("20 BatchNorm layers as one fp32 unit" in n for n in fsdp.notes)


def train(strategy: FSDP2, steps: int = 2) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`steps` training steps of a small resnet18 with an evaluation forward after each;
    the evaluation outputs and the weights at the end."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    strategy.attach(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    g = torch.Generator().manual_seed(1)
    outs, weights = [], []
    for _ in range(steps):
        x, y = torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)
        strategy.zero_grad(strategy.optimizer)
        strategy.backward(nn.functional.cross_entropy(strategy.model(x), y))
        strategy.optimizer_step(strategy.optimizer)
        # (sharded now; an evaluation forward leaves the units kept gathered unsharded)
        weights = [p.detach().full_tensor().clone() for p in strategy.fsdp_module().parameters()]
        strategy.model.eval()
        with torch.no_grad():
            outs.append(strategy.model(x).detach().clone())
        strategy.model.train()
    return outs, weights


def test_batchnorm_layers_as_one_unit_train_as_a_unit_each_does(one_rank):
    """bf16's fp32 BatchNorm layers grouped in one FSDP unit (the default) and one unit per
    layer (`norm_units=layer`) are the same arithmetic: the same evaluation outputs and the
    same weights after two steps, bit for bit; only the number of units differs."""
    grouped = FSDP2(one_rank, {}, Setting(precision="bf16"))
    outs_g, weights_g = train(grouped)
    each = FSDP2(one_rank, {"norm_units": "layer"}, Setting(precision="bf16"))
    outs_e, weights_e = train(each)
    assert any("20 BatchNorm layers as one fp32 unit" in n for n in grouped.notes)
    assert any("20 BatchNorm layers as fp32 units, one each" in n for n in each.notes)
    for a, b in zip(outs_g, outs_e, strict=True):
        assert torch.equal(a, b)
    assert len(weights_g) == len(weights_e)
    assert all(torch.equal(a, b) for a, b in zip(weights_g, weights_e, strict=True))
    # and the steps did train: the weights moved
    torch.manual_seed(0)
    start = list(torchvision.models.resnet18(num_classes=10).parameters())
    assert any(not torch.equal(a, b.detach()) for a, b in zip(weights_g, start, strict=True))


class TwoBranches(nn.Module):
    """Two BatchNorm branches side by side from the input: the second does not take the
    first's output, so one unit's single gradient reduction could come before its gradients."""

    def __init__(self, twice: bool = False, branch: bool = False) -> None:
        super().__init__()
        self.conv_a, self.conv_b = nn.Conv2d(3, 4, 3), nn.Conv2d(3, 4, 3)
        self.bn_a, self.bn_b = nn.BatchNorm2d(4), nn.BatchNorm2d(4)
        self.twice, self.branch = twice, branch

    def forward(self, x):
        a = self.bn_a(self.conv_a(x))
        if self.twice:
            return self.bn_a(a)
        if self.branch and x.sum() > 0:  # control flow on a value: fx cannot trace it
            return a
        return a + self.bn_b(self.conv_b(x))


def test_batchnorm_layers_are_grouped_only_where_the_traced_forward_shows_it_safe():
    from strategies.fsdp import ungroupable, units

    class MyNorm(nn.BatchNorm2d):  # a subclass (fx would trace into it): kept whole
        pass

    for model in (
        torchvision.models.resnet18(),
        torchvision.models.mobilenet_v2(),
        torchvision.models.resnet18(norm_layer=MyNorm),
    ):
        norms = units(model, low=True)[0]
        assert len(norms) >= 20
        assert ungroupable(model, norms) is None
    assert all(isinstance(m, MyNorm) for m in norms)  # (the last model's)
    side = TwoBranches()
    assert ungroupable(side, units(side, low=True)[0]) == (
        "bn_b does not take the first BatchNorm's (bn_a) output"
    )
    twice = TwoBranches(twice=True)
    assert ungroupable(twice, [twice.bn_a, twice.bn_b]) == (
        "not every BatchNorm runs exactly once a forward"
    )
    branchy = TwoBranches(branch=True)
    assert ungroupable(branchy, units(branchy, low=True)[0]).startswith(
        "its forward cannot be traced ("
    )


def test_where_grouping_is_not_safe_each_batchnorm_gets_its_own_unit(one_rank):
    fsdp = FSDP2(one_rank, {}, Setting(precision="bf16"))
    model = TwoBranches()
    fsdp.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    out = fsdp.model(torch.randn(2, 3, 8, 8))
    fsdp.backward(out.float().mean())
    fsdp.optimizer_step(fsdp.optimizer)
    assert any(
        "2 BatchNorm layers as fp32 units, one each (not one unit: bn_b does not take" in n
        for n in fsdp.notes
    )


def _graphs_of(run) -> int:
    """How many graphs dynamo compiled while `run()` ran, from a fresh start."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        run()
        return counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()


def _two_blocks() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten()), nn.Linear(64, 3)
    )


def test_torch_compile_of_a_sharded_model_compiles_nothing(one_rank):
    """Why FSDP2 compiles its blocks one by one (FSDP2.compiled): torch.compile of the model
    after fully_shard traces no graph (dynamo skips FSDP's hooks and each sharded module's
    forward with them), so a compiled cell ran its steps eager. Where this fails, torch
    compiles sharded modules whole."""
    fsdp = FSDP2(one_rank, {}, Setting())
    model = _two_blocks()
    fsdp.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(2, 1, 6, 6)
    assert _graphs_of(lambda: torch.compile(fsdp.model)(x).sum().backward()) == 0


def test_fsdp_under_compile_compiles_each_block_and_trains_as_eager(one_rank):
    """--compile on FSDP2 compiles each block's forward (the whole model compiled ran
    eager, above): a graph a block, the same outputs and gradients as the eager model, and
    parameter names unchanged (no compile wrapper in them: verify and checkpoints read
    them)."""
    eager = _two_blocks()
    x = torch.randn(2, 1, 6, 6)
    eager(x).square().sum().backward()
    fsdp = FSDP2(one_rank, {}, Setting(compile=True))
    model = _two_blocks()
    fsdp.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    out: list[torch.Tensor] = []

    def step() -> None:
        out.append(fsdp.model(x))
        out[-1].square().sum().backward()

    assert _graphs_of(step) == 2
    assert torch.allclose(out[0], eager(x), atol=1e-6)
    got = {n: p.grad.full_tensor() for n, p in fsdp.fsdp_module().named_parameters()}
    want = {n: p.grad for n, p in eager.named_parameters()}
    assert got.keys() == want.keys()
    for name, grad in want.items():
        assert torch.allclose(got[name], grad, atol=1e-6), name
    assert any("torch.compile of each of the 2 blocks' forward" in n for n in fsdp.notes)
    cuda_graphs = Setting(compile=True, compile_mode="reduce-overhead")
    assert "CUDA-graph modes are not wired for FSDP" in str(FSDP2.unsupported(cuda_graphs, "cuda"))


def test_fsdp_under_compile_compiles_a_model_with_no_block_whole(one_rank):
    """A model whose parameters are all the root's own (no block to shard apart) had no
    block to compile, so its compiled cell ran eager: its root's forward is compiled."""
    torch.manual_seed(0)
    eager = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    fsdp = FSDP2(one_rank, {}, Setting(compile=True))
    model = nn.Linear(4, 3)
    model.load_state_dict(eager.state_dict())
    fsdp.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    out: list[torch.Tensor] = []
    assert _graphs_of(lambda: out.append(fsdp.model(x))) == 1
    assert torch.allclose(out[0], eager(x), atol=1e-6)
    assert "torch.compile of the root's forward (no block to shard apart)" in fsdp.notes


def test_fsdp_blocks_of_one_class_share_their_compiled_code(one_rank):
    """Blocks of one class compiled one by one share one forward's code, whose cache
    dynamo limits (8 entries): a graph per block would pass that limit at 9 blocks, and the
    blocks past it would run eager, said nowhere. They share their graphs instead (modules
    inlined as inputs): 12 blocks, trained and evaluated at two batch sizes, fewer graphs
    than blocks."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return x + torch.relu(self.fc(x))

    torch.manual_seed(0)
    model = nn.Sequential(*(Block() for _ in range(12)), nn.Linear(8, 3))
    fsdp = FSDP2(one_rank, {}, Setting(compile=True))
    fsdp.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))

    def train_and_evaluate() -> None:
        for _ in range(2):
            fsdp.model(torch.randn(4, 8)).sum().backward()
        fsdp.model.eval()
        with torch.no_grad():
            fsdp.model(torch.randn(4, 8))
            fsdp.model(torch.randn(3, 8))

    assert 0 < _graphs_of(train_and_evaluate) < 12


def test_an_fsdp_rank_trains_holding_its_shards_not_the_model_as_built(
    one_rank, tmp_path, monkeypatch
):
    """fully_shard makes each rank's parameters anew, as shards; the worker held the model's
    parameters as built (the list it counted them from, the optimizer it made first) through
    its epochs: each FSDP rank kept the whole model besides its shards, in its peak memory
    (a GPU's allocator peak, a CPU's resident set) and out of sight of its model state."""
    import gc
    import weakref

    import strategies
    from bench.config import RunConfig
    from bench.harness import worker

    build, built, alive = worker.models.build, [], []

    def build_seen(*args, **kwargs):
        model = build(*args, **kwargs)
        built.extend(weakref.ref(p) for p in model.parameters())
        return model

    def epoch_starts(devices):  # where the worker starts each epoch's peak anew
        gc.collect()
        alive.append(sum(r() is not None for r in built))

    monkeypatch.setattr(worker.models, "build", build_seen)
    monkeypatch.setattr(worker, "reset_peaks", epoch_starts)
    cfg = RunConfig(
        dataset="synthetic",
        model="mnist_cnn",
        global_batch=4,
        max_steps=2,
        warmup_steps=1,
        eval_samples=0,
        device="cpu",
        out_dir=str(tmp_path),
        scaling_model=False,
        probe_pairs=0,
        profile_steps=0,
    )
    fsdp = strategies.get("fsdp").create(one_rank, {}, Setting())
    try:
        worker._train(cfg, {"threads": 1, "workers_per_device": 0}, one_rank, tmp_path, fsdp, {})
    finally:
        fsdp.release()
    assert built and alive == [0], f"{alive} of the {len(built)} parameters as built held"
