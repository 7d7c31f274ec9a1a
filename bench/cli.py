"""`parabench`: which way to parallelise PyTorch training, measured on this machine: how
fast each strategy trains, its memory, where its time goes, how it scales, and whether it
trains the same model. Bad input is one line on stderr and exit code 2, before anything starts.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import program, torch_too_old
from bench.config import (
    DATASETS,
    DEFAULT_LR,
    DEVICES,
    OPTIMIZERS,
    PRECISIONS,
    SET_BY_VERIFY,
    ConfigError,
    RunConfig,
    RunStopped,
    comma_items,
    unknown_device,
)

EXIT_BAD_INPUT = 2


def _csv(kind: type):
    def parse(text: str):
        items = comma_items(text)
        try:
            return tuple(kind(x) for x in items)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}: {text!r}"
            ) from exc

    return parse


def _on_off(text: str) -> tuple[bool, ...]:
    """`on`, `off` or `off,on` (both, as a matrix axis)."""
    words = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}
    parts = [x.lower() for x in comma_items(text)]
    if any(x not in words for x in parts):
        raise argparse.ArgumentTypeError(f"expected on, off or off,on; got {text!r}")
    return tuple(words[x] for x in parts)


def _kv(text: str) -> tuple[str, str]:
    k, eq, v = text.partition("=")
    if not eq or not k.strip():  # no key: a factory would be told of an argument named ''
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return k.strip(), v.strip()


def _model_arg(text: str) -> tuple[str, Any]:
    """key=value for a model's or data set's factory; the value as a Python literal (8, 0.1,
    True), else as a string. The ranks read it from the run's config.json: a value JSON
    cannot hold (a set, bytes) would stop the run with a traceback after its estimate, and
    one it holds otherwise (a tuple comes back a list) would reach the ranks' factory as
    another value than the harness checked; so it is taken as JSON gives it back, or
    refused."""
    k, v = _kv(text)
    try:
        value = ast.literal_eval(v)
    except (ValueError, SyntaxError):
        return k, v
    refused = "cannot be passed to the ranks (the run's config is JSON); give a number, a "
    refused += "string, True, False, None, or a list or dict (with string keys) of them"
    if _keys_not_str(value):  # JSON would make {8: 16} {"8": 16}, the factory another value
        raise argparse.ArgumentTypeError(f"{k}={v}: a dict whose keys are not strings {refused}")
    try:
        return k, json.loads(json.dumps(value))
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{k}={v}: a {type(value).__name__} value {refused}"
        ) from None


def _keys_not_str(value: Any) -> bool:
    """Whether `value` holds a dict with a key that is not a string, at any depth."""
    if isinstance(value, dict):
        return any(not isinstance(k, str) or _keys_not_str(x) for k, x in value.items())
    return isinstance(value, list | tuple) and any(_keys_not_str(x) for x in value)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        self.exit(EXIT_BAD_INPUT, f"parabench: error: {message}\n")


def add_run_options(p: argparse.ArgumentParser) -> None:
    d = RunConfig()
    p.add_argument(
        "--strategies", type=_csv(str), default=(), help="comma-separated (default: all)"
    )
    p.add_argument(
        "--exclude",
        type=_csv(str),
        default=(),
        help="strategies to leave out of the default (every strategy), comma-separated",
    )
    p.add_argument(
        "--world-sizes",
        type=_csv(int),
        default=(),
        help="e.g. 1,2 (default: 1,2,4.. up to devices)",
    )
    p.add_argument(
        "--dataset",
        default=d.dataset,
        help=f"one of {', '.join(DATASETS)}, or your own: package.module:factory or "
        "path/to/file.py:factory (README: 'Your own model and data')",
    )
    p.add_argument(
        "--dataset-arg",
        dest="dataset_args",
        type=_model_arg,
        action="append",
        default=[],
        help="key=value passed to your data-set factory",
    )
    p.add_argument(
        "--model",
        default="",
        help="mnist_cnn, transformer (a small ViT that model parallelism can split), lm (a "
        "decoder-only language model: --model-arg size=tiny|small|base|medium), any torchvision "
        "classification model, or your own: package.module:factory or path/to/file.py:factory",
    )
    p.add_argument(
        "--model-arg",
        dest="model_args",
        type=_model_arg,
        action="append",
        default=[],
        help="key=value passed to the model's constructor or factory, e.g. depth=8 for "
        "transformer, size=base for lm",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        default=d.global_batch,
        help="samples per optimizer step over all ranks, the same for every strategy and "
        "world size (default %(default)s)",
    )
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"default {d.epochs}")
    p.add_argument("--max-steps", type=int, default=None, help="cap on steps per epoch")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=d.warmup_steps,
        help=f"steps at each epoch's start left out of timing (default {d.warmup_steps})",
    )
    p.add_argument(
        "--target-precision",
        type=float,
        default=None,
        metavar="PCT",
        help="time each cell's steps until its mean step time is known to within PCT %% "
        "(95 %% interval over blocks of 10 steps; at least 50 timed steps, at most --max-steps "
        "or an epoch); rows say how many ran and the precision reached",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=d.repeats,
        help=f"runs of every cell, interleaved round by round (default {d.repeats}; make "
        "bench: 3, the fewest that give a 95 %% interval)",
    )
    p.add_argument("--device", default=d.device, help="auto, cpu or cuda")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers per device (default 0 CPU, 4 CUDA); only where a DataLoader "
        "feeds the run (the ImageNet subset, a data factory's Dataset, or --data-path loader)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help=f"the initial weights' and the data order's, the same for every strategy "
        f"(default {d.seed})",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="learning rate (default: the optimizer's, "
        + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_LR.items())
        + ")",
    )
    p.add_argument("--data-root", default="", help="default: $PARABENCH_DATA_ROOT or ./data")
    p.add_argument(
        "--download", action="store_true", help="download MNIST if missing (needs internet)"
    )
    p.add_argument("--limit", type=int, default=None, help="cap on training samples")
    p.add_argument("--max-classes", type=int, default=None, help="imagenet-subset: first N classes")
    p.add_argument(
        "--eval-samples",
        type=int,
        default=d.eval_samples,
        help=f"held-out samples evaluated after each epoch, at most what the data set holds "
        f"out (default {d.eval_samples}; 0: no evaluation)",
    )
    p.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="image side in pixels, 16 to 1024 (default 224; synthetic data on a CPU: 64, as "
        "224 takes many minutes per cell there)",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help=f"tokens per sample for token models (lm) and their data (default {d.seq_len})",
    )
    p.add_argument(
        "--timeout", type=float, default=d.timeout_s, help="seconds per cell before it is killed"
    )
    p.add_argument(
        "--out-dir", default=d.out_dir, help="where run folders go (default %(default)s/)"
    )
    p.add_argument(
        "--run-id", default="", help="the run folder's name (default: date, time and pid)"
    )
    p.add_argument(
        "--set",
        dest="options",
        type=_kv,
        action="append",
        default=[],
        help="strategy option key=value (e.g. opt_level=O2); key=a,b,c sweeps it as an axis",
    )
    axes = p.add_argument_group(
        "run options applied around every strategy that supports them (each a matrix axis)"
    )
    axes.add_argument(
        "--precision",
        dest="precisions",
        type=_csv(str),
        default=(),
        help=f"{', '.join(PRECISIONS)} or a list, e.g. fp32,bf16 (default: each strategy's own)",
    )
    axes.add_argument(
        "--compile",
        type=_on_off,
        nargs="?",
        const=(True,),
        default=d.compile,
        help="torch.compile the model: --compile, or off,on for both",
    )
    axes.add_argument(
        "--compile-mode",
        default=d.compile_mode,
        help="torch.compile's mode for the compiled cells: default, reduce-overhead (CUDA "
        "graphs: fewer kernel launches for small steps), max-autotune, "
        "max-autotune-no-cudagraphs",
    )
    axes.add_argument(
        "--accumulate",
        type=_csv(int),
        default=d.accumulate,
        help="micro-batches per optimizer step, e.g. 1,2 (same global batch per step)",
    )
    axes.add_argument(
        "--sync-bn",
        type=_on_off,
        nargs="?",
        const=(True,),
        default=d.sync_bn,
        help="convert BatchNorm to SyncBatchNorm (GPU only): --sync-bn, or off,on",
    )
    axes.add_argument(
        "--channels-last",
        type=_on_off,
        nargs="?",
        const=(True,),
        default=d.channels_last,
        help="channels-last (NHWC) model and inputs: --channels-last, or off,on",
    )
    p.add_argument("--optimizer", default=d.optimizer, help=f"one of {', '.join(OPTIMIZERS)}")
    p.add_argument(
        "--data-path",
        dest="data_feed",
        default=d.data_feed,
        help="how batches reach the device: device (in-memory data moved there once, batches "
        "indexed there), loader (DataLoader), auto (device for mnist, synthetic, "
        "python-source and tensors your data factory returns; default)",
    )
    p.add_argument(
        "--step-timing",
        default=d.step_timing,
        help="on CUDA: sync (synchronise around each step and read the host clock; default) "
        "or events (CUDA events, no synchronisation inside the loop, so the host queues "
        "ahead of the GPU as a plain loop does); the same on a CPU",
    )
    p.add_argument(
        "--diverge-factor",
        type=float,
        default=d.diverge_factor,
        help="a row whose loss turns non-finite or exceeds this many times its first step's "
        "is `diverged`, not ok (default %(default)g)",
    )
    probes = p.add_argument_group("where the time goes (after the timed steps; README)")
    probes.add_argument(
        "--probe-steps",
        dest="probe_pairs",
        type=int,
        default=d.probe_pairs,
        help="pairs of steps with and without gradient sync after the timed steps of a "
        "multi-process cell: the exposed communication (default %(default)s; 0: none)",
    )
    probes.add_argument(
        "--profile-steps",
        type=int,
        default=d.profile_steps,
        help="steps under torch.profiler after those: communication in all (default %(default)s)",
    )
    probes.add_argument(
        "--profile",
        action="store_true",
        help="keep each cell's Chrome/Perfetto trace of the profiled steps: cells/<cell>/trace.json",
    )
    probes.add_argument(
        "--no-scaling-model",
        dest="scaling_model",
        action="store_false",
        help="skip what `parabench predict` and MFU need (the collectives' latency and "
        "bandwidth, compute at smaller batches, model FLOPs and the CPU's matmul peak)",
    )
    nodes = p.add_argument_group("several nodes (README: running on a cluster)")
    nodes.add_argument(
        "--nodes",
        type=int,
        default=None,  # given or not: under --launcher slurm, not given is all the allocation's
        help="nodes, one torchrun agent on each (default 1; under --launcher slurm, all of "
        "the allocation's)",
    )
    nodes.add_argument(
        "--procs-per-node",
        type=int,
        default=None,  # not given: one node (under --launcher slurm, the allocation's count)
        metavar="M",
        help="ranks per node: world size N x M",
    )
    nodes.add_argument(
        "--hosts",
        type=_csv(str),
        default=(),
        help="each node's address, comma-separated; the first serves the rendezvous",
    )
    nodes.add_argument(
        "--host-exec",
        default="",
        metavar="TEMPLATE",
        help="how a command reaches a node, with {host} and {node}: e.g. 'ssh {host}' "
        "(default: on this machine)",
    )
    nodes.add_argument(
        "--rdzv",
        default=d.rdzv,
        help="c10d (the default: node ranks assigned at the rendezvous) or static "
        "(node i of --hosts is node rank i)",
    )
    nodes.add_argument(
        "--rdzv-port",
        type=int,
        default=d.rdzv_port,
        help=f"the first node's port for the rendezvous; each cell takes the next of 200 in "
        f"turn (default {d.rdzv_port})",
    )
    nodes.add_argument(
        "--launcher",
        default="",
        choices=["slurm"],
        help="slurm: inside an allocation, every cell one srun step over its nodes "
        "(--nodes: all of them by default); outside one, see `parabench submit`",
    )
    nodes.add_argument(
        "--ifname",
        default="",
        help="the nodes' network interface, for gloo and NCCL (GLOO_SOCKET_IFNAME)",
    )
    nodes.add_argument(
        "--cores-per-node",
        type=int,
        default=0,
        metavar="C",
        help="a node's CPU cores, split among its ranks' threads (default: as many as this "
        "machine has, under --launcher slurm the allocation's CPUs a node; say it where the "
        "nodes differ from the machine parabench runs on)",
    )
    p.add_argument(
        "--oversubscribe",
        action="store_true",
        help="allow more CPU ranks than cores, one thread each (e.g. fsdp_tp at world size 4 "
        "on 2 cores), or more DDP ranks than GPUs, sharing them over gloo (nccl refuses two "
        "ranks on one GPU): for correctness, such rows are marked and left out of speed "
        "rankings",
    )


def _procs_per_node(a: argparse.Namespace) -> int:
    """--procs-per-node as the config holds it: 0 where it was not given; a given 0 is
    refused as any count below 1 is, not read as 'not given'."""
    if a.procs_per_node is None:
        return 0
    if a.procs_per_node < 1:
        raise ConfigError(f"--procs-per-node must be at least 1, got {a.procs_per_node}")
    return a.procs_per_node


def config_from_args(a: argparse.Namespace, **extra) -> RunConfig:
    nodes = dict(
        nodes=RunConfig.nodes if a.nodes is None else a.nodes,
        procs_per_node=_procs_per_node(a),
        hosts=a.hosts,
        host_exec=a.host_exec,
        rdzv=a.rdzv,
        rdzv_port=a.rdzv_port,
        ifname=a.ifname,
        cores_per_node=a.cores_per_node,
        launcher=a.launcher,
    )
    if a.launcher == "slurm":  # the nodes are the allocation's
        from bench.harness import slurm

        if a.hosts or a.rdzv != RunConfig.rdzv:  # they would be replaced without a word
            raise ConfigError(
                "--hosts and --rdzv go with torchrun's agents; under --launcher slurm the "
                "nodes are the allocation's and srun starts the ranks: leave them out"
            )
        nodes |= slurm.describe(a.nodes, nodes["procs_per_node"], a.cores_per_node)
        nodes["master_addr"] = nodes.pop("master")
    cfg = RunConfig(
        strategies=a.strategies,
        exclude=a.exclude,
        world_sizes=a.world_sizes,
        dataset=a.dataset,
        model=a.model,
        global_batch=a.global_batch,
        epochs=a.epochs,
        max_steps=a.max_steps,
        warmup_steps=a.warmup_steps,
        target_precision=a.target_precision,
        repeats=a.repeats,
        device=a.device,
        workers=a.workers,
        seed=a.seed,
        lr=a.lr,
        data_root=a.data_root,
        download=a.download,
        limit=a.limit,
        max_classes=a.max_classes,
        eval_samples=a.eval_samples,
        image_size=_image_size(a.image_size),
        timeout_s=a.timeout,
        out_dir=a.out_dir,
        run_id=a.run_id,
        options=_pairs("--set", a.options, "to sweep it, give its values at once: --set {}=a,b"),
        precisions=a.precisions,
        compile=a.compile,
        compile_mode=a.compile_mode,
        accumulate=a.accumulate,
        sync_bn=a.sync_bn,
        channels_last=a.channels_last,
        optimizer=a.optimizer,
        oversubscribe=a.oversubscribe,
        diverge_factor=a.diverge_factor,
        data_feed=a.data_feed,
        step_timing=a.step_timing,
        model_kwargs=_pairs("--model-arg", a.model_args),
        dataset_kwargs=_pairs("--dataset-arg", a.dataset_args),
        seq_len=RunConfig.seq_len if a.seq_len is None else a.seq_len,
        probe_pairs=a.probe_pairs,
        profile_steps=a.profile_steps,
        profile=a.profile,
        scaling_model=a.scaling_model,
        **nodes,
        **extra,
    )
    from bench.workload import data

    data.unused_options(
        cfg,
        image_size=a.image_size is not None,
        seq_len=a.seq_len is not None,
        workers=a.workers is not None,
    )
    return cfg


def cmd_run(a: argparse.Namespace) -> int:
    from bench.analysis import summary
    from bench.harness import results, runner

    if a.retry_failed and not a.resume:
        raise ConfigError(
            "--retry-failed runs the failed cells of a run again: it goes with --resume RUN_DIR"
        )
    if a.resume:
        # --timeout measures nothing: a cell that timed out may run again with more time
        given = _given(a, keep=("resume", "no_report", "dry_run", "retry_failed", "timeout"))
        if given:
            raise ConfigError(
                f"--resume {a.resume} finishes the run with its own options (its config.json; "
                f"--timeout aside); {', '.join(given)} would be ignored: leave them out, or "
                "start a new run"
            )
    cfg = config_from_args(a)
    if not a.resume:
        from bench.harness import estimate

        _compile_warmed(cfg)
        runner.check_new_run(cfg)
        cells = runner.plan(cfg)  # bad input: one line before anything runs
        for line in runner.sweep_notes(cfg, cells):
            print(line)
        est = estimate.estimate(cfg, cells)
        if a.dry_run:
            print(estimate.plan_text(cfg, cells, est))
            return 0
        print(est.line(), flush=True)
    elif a.dry_run:
        raise ConfigError("--dry-run plans a new run; it does not go with --resume")
    # a line at a time, also into a pipe: `| tee` shows the cells as they end, and a
    # reader that leaves (`| head`) stops the run then, not at its end
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    # a stop: the run says its own line (proc.Interrupted), or main says one where the run
    # could not (exit 130 both); swallowed here, a stop it could not say went unsaid
    run_dir, rows = runner.run_matrix(
        cfg,
        resume=Path(a.resume) if a.resume else None,
        progress=True,
        retry=a.retry_failed,
        timeout_s=cfg.timeout_s if a.resume and _given(a, only=("timeout",)) else None,
    )
    from bench.analysis import report

    rendered = None
    if not a.no_report:  # before the table, so a reader gone by then does not lose it
        # the run held again while its report is written: `status` said it complete, its
        # report named nowhere, for the seconds the plots take (a second parabench that
        # took the run as this one let go of it: written unheld, as before)
        held = runner.RunDir(run_dir)
        try:
            with contextlib.suppress(ConfigError, OSError):
                held.lock()
            rendered = report.render(run_dir)
        except report.StoppedWhole as stop:
            print(f"interrupted once the report was whole: {stop}", file=sys.stderr)
            return 130
        except KeyboardInterrupt:
            print(
                f"interrupted while writing the report: every row is in {run_dir}; "
                f"`{program()} report {run_dir}` writes it",
                file=sys.stderr,
            )
            return 130
        except ConfigError as exc:  # its folder cannot take it (a disk that filled up)
            # the run is whole: said as such, its table shown, not a line of bad input
            print(
                f"parabench: no report: {exc}; every row is in {run_dir}: "
                f"`{program()} report {run_dir}` writes it",
                file=sys.stderr,
            )
        finally:
            held.unlock()
    print(summary.table(rows))
    ranking, busy = report.run_end_lines(run_dir)
    for line in ranking:
        print(f"- {line}")
    if busy:
        print(busy[0].upper() + busy[1:])
    print(f"results: {run_dir}")
    if rendered:
        print(f"report: {rendered}")
    broken = [r for r in rows if r["status"] in results.BROKEN]
    if broken:
        print(f"{len(broken)} cell(s) failed, ran out of memory, timed out or diverged (see above)")
    if any(r["status"] in results.RETRYABLE for r in broken):
        launcher = runner.RunDir(run_dir).config().launcher
        kept = results.resumed_timeout(run_dir)  # a resume's --timeout, which `again` names
        again = results.resume_command(launcher, run_dir, retry=True, timeout_s=kept)
        more = ""
        if any(r["status"] == results.TIMEOUT for r in broken):
            larger = (
                "its --timeout larger"
                if kept is not None
                else "a larger --timeout SECONDS beside it"
            )
            more = f" (with {larger} for those that timed out)"
        print(f"to run those that failed, ran out of memory or timed out again: {again}{more}")
    return 1 if broken or not (rendered or a.no_report) else 0


def _compile_warmed(cfg: RunConfig) -> None:
    """A compiled cell compiles in its first step: with no warm-up step to hold it, the
    compilation (tens of seconds) would be timed as training. verify times nothing and
    runs without warm-up; a run that times its steps is refused here."""
    if True in cfg.compile and cfg.warmup_steps == 0:
        raise ConfigError(
            "--compile compiles in each cell's first step: --warmup-steps 0 would time that "
            "compilation as a training step; give at least 1 (its time is first_step_ms)"
        )


def _given(
    a: argparse.Namespace,
    keep: Sequence[str] = (),
    only: Sequence[str] | None = None,
    but: Mapping[str, Any] | None = None,
) -> list[str]:
    """The options of `a`'s command given on its command line (as its argv says; where it
    has none, those other than their defaults), but those in `keep` (of those in `only`,
    where given; and not given the value `but` names for them)."""
    but = but or {}
    outright = _outright(a)
    return [
        action.option_strings[0]
        for action in a.parser._actions
        if action.option_strings
        and action.dest not in (*keep, "help")
        and (only is None or action.dest in only)
        and (
            action.dest in outright
            if outright is not None
            else getattr(a, action.dest, action.default) != action.default
        )
        and (action.dest not in but or getattr(a, action.dest) != but[action.dest])
    ]


def _outright(a: argparse.Namespace) -> set[str] | None:
    """The dests of the options `a`'s argv gave, whatever their values: one given its
    default (`--resume RUN --repeats 1` of a run of 3 repeats) is given all the same, and
    would be ignored as any other value. None where `a` has no argv (made in code)."""
    argv = getattr(a, "argv", None)
    if argv is None or a.command not in argv:
        return None
    actions = [action for action in a.parser._actions if action.option_strings]
    defaults = [action.default for action in actions]
    try:  # parsed again with no defaults: only what the command line set is there
        for action in actions:
            action.default = argparse.SUPPRESS
        seen = a.parser.parse_args(argv[argv.index(a.command) + 1 :])
    finally:
        for action, default in zip(actions, defaults, strict=True):
            action.default = default
    return {action.dest for action in actions if hasattr(seen, action.dest)}


def _pairs(flag: str, pairs: list[tuple[str, Any]], hint: str = "give it once") -> dict[str, Any]:
    """--set's, --model-arg's or --dataset-arg's key=value pairs; a key given twice would
    keep only its last value, the first dropped without a word (`hint`: what to do, {} the
    key)."""
    keys = [k for k, _ in pairs]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice is not None:
        values = ", ".join(f"{k}={v}" for k, v in pairs if k == twice)
        raise ConfigError(f"{flag} {twice} is given twice ({values}): {hint.format(twice)}")
    return dict(pairs)


def _image_size(given: int | None) -> int:
    """--image-size, or 0 for the config's default (224; 64 for synthetic data on a CPU);
    an explicit 0 or less is no way to ask for that default."""
    if given is not None and given < 16:
        raise ConfigError(f"--image-size must be at least 16, got {given}")
    return given or 0


def cmd_list(a: argparse.Namespace) -> int:
    import strategies
    from bench.harness.runner import usable_device
    from bench.workload.models import model_names

    if a.device not in DEVICES:
        raise ConfigError(unknown_device(a.device))
    device = usable_device(a.device)
    print(f"strategies (device: {device}):")
    reg = strategies.registry()
    width = max([16, *map(len, reg)])
    for name, spec in reg.items():
        why = spec.unavailable(device)
        state = "available  " if not why else "unavailable"
        print(f"  {name:<{width}} {state} {spec.launcher!s:<11} {spec.description}")
        if why:
            print(f"  {'':<{width}} -> {why}")
    import torch

    from bench.workload import plugins
    from bench.workload.models import LM_SIZES, LanguageModel

    mine = plugins.registered(plugins.DATASET_GROUP)
    print(f"datasets: {', '.join([*DATASETS, *mine])}, or package.module:factory / file.py:factory")
    names = model_names()
    print(
        f"models: {', '.join(names[:12])}, ... ({len(names)} in all; any torchvision "
        "classification model, or package.module:factory / file.py:factory)"
    )
    for name, value in plugins.registered(plugins.MODEL_GROUP).items():
        print(f"  {name:<16} registered by a package: {value}")
    for group, kind in ((plugins.DATASET_GROUP, "data set"), (plugins.MODEL_GROUP, "model")):
        for name, value in plugins.shadowed(group).items():
            print(
                f"  {name:<16} registered by a package: {value}, not used: the name is "
                f"parabench's own {kind}'s (register it under another)"
            )
    sizes = []
    for size in LM_SIZES:
        with torch.device("meta"):
            n = sum(p.numel() for p in LanguageModel(size=size).parameters())
        sizes.append(f"{size} {n / 1e6:.1f} M")
    print(f"  lm sizes (--model-arg size=...; parameters at 128 tokens): {', '.join(sizes)}")
    return 0


def cmd_verify(a: argparse.Namespace) -> int:
    from bench.analysis import verify

    return verify.cmd_verify(a)


def add_verify_parser(sub) -> None:
    """verify's options, here and not in bench.analysis.verify: that module imports torch and
    the runner (seconds), which every other command (report, compare, --help) would pay for
    only to build the parser."""
    p = sub.add_parser("verify", help="check every strategy trains the same model as `single`")
    add_run_options(p)
    p.add_argument("--steps", type=int, default=8, help="training steps to compare (default 8)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the cells verify would run (what is skipped and why), then exit",
    )
    # verify's own values as its defaults: `run`'s (5 warm-up steps, 1,000 held-out
    # samples, the probes) given to verify as they are would otherwise pass for not given,
    # and be ignored where the others are refused (cmd_verify)
    own = {"global_batch": 32, "out_dir": "results/verify"}
    p.set_defaults(**SET_BY_VERIFY, **own)
    p.set_defaults(func=cmd_verify, parser=p)
    # and its help offers none of the options it sets itself (and refuses); those whose
    # defaults it changes say its own through %(default)s
    for action in p._actions:
        if action.dest in SET_BY_VERIFY or action.dest == "max_steps":
            action.help = argparse.SUPPRESS


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="parabench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run the benchmark matrix")
    add_run_options(r)
    r.add_argument("--resume", default=None, metavar="RUN_DIR", help="finish an interrupted run")
    r.add_argument(
        "--retry-failed",
        action="store_true",
        help="with --resume: run the cells that failed, ran out of memory or timed out again "
        "(not those that diverged: seeded, they diverge again); each earlier attempt's rows and "
        "folder are kept in RUN_DIR/retried/",
    )
    r.add_argument("--no-report", action="store_true", help="skip the report at the end")
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="print the matrix (what runs, what is skipped and why) and an estimate of its "
        "wall time, then exit",
    )
    r.set_defaults(func=cmd_run, parser=r)
    ls = sub.add_parser("list", help="strategies (available or not, and why), datasets, models")
    ls.add_argument(
        "--device", default="auto", help="auto, cpu or cuda: the device whose strategies are listed"
    )
    ls.set_defaults(func=cmd_list)
    sb = sub.add_parser(
        "submit",
        help="outside a SLURM allocation: write a batch job that runs this matrix with "
        "--launcher slurm, submit it with sbatch, print its id",
    )
    add_run_options(sb)
    sb.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an #SBATCH line of the job, e.g. --sbatch-arg=--time=01:00:00 (repeatable)",
    )
    sb.add_argument("--no-report", action="store_true", help="the job skips the report at the end")
    sb.set_defaults(func=cmd_submit)
    st = sub.add_parser(
        "status",
        help="a run's state: running (where, how far, about how long left), stopped (how to "
        "finish it) or complete, and how its cells ended; a submitted run's job's state",
    )
    st.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        nargs="?",
        help="the run directory (submit's printed; default: the newest under results/)",
    )
    st.set_defaults(func=cmd_status)
    add_verify_parser(sub)
    # the other analysis commands own their options (an import error here is a bug: it shows)
    from bench.analysis import compare, predict, report

    for module in (report, compare, predict):
        module.add_parser(sub)
    return p


def _forwarded(argv: Sequence[str]) -> list[str]:
    """submit's run options as given, without its own --sbatch-arg (however abbreviated:
    argparse takes --sbatch for it, and `run` would refuse it)."""
    out, skip = [], False
    for arg in argv:
        name, eq, _ = arg.partition("=")
        if skip:
            skip = False
        elif len(name) > 3 and "--sbatch-arg".startswith(name):
            skip = not eq
        else:
            out.append(arg)
    return out


def _unsubmitted(run_dir: Path) -> None:
    """ConfigError if `run_dir` holds a run begun already (check_new_run, after it, says
    where it was submitted and its job has not begun)."""
    if (run_dir / "config.json").exists():
        raise ConfigError(f"{run_dir} holds a run already; choose another --run-id")


def cmd_submit(a: argparse.Namespace) -> int:
    from bench.harness import runner, slurm
    from bench.harness.env import resolve_device
    from bench.harness.runner import _cuda_available as torch_cuda_available
    from bench.harness.runner import _new_run_id

    if a.launcher or a.host_exec or a.hosts or a.rdzv != RunConfig.rdzv:
        raise ConfigError(
            "submit runs the matrix with --launcher slurm on the job's nodes: "
            "no --launcher, --host-exec, --hosts or --rdzv"
        )
    n = RunConfig.nodes if a.nodes is None else a.nodes
    per = _procs_per_node(a) or 1
    # everything checked now, as the job will see it (with placeholder nodes): a bad option
    # or a strategy that cannot run there is one line here, not a failed job later
    one = argparse.Namespace(
        **{**vars(a), "nodes": None, "procs_per_node": None, "launcher": "", "cores_per_node": 0}
        | {"ifname": "", "rdzv_port": RunConfig.rdzv_port}
    )
    cfg = config_from_args(one).replace(
        launcher="slurm",
        nodes=n,
        procs_per_node=per,
        cores_per_node=a.cores_per_node,
        ifname=a.ifname,
        rdzv_port=a.rdzv_port,
        hosts=tuple(f"node{i}" for i in range(n)),
        master_addr="node0",
    )
    _compile_warmed(cfg)
    cuda = resolve_device(cfg.device) == "cuda"
    gpus = 0
    if cuda and not torch_cuda_available():
        gpus = per  # a login node without one: the job's nodes are taken to have them
    run_id = a.run_id or _new_run_id()
    run_dir = Path(cfg.out_dir).resolve() / run_id  # as the config reads --out-dir (~ too)
    _unsubmitted(run_dir)
    runner.check_new_run(cfg.replace(out_dir=str(run_dir.parent), run_id=run_id))
    runner.plan(cfg, gpus_per_node=gpus)
    # NAME=VALUE: a run id that starts with a dash (`--run-id=-x`, which submit took) is
    # then a value to the job's `run`, not an option it refuses, failing the job at once
    argv = [*_forwarded(a.argv[1:]), f"--run-id={run_id}", f"--out-dir={run_dir.parent}"]
    if not a.procs_per_node:
        argv += [f"--procs-per-node={per}"]
    extra = list(a.sbatch_arg)
    clash = slurm.own_line(extra)
    if clash:
        raise ConfigError(clash)
    ask = cuda and not slurm.asks_for_gpus(extra)
    if ask:  # a cluster hides the GPUs a job did not ask for
        extra.insert(0, f"--gpus-per-node={per}")
    cpus = 0
    if a.cores_per_node and not slurm.asks_for_cpus(extra):
        # a job that asks for no CPUs gets one a task where nodes are shared (cons_tres),
        # and its run refuses --cores-per-node past what it has: at least C on each node
        cpus = -(-a.cores_per_node // per)
        extra.insert(0, f"--cpus-per-task={cpus}")
    script = slurm.batch_script(run_dir, argv, n, per, extra)
    job = slurm.submit(run_dir, script)
    if gpus:
        print(
            f"no CUDA device here: checked as if each node had {per} GPU(s), one per rank; "
            "the job finds out"
        )
    if ask:
        print(
            f"asked for {per} GPU(s) per node (#SBATCH --gpus-per-node={per}); a cluster "
            "that wants another form takes --sbatch-arg=--gres=gpu:N instead"
        )
    if cpus:
        print(
            f"asked for {cpus} CPU(s) per rank (#SBATCH --cpus-per-task={cpus}) for "
            f"--cores-per-node {a.cores_per_node}"
        )
    print(f"submitted job {job}: {n} node(s) x {per}; results in {run_dir}")
    print(f"  {program()} status {shlex.quote(str(run_dir))}    scancel {job}")  # as it runs
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    from bench.config import run_dir_named
    from bench.harness import progress, slurm

    path = run_dir_named(a.run_dir) if a.run_dir is not None else _newest_run()
    submitted = (path / "job.id").exists()
    print(slurm.status(path) if submitted else progress.run_status(path))
    return 0


def _newest_run() -> Path:
    """The run folder under the default --out-dir (results/) begun or written last: the one
    `status` with no folder named follows (`make bench`'s, going in another terminal)."""
    out = Path(RunConfig.out_dir)
    runs = [p.parent for p in out.glob("*/config.json")]  # begun: before its first row
    if not runs:
        raise ConfigError(f"no run under {out}/ (in {Path.cwd()}): name a run folder")

    def written(run: Path) -> float:
        """When the run itself last wrote: its config.json and rows, not what a `report`
        or `predict` of it wrote since (summary.csv, predict.csv)"""
        when = 0.0
        for name in ("config.json", "plan.csv", "runs.csv", "steps.csv", "ranks.csv"):
            with contextlib.suppress(OSError):  # not yet written, or removed as it is read
                when = max(when, (run / name).stat().st_mtime)
        return when

    return max(runs, key=written)


def main(argv: Sequence[str] | None = None) -> int:
    from bench.harness.proc import Interrupted, sigterm_as_interrupt

    try:
        # SIGTERM as Ctrl-C in every command, in all its phases (the parser's imports, torch's
        # among them, seconds long; a run's estimate and report, verify's runs and the steps
        # between them): what is left said, exit 130
        with sigterm_as_interrupt():
            parser = build_parser()
            argv = list(sys.argv[1:] if argv is None else argv)
            args = parser.parse_args(argv)
            args.argv = argv
            old = torch_too_old()
            if old:
                print(f"parabench: warning: {old}", file=sys.stderr)
            code = args.func(args)
        sys.stdout.flush()  # here, so a reader gone shows as the error below
        return code
    except ConfigError as exc:
        print(f"parabench: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RunStopped as exc:
        print(f"parabench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        # Ctrl-C where no run is under way; a run (run's, or one of verify's) said its own
        # line, what it kept and how to go on, and a second one here read as another stop
        if not isinstance(exc, Interrupted):
            print("parabench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        from bench.harness.proc import stdout_gone

        if not stdout_gone():
            raise  # another pipe broke (a rank's, a socket): a bug to show, not to hide
        # the reader left (`parabench list | head`): no traceback, and stdout now goes
        # nowhere, so the flush at exit does not raise again; 128 + SIGPIPE, as a shell's
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
