"""Run configuration: one kw_only dataclass, validated on construction."""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: built-in data sets; `--dataset` also takes a user's (bench.workload.plugins)
DATASETS = ("mnist", "imagenet-subset", "synthetic", "python-source")
PRECISIONS = ("fp32", "bf16", "fp16")  # the precision axis (strategies/precision.py)
#: torch.compile's modes (--compile-mode), and those that capture CUDA graphs
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
OPTIMIZERS = ("sgd", "adam", "adamw")
#: --lr where it is not given: SGD's (with momentum 0.9) suits the built-in models; Adam's
#: 0.01 diverges on MNIST at world size 2 (loss 12.9 at its second step), torch's 1e-3 trains
DEFAULT_LR = {"sgd": 0.01, "adam": 1e-3, "adamw": 1e-3}
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_MODEL = {
    "mnist": "mnist_cnn",
    "imagenet-subset": "resnet18",
    "synthetic": "resnet18",
    "python-source": "lm",
}


#: synthetic images on a CPU when --image-size is not given
CPU_SYNTHETIC_IMAGE_SIZE = 64


class ConfigError(ValueError):
    """Bad input: the CLI prints the message on one line and exits with code 2."""


#: options the caller of the harness does not have (a script in benchmarks/ that plans
#: with it): advice naming one is left out of the harness's messages (either)
_WITHHELD: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "withheld", default=frozenset()
)


@contextlib.contextmanager
def without_options(*options: str) -> Iterator[None]:
    """Within it, the harness's messages advise none of `options` (`--oversubscribe`): a
    script that has not those options says the harness's reasons as its own, and its user
    who followed such advice would be refused by the script's argparse."""
    token = _WITHHELD.set(_WITHHELD.get() | frozenset(options))
    try:
        yield
    finally:
        _WITHHELD.reset(token)


def either(*ways: str, form: str = "{}") -> str:
    """The ways out of a refusal as one clause ("a, b, or c") put in `form`, less each way
    that names an option the caller does not have (without_options); '' where none is left.
    The rule lives here, with the wording kept by whoever says it: a script that cut the
    advice out of the text lost it at the first rewording (and, cutting the last of three
    ways, the clause's "or")."""
    withheld = _WITHHELD.get()
    left = [w for w in ways if not withheld & set(re.findall(r"--[a-z][\w-]*", w))]
    if not left:
        return ""
    said = left[0] if len(left) == 1 else ", ".join(left[:-1]) + ", or " + left[-1]
    return form.format(said)


class RunStopped(RuntimeError):
    """A run that cannot go on (its disk is full): the CLI prints the message, which says
    what is kept and how to continue, on one line and exits with code 1."""


def comma_items(text: str) -> list[str]:
    """A comma-separated list's items. An empty item (`single,ddp,`, `1,,2`) is refused: it
    was dropped without a word, where it may stand for a value meant (`1,2,$N` with N unset)."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):  # an empty shell variable must not widen the run to the default
        raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty item (a stray comma); give the values alone, e.g. "
            f"{','.join(x for x in items if x)}"
        )
    return items


def unknown_device(device: str) -> str:
    return f"unknown device {device!r}; choose auto, cpu or cuda"


#: --timeout's most: a week per cell (torch's process groups take it as a timedelta and
#: a C int of milliseconds)
MAX_TIMEOUT_S = 7 * 24 * 3600
#: --repeats' most: the plan holds a cell per repeat of every strategy, world size and
#: option before the estimate (100 million repeats filled the machine's memory there, with
#: nothing said), and a cell's start-up alone makes 1,000 repeats of one cell over an hour
MAX_REPEATS = 1000


#: the run options verify sets itself (bench.analysis.verify.parity_config; and --max-steps
#: to --steps): given to verify with another value, they would be ignored
SET_BY_VERIFY: dict[str, Any] = {
    "epochs": 1,
    "warmup_steps": 0,
    "repeats": 1,
    "target_precision": None,  # every strategy trains the same steps
    "profile": False,
    "profile_steps": 0,
    "probe_pairs": 0,  # parity needs no scaling model, nor the probes' time
    "scaling_model": False,
    "eval_samples": 0,
}


#: the plain types of RunConfig's fields, as a saved config's values must be (an int for a
#: float too, as JSON writes 900.0 as 900 where it was given so); the rest are not checked
_TYPE_WORDS = {
    "int": "a whole number",
    "int | None": "a whole number or null",
    "float": "a number",
    "float | None": "a number or null",
    "str": "a string",
    "bool": "true or false",
    "tuple[bool, ...]": "a list of true or false",
}


def _of_type(value: Any, kind: str) -> bool:
    """Whether `value` read from JSON is of `kind`, one of RunConfig's field types."""
    if kind not in _TYPE_WORDS or (value is None and kind.endswith("| None")):
        return True
    if kind.startswith(("int", "float")) and isinstance(value, bool):  # True is 1 to Python
        return False
    if kind == "tuple[bool, ...]":  # a matrix axis (compile, sync_bn): [1] ran as true
        return all(isinstance(v, bool) for v in value)
    if kind.startswith("int"):
        return isinstance(value, int)
    if kind.startswith("float"):
        return isinstance(value, int | float)
    return isinstance(value, str if kind == "str" else bool)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    strategies: tuple[str, ...] = ()  # empty: every registered strategy
    exclude: tuple[str, ...] = ()  # left out of "every registered strategy"
    world_sizes: tuple[int, ...] = ()  # empty: 1, 2, 4, ... up to the devices present
    dataset: str = "mnist"
    model: str = ""  # empty: the dataset's default
    global_batch: int = 64
    epochs: int = 1
    max_steps: int | None = None  # per epoch
    warmup_steps: int = 5
    repeats: int = 1
    device: str = "auto"
    workers: int | None = None  # loader workers per device; None: 0 on CPU, 4 on CUDA
    seed: int = 0
    #: None: the optimizer's (DEFAULT_LR), resolved once: a replace(optimizer=...) keeps it
    lr: float | None = None
    data_root: str = ""
    download: bool = False
    limit: int | None = None  # cap on training samples
    max_classes: int | None = None  # imagenet-subset: first N classes
    eval_samples: int = 1000
    #: 0: ImageNet's 224, but 64 for synthetic data on a CPU (224 px takes many minutes
    #: per cell there); the rows' `data` says which
    image_size: int = 0
    #: tokens per sample of a token model (lm) and its data (python-source, synthetic)
    seq_len: int = 128
    timeout_s: float = 900.0  # per (strategy, world size, repeat)
    out_dir: str = "results"
    run_id: str = ""
    #: strategy options, key=value; a value "a,b,c" makes the option a matrix axis
    options: dict[str, str] = field(default_factory=dict)
    # Matrix axes applied around every strategy that supports them (strategies.base.Setting).
    precisions: tuple[str, ...] = ()  # empty: each strategy's own default (fp32 for most)
    compile: tuple[bool, ...] = (False,)
    #: torch.compile's mode for the cells compiled (COMPILE_MODES above)
    compile_mode: str = "default"
    accumulate: tuple[int, ...] = (1,)  # micro-batches per optimizer step
    sync_bn: tuple[bool, ...] = (False,)
    channels_last: tuple[bool, ...] = (False,)
    optimizer: str = "sgd"
    #: more CPU ranks than cores (one thread each): for correctness only, rows not ranked
    oversubscribe: bool = False
    #: how batches reach the device: "device" (in-memory data moved there once, batches
    #: indexed there), "loader" (a DataLoader, pinned memory on CUDA), "auto" (device
    #: where the data set is in memory: mnist, synthetic, python-source, or tensors a data
    #: factory returns; else loader)
    data_feed: str = "auto"
    #: how steps are timed on CUDA: "sync" (synchronise around each step, host clock) or
    #: "events" (CUDA events, no synchronisation inside the loop); bench.harness.probes.StepTimer
    step_timing: str = "sync"
    #: a loss above this many times the first step's (or non-finite) marks the row diverged
    diverge_factor: float = 10.0
    # write final parameters (parity checks): set by verify alone, so a strategy's
    # unsuitable() reads it as "this is a verify run" (no timing, no warm-up to check)
    save_params: bool = False
    #: every dropout layer of the model off (parity: its masks depend on the rank layout)
    no_dropout: bool = False
    #: the ImageNet subset's training images center-cropped as the held-out ones, with no
    #: random crop or flip (parity checks the plain images; the crops are drawn per sample,
    #: alike in every layout: data.SeededSamples)
    no_augment: bool = False
    #: fp32 products in fp32 on CUDA: TF32 off for cuDNN's convolutions (on by default) and
    #: matrix products (parity: TF32 keeps 10 bits of mantissa, and BatchNorm over a few
    #: samples carries that rounding a thousandfold: one-ulp twins of resnet18 at 32 px were
    #: 6.3e-4 apart in their first loss on an H100 with it on)
    no_tf32: bool = False
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    #: key=value passed to a user's data-set factory (--dataset-arg)
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    #: after the timed steps of a multi-process cell: this many steps with gradient sync and
    #: as many without (the communication ablation; 0: none), then `profile_steps` under
    #: torch.profiler (bench.harness.breakdown)
    probe_pairs: int = 4
    #: choose each epoch's timed steps by precision: stop once the mean step time is known
    #: to within this many % (95 % interval over blocks of steps, bench.harness.stats), at the
    #: earliest after 5 blocks, at the latest at --max-steps or the epoch's end; None: all
    target_precision: float | None = None
    profile_steps: int = 2
    #: keep each cell's profiler trace (cells/<cell>/trace.json), single-process cells too
    profile: bool = False
    #: measure what `parabench predict` and MFU need: the collectives' latency and bandwidth
    #: at the run's world sizes (collectives.json), each one-process cell's compute at smaller
    #: batches, the model's FLOPs and the device's peak (model.json)
    scaling_model: bool = True
    #: several nodes (bench.harness.nodes): world size nodes x procs_per_node, one torchrun agent per
    #: host, started through host_exec ("ssh {host}"; empty: on this machine)
    nodes: int = 1
    procs_per_node: int = 0  # 0: one node, world sizes as given
    hosts: tuple[str, ...] = ()  # each node's address, the first serving the rendezvous
    host_exec: str = ""
    rdzv: str = "c10d"  # or "static" (node i is node rank i)
    rdzv_port: int = 29500
    ifname: str = ""  # the nodes' network interface for gloo / NCCL (GLOO_SOCKET_IFNAME)
    #: a node's CPU cores, shared by its ranks' threads (0: as many as this machine has)
    cores_per_node: int = 0
    #: threads each rank computes with on a CPU (0: its node's cores shared by its ranks);
    #: verify runs a share baseline at its cells' count, since a convolution's gradient
    #: depends on how many threads reduce it
    threads_per_rank: int = 0
    #: "" (each strategy's own launcher) or "slurm": every cell one srun step (bench.harness.slurm),
    #: hosts the allocation's node names and master_addr its first node's address
    launcher: str = ""
    master_addr: str = ""

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        from bench.workload import plugins

        need(
            self.dataset in DATASETS or plugins.is_plugin(self.dataset, plugins.DATASET_GROUP),
            f"unknown dataset {self.dataset!r}; choose one of {', '.join(DATASETS)}, or your "
            "own as package.module:factory or path/to/file.py:factory",
        )
        need(
            not self.dataset_kwargs or plugins.is_plugin(self.dataset, plugins.DATASET_GROUP),
            f"--dataset-arg goes to your own data set's factory; {self.dataset} is built in "
            "and takes none",
        )
        for name in ("dataset", "model"):  # a file named relative to here: ranks start elsewhere
            object.__setattr__(self, name, plugins.absolute(getattr(self, name)))
        need(self.device in DEVICES, unknown_device(self.device))
        need(
            self.global_batch >= 1,
            f"--global-batch must be a positive integer, got {self.global_batch}",
        )
        need(self.epochs >= 1, f"--epochs must be at least 1, got {self.epochs}")
        need(
            self.max_steps is None or self.max_steps >= 1,
            f"--max-steps must be at least 1, got {self.max_steps}",
        )
        need(self.warmup_steps >= 0, f"--warmup-steps cannot be negative, got {self.warmup_steps}")
        need(self.repeats >= 1, f"--repeats must be at least 1, got {self.repeats}")
        need(
            self.repeats <= MAX_REPEATS,
            f"--repeats takes at most {MAX_REPEATS}, got {self.repeats}",
        )
        need(
            self.workers is None or self.workers >= 0,
            f"--workers cannot be negative, got {self.workers}",
        )
        need(
            0 < self.timeout_s <= MAX_TIMEOUT_S,
            f"--timeout takes seconds above 0 and at most {MAX_TIMEOUT_S} (a week), got "
            f"{self.timeout_s}",
        )
        if self.lr is None:
            object.__setattr__(self, "lr", DEFAULT_LR.get(self.optimizer, DEFAULT_LR["sgd"]))
        need(
            self.lr > 0 and math.isfinite(self.lr),
            f"--lr must be positive and finite, got {self.lr}",
        )
        need(
            isinstance(self.seed, int) and 0 <= self.seed < 2**32,
            f"--seed must be an integer from 0 to 2**32 - 1 (numpy's range), got {self.seed}",
        )
        need(
            not self.run_id
            or (self.run_id not in (".", "..") and not any(c in self.run_id for c in "/\\")),
            f"--run-id names a folder inside --out-dir: no / or \\, not . or .., got {self.run_id!r}",
        )
        need(
            len(self.run_id.encode()) <= 200,
            f"--run-id names a folder: at most 200 bytes, got {len(self.run_id.encode())}",
        )
        need(
            self.data_feed in ("auto", "device", "loader"),
            f"--data-path takes auto, device or loader, got {self.data_feed!r}",
        )
        need(
            self.compile_mode in COMPILE_MODES,
            f"--compile-mode takes {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}",
        )
        need(
            self.compile_mode == "default" or True in self.compile,
            f"--compile-mode {self.compile_mode} is torch.compile's mode: it needs --compile",
        )
        need(
            self.step_timing in ("sync", "events"),
            f"--step-timing takes sync or events, got {self.step_timing!r}",
        )
        need(
            not (self.data_feed == "device" and self.dataset == "imagenet-subset"),
            "--data-path device needs data held in memory (mnist, synthetic, python-source); the "
            "ImageNet subset is decoded from files by the DataLoader: use --data-path loader or auto",
        )
        need(
            self.diverge_factor > 1,
            f"--diverge-factor must be more than 1, got {self.diverge_factor}",
        )
        need(self.limit is None or self.limit >= 1, f"--limit must be at least 1, got {self.limit}")
        need(self.max_classes is None or self.max_classes >= 2, "--max-classes must be at least 2")
        need(
            self.max_classes is None or self.dataset == "imagenet-subset",
            f"--max-classes keeps the ImageNet subset's first N classes; {self.dataset} "
            "takes its classes from its data or model: leave it out",
        )
        need(self.eval_samples >= 0, "--eval-samples cannot be negative")
        need(
            isinstance(self.probe_pairs, int) and 0 <= self.probe_pairs <= 1000,
            f"--probe-steps takes 0 to 1000 (pairs of steps with and without sync), got {self.probe_pairs}",
        )
        need(
            self.target_precision is None or 0 < self.target_precision < 100,
            f"--target-precision takes a % above 0 and below 100, got {self.target_precision}",
        )
        need(
            isinstance(self.profile_steps, int) and 0 <= self.profile_steps <= 100,
            f"--profile-steps takes 0 to 100, got {self.profile_steps}",
        )
        need(
            not self.profile or self.profile_steps >= 1,
            "--profile writes the trace of the profiled steps: --profile-steps must be at least 1",
        )
        if self.image_size == 0:
            object.__setattr__(self, "image_size", self.default_image_size())
        need(
            16 <= self.image_size <= 1024,
            f"--image-size takes 16 to 1024 pixels, got {self.image_size}",
        )
        need(
            2 <= self.seq_len <= 1 << 20,
            f"--seq-len takes 2 to {1 << 20} tokens, got {self.seq_len}",
        )
        need(
            self.max_steps is None or self.warmup_steps < self.max_steps,
            f"--warmup-steps ({self.warmup_steps}) must be less than --max-steps ({self.max_steps}): "
            "no step would be timed",
        )
        need(
            self.limit is None or self.limit >= self.global_batch,
            f"--limit ({self.limit}) is smaller than the global batch ({self.global_batch}): no full step",
        )
        for p in self.precisions:
            need(p in PRECISIONS, f"unknown precision {p!r}; choose from {', '.join(PRECISIONS)}")
        for k in self.accumulate:
            need(
                isinstance(k, int) and k >= 1,
                f"--accumulate takes positive integers (micro-batches per step), got {k!r}",
            )
        need(
            self.optimizer in OPTIMIZERS,
            f"unknown optimizer {self.optimizer!r}; choose {', '.join(OPTIMIZERS)}",
        )
        flags = {"precisions": "--precision", "compile": "--compile"}
        flags |= {"accumulate": "--accumulate", "sync_bn": "--sync-bn"}
        flags |= {"channels_last": "--channels-last"}
        for name, flag in flags.items():
            values = getattr(self, name)
            need(name == "precisions" or len(values) >= 1, f"{flag} needs at least one value")
            need(len(set(values)) == len(values), f"{flag} lists a value twice")
        for ws in self.world_sizes:
            need(
                isinstance(ws, int) and ws >= 1,
                f"world sizes must be positive integers, got {ws!r}",
            )
        need(
            len(set(self.world_sizes)) == len(self.world_sizes), "--world-sizes lists a size twice"
        )
        need(
            len(set(self.strategies)) == len(self.strategies), "--strategies lists a strategy twice"
        )
        need(len(set(self.exclude)) == len(self.exclude), "--exclude lists a strategy twice")
        need(
            not (self.strategies and self.exclude),
            "--exclude goes with the default selection (every strategy), not with --strategies",
        )
        need(
            bool(self.model) or self.dataset in DEFAULT_MODEL,
            f"--dataset {self.dataset} is your own: name the model to train on it with --model",
        )
        self._check_nodes(need)
        if not self.model:
            object.__setattr__(self, "model", DEFAULT_MODEL[self.dataset])
        if not self.data_root:
            object.__setattr__(self, "data_root", os.environ.get("PARABENCH_DATA_ROOT", "data"))
        object.__setattr__(self, "out_dir", os.path.expanduser(self.out_dir))  # as data_root

    @property
    def min_timed_steps(self) -> int:
        """The timed steps an epoch must leave after its warm-up: one, or with
        --target-precision as many as its first check needs."""
        from bench.harness.stats import PRECISION_MIN_STEPS

        return 1 if self.target_precision is None else PRECISION_MIN_STEPS

    def _check_nodes(self, need: Any) -> None:
        need(self.nodes >= 1, f"--nodes must be at least 1, got {self.nodes}")
        need(
            self.procs_per_node >= 0,
            f"--procs-per-node must be at least 1, got {self.procs_per_node}",
        )
        need(self.rdzv in ("c10d", "static"), f"--rdzv takes c10d or static, got {self.rdzv!r}")
        need(
            1024 < self.rdzv_port <= 65535 - 200,
            f"--rdzv-port takes 1025 to 65335 (cells take the ports above it in turn), got {self.rdzv_port}",
        )
        if self.host_exec:
            import shlex

            try:
                shlex.split(self.host_exec.format(host="h", node=0))
            except Exception as exc:  # a bad field, brace or quote: whatever str.format says
                need(False, f"--host-exec takes the fields {{host}} and {{node}}: {exc}")
        need(self.launcher in ("", "slurm"), f"--launcher takes slurm, got {self.launcher!r}")
        need(
            self.cores_per_node >= 0,
            f"--cores-per-node must be positive (0: this machine's), got {self.cores_per_node}",
        )
        if self.launcher == "slurm":
            need(
                not self.host_exec,
                "--host-exec goes with torchrun's agents; under --launcher slurm srun starts the ranks",
            )
            need(
                self.procs_per_node >= 1
                and len(self.hosts) == self.nodes
                and bool(self.master_addr),
                "--launcher slurm takes its nodes from the allocation (run it inside salloc or sbatch)",
            )
            world = self.nodes * self.procs_per_node
            need(
                self.world_sizes in ((), (world,)),
                f"--launcher slurm runs {self.nodes} node(s) x {self.procs_per_node}: world size "
                f"{world}; --world-sizes {','.join(map(str, self.world_sizes))} asks for another",
            )
            object.__setattr__(self, "world_sizes", (self.nodes * self.procs_per_node,))
            return
        if self.nodes == 1:
            need(
                not (self.procs_per_node or self.hosts or self.host_exec or self.cores_per_node),
                "--procs-per-node, --hosts, --host-exec and --cores-per-node describe several "
                "nodes: give --nodes N too",
            )
            # one machine's ranks meet on loopback, at torchrun's own port: these would be
            # dropped without a word, the run not on the interface or port asked for
            need(
                all(getattr(self, k) == v for k, v in _ONE_MACHINE_MEETING.items()),
                "--ifname, --rdzv and --rdzv-port set how several nodes meet; on one machine "
                "the ranks meet on loopback: leave them out, or give --nodes N",
            )
            return
        need(self.procs_per_node >= 1, "--nodes N needs --procs-per-node M (world size N x M)")
        need(
            len(self.hosts) == self.nodes,
            f"--nodes {self.nodes} needs --hosts with {self.nodes} addresses, the first serving "
            f"the rendezvous; got {len(self.hosts)}",
        )
        world = self.nodes * self.procs_per_node
        need(
            self.world_sizes in ((), (world,)),
            f"--nodes {self.nodes} x --procs-per-node {self.procs_per_node} is world size {world}; "
            f"--world-sizes {','.join(map(str, self.world_sizes))} asks for another",
        )
        object.__setattr__(self, "world_sizes", (world,))

    def default_image_size(self) -> int:
        if self.dataset != "synthetic":
            return 224
        from bench.harness.env import resolve_device

        return CPU_SYNTHETIC_IMAGE_SIZE if resolve_device(self.device) == "cpu" else 224

    @property
    def data_path(self) -> Path:
        return Path(self.data_root).expanduser()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"a run's config is an object, not {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        if d.get("nodes") in (None, 0, 1) and not d.get("launcher"):
            # a run saved before one machine refused these kept them, and ran without them
            for key in _ONE_MACHINE_MEETING:
                d.pop(key, None)
        for key in ("strategies", "exclude", "world_sizes", "precisions", "hosts"):
            d[key] = tuple(d.get(key) or ())
        for key in ("compile", "accumulate", "sync_bn", "channels_last"):
            if key in d:
                d[key] = tuple(d[key]) if isinstance(d[key], list | tuple) else (d[key],)
        for f in dataclasses.fields(cls):
            if f.name in d and not _of_type(d[f.name], str(f.type)):
                # a config.json edited by hand ("repeats": 2.5, "2"): said here, where the
                # checks below would compare a string with a number, or plan a traceback
                said = json.dumps(d[f.name])
                raise ConfigError(f"{f.name} is {said}, not {_TYPE_WORDS[str(f.type)]}")
        return cls(**d)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    @property
    def multi_host(self) -> bool:
        """Whether the cells' ranks run on other nodes than the harness's own (several nodes,
        or srun's): what this machine measures does not describe where they run."""
        return self.nodes > 1 or bool(self.launcher)

    def one_host(self) -> RunConfig:
        """This run on the harness's machine alone: no nodes, hosts or launcher."""
        return self.replace(
            nodes=1,
            procs_per_node=0,
            hosts=(),
            host_exec="",
            **_ONE_MACHINE_MEETING,
            cores_per_node=0,
            launcher="",
            master_addr="",
        )


#: how several nodes' ranks meet (--ifname, --rdzv, --rdzv-port), as a run on one machine
#: has them: its ranks meet on loopback at torchrun's own port
_ONE_MACHINE_MEETING = {k: getattr(RunConfig, k) for k in ("ifname", "rdzv", "rdzv_port")}


# ---------------------------------------------------------------- errors in one line
def _said(exc: BaseException) -> tuple[str, str]:
    """The first line of an exception's message ('' where it has none), and where it was
    raised ('' here, or "DataLoader worker process N"). A DataLoader worker's exception,
    raised again in the training process, says only "Caught X in DataLoader worker process
    N." first and the worker's traceback after: the first line of the message it ends
    with, the cause (a file that cannot be decoded, a sample that raised), is taken."""
    text = str(exc).strip()
    if not text:
        return "", ""
    lines = text.splitlines()
    caught = lines[0].removeprefix("Caught ")
    if caught != lines[0] and "Original Traceback" in text:
        # the last traceback's frames are indented; its exception's line is the first not
        raised = text.rpartition("(most recent call last):")[2].splitlines()
        line = next((ln for ln in raised if ln.strip() and not ln[0].isspace()), "")
        name, sep, message = line.partition(": ")
        return message.strip() if sep else "", caught.partition(" in ")[2].rstrip(".")
    return lines[0], ""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (`_said`), or its type's name where it
    has none."""
    said, where = _said(exc)
    return (said or type(exc).__name__) + (f" ({where})" if where else "")


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message` (`_said`; the type alone where it has none), at
    most `limit` characters: a long message is cut, never the worker it was raised in."""
    said, where = _said(exc)
    where = f" ({where})" if where else ""
    head = type(exc).__name__ + (f": {said}" if said else "")
    return head[: max(limit - len(where), 0)] + where


def not_a_run(path: Path, missing: str) -> ConfigError:
    """The error for a folder named as a run that holds none (`missing`: the file it lacks).
    Where its folders hold runs (results/, a GPU check's under results/reference/), it names
    them: `compare` of a GPU check's folder was told only to check it was a run directory."""
    inside = sorted(p.parent.name for p in path.glob("*/runs.csv"))
    if not inside:
        return ConfigError(f"{path}: no {missing} there; is it a parabench run directory?")
    more = f" and {len(inside) - 3} more" if len(inside) > 3 else ""
    return ConfigError(
        f"{path}: no {missing} there, but runs in its folders ({', '.join(inside[:3])}{more}): "
        f"name one, as {path / inside[0]}"
    )


def run_dir_named(path: str | Path) -> Path:
    """The run directory a command names: the folder itself, or the folder of the runs.csv
    named (as a tab completion may end). ConfigError for a missing path, or another file,
    naming the folder it is in."""
    path = Path(path)
    if path.is_file() and path.name == "runs.csv":
        return path.parent
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path} is a file, not a run directory: try {path.parent}")
    if not path.is_dir():
        raise ConfigError(f"{path}: no such run directory")
    return path
