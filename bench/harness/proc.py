"""Process hygiene: free ports, parent-death signals, and killing a cell's whole tree.

Each (strategy, world size, repeat) runs as its own process tree in its own session.
The harness records every descendant while the cell runs and kills them all when it
ends, times out or is interrupted; it also makes itself a child subreaper, so a
launcher's grandchildren that detach (daemonise) are reparented to the harness and
can still be found. Ranks ask the kernel to kill them if their parent dies, so a
harness killed with SIGKILL leaves no orphans training on.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.config import first_line, one_line  # noqa: F401 (the harness says proc.one_line)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value, 0, 0, 0)


#: the pid of the harness running a cell on this machine, in its processes' environment
HARNESS_VAR = "PARABENCH_HARNESS"


def die_with_parent(harness: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies. A parent already gone
    when it asks sends nothing: a rank whose launcher was killed with its harness while the
    rank's interpreter started was left running (mp.spawn's trained on into the dead run's
    cell folder). So a process of a cell whose harness (`harness`, else $PARABENCH_HARNESS)
    is no longer among its ancestors kills itself, as the signal would have: a death after
    the request signals it, one before it shows here."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    harness = harness or int(os.environ.get(HARNESS_VAR) or 0)
    if harness and not descends_from(harness):
        os.kill(os.getpid(), signal.SIGKILL)


def dies_with_this() -> Callable[[], None]:
    """For a child about to start (a Popen's preexec_fn, a pool's initializer): it dies with
    this process, named by pid, so a death between the fork and the child's request shows."""
    return functools.partial(die_with_parent, os.getpid())


@contextlib.contextmanager
def stops_after_fork() -> Iterator[None]:
    """Ctrl-C and SIGTERM noted while a process forks (a Popen with a preexec_fn): their
    handlers, run there, ran inside the fork's own hooks (logging's lock), which drop what
    they raise, and the run went on as if never stopped. Those noted are raised as the block
    ends, by their own handlers, once the process is there to kill (the caller's, or the
    handler's, to do). (Handlers are the main thread's alone to set.)"""
    with stops_held():
        yield


@contextlib.contextmanager
def _stops_to(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Ctrl-C and SIGTERM go to `handler` inside the block, and to their own handlers again
    after it. (Handlers are the main thread's alone to set: elsewhere the block runs as is.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, previous in old.items():
            signal.signal(s, previous)


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM heard inside wait until the block ends (a cell's rows written, the
    report's files put in place), then stop as they would have, by their own handlers. Noted
    by handlers, not masked: a signal mask is one thread's, and torch's worker threads (any
    process that ran a torch op has them) took the signal unmasked, so the interpreter
    raised it in the main thread inside the block all the same."""
    heard: list[int] = []
    try:
        with _stops_to(lambda signum, frame: heard.append(signum)):
            yield
    finally:
        for signum in heard:
            signal.raise_signal(signum)


@contextlib.contextmanager
def stops_ignored() -> Iterator[None]:
    """Ctrl-C and SIGTERM heard while a stop already under way kills its processes and says
    how to go on: a second Ctrl-C there cut that short (ranks left to their grace, the line
    with the `--resume` command never said). The stop is what they ask for; it goes on to
    its end."""
    with _stops_to(lambda signum, frame: None):
        yield


def descends_from(pid: int) -> bool:
    """Whether `pid` is this process's parent, or its parent's, and so on up to init (the
    harness itself where it is pid 1, a container's entry point). Where the system cannot
    say (no process table to read), as yes: a process is killed only where its harness is
    known to be gone."""
    try:
        return pid == os.getppid() or any(p.pid == pid for p in psutil.Process().parents())
    except psutil.Error:
        return True


def raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM that stopped a run which has said, in its own line, what it kept
    and how to go on: the command ends with exit 130 and no second line of its own."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (kill, a job cancelled) raises KeyboardInterrupt inside, as Ctrl-C does: the
    command says what it leaves and exits 130, where SIGTERM's default ended it silently
    (143) with no word of what was kept or how to go on; restored after."""
    old = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def become_subreaper(on: bool = True) -> None:
    _prctl(_PR_SET_CHILD_SUBREAPER, int(on))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stdout_gone() -> bool:
    """Whether stdout is a pipe or socket nobody reads any more (`parabench ... | head`
    after head left): poll says POLLERR or POLLHUP for it. False where stdout has no file
    descriptor or the platform has no poll."""
    import select
    import sys

    poll = getattr(select, "poll", None)
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    if poll is None:
        return False
    poller = poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


#: what an allocation that failed says beside torch's OutOfMemoryError and MemoryError: CUDA's
#: and the CPU allocator's words, and cuBLAS's and cuDNN's (`CUBLAS_STATUS_ALLOC_FAILED when
#: calling cublasCreate(handle)`): their handles and workspaces are allocated outside torch's
#: allocator, and on a full GPU are often the first allocation to fail
_OOM_WORDS = ("out of memory", "can't allocate memory", "_status_alloc_failed")


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    oom_type = getattr(__import__("torch"), "OutOfMemoryError", ())
    if oom_type and isinstance(exc, oom_type):
        return True
    text = str(exc).lower()
    return any(words in text for words in _OOM_WORDS)


def oom_kill_count() -> int | None:
    """Processes the kernel's OOM killer has killed since boot, any cgroup's or the whole
    machine's OOM (/proc/vmstat `oom_kill`, Linux 4.13+, readable by anyone), or None."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


#: how the kernel logs each OOM kill, the machine's or a memory cgroup's, on every Linux
_OOM_KILLED = re.compile(r"Killed process (\d+) \(")


@dataclass(frozen=True)
class OomKills:
    """What the kernel says of its OOM killer over a cell's run: whether it killed one of
    the cell's processes (`pids`) is known for sure only from its log, which names each
    process it kills; that log is root's alone where kernel.dmesg_restrict is 1 (most
    distributions). Its count of kills tells less: none on the machine, not the OOM
    killer; some, maybe."""

    pids: frozenset[int] = frozenset()
    #: kills on this machine over the cell (None: not counted here)
    count: int | None = None
    #: the kernel log's lines of those kills
    log: tuple[str, ...] = ()
    #: whether `log` is all of them (not where the log cannot be read here, or lost lines)
    whole: bool = False

    def of(self, pids: Iterable[int] = ()) -> str | None:
        """The kernel's line for a kill of one of the cell's processes (or of `pids`), cut
        before its memory figures, or None."""
        mine = self.pids | set(pids)
        for line in self.log:
            found = _OOM_KILLED.search(line)
            if found and int(found[1]) in mine:
                return line.split(" total-vm:")[0].rstrip(",")
        return None

    def otherwise(self) -> str:
        """What is known where the log names none of the cell's processes."""
        if self.whole:
            return "not the kernel's OOM killer: its log names no process of the cell"
        if self.count == 0:
            return (
                "not the kernel's OOM killer: it killed no process on this machine while "
                "the cell ran (/proc/vmstat oom_kill)"
            )
        if self.count:
            return (
                f"the kernel's OOM killer killed {self.count} process(es) on this machine "
                "while the cell ran (/proc/vmstat oom_kill); whether one of the cell's, only "
                "the kernel's log says (dmesg: root's alone where kernel.dmesg_restrict is 1)"
            )
        return "the kernel's OOM killer? this machine does not say"


class OomWatch:
    """Started before a cell, `stop` after it: the kernel's OOM kills in between
    (OomKills). The log is /dev/kmsg, read from where it stood at the start."""

    def __init__(self) -> None:
        self.count = oom_kill_count()
        self.fd: int | None = None
        with contextlib.suppress(OSError):
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
            try:
                os.lseek(fd, 0, os.SEEK_END)  # its lines from now on: no earlier pid's
            except OSError:
                os.close(fd)
                raise
            self.fd = fd

    def close(self) -> None:
        """Let go of the log unread (a cell that never started); stop does it itself."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def stop(self, pids: Iterable[int] = ()) -> OomKills:
        now = oom_kill_count()
        count = None if now is None or self.count is None else now - self.count
        log: list[str] = []
        whole = self.fd is not None
        while self.fd is not None:  # one record a read: "prio,seq,usec,flags;message\n..."
            try:
                record = os.read(self.fd, 8192).decode(errors="replace")
            except BrokenPipeError:  # lines overwritten before they were read
                whole = False
                continue
            except OSError:  # EAGAIN: read to its end
                record = ""
            if not record:  # its end (or a file, /dev/null, standing in for the log)
                self.close()
                break
            # a record's message follows its header's ';'; its dictionary's lines start
            # with a space (one record a read from /dev/kmsg, a file gives several)
            for line in record.split("\n"):
                message = line.partition(";")[2]
                if not line.startswith(" ") and _OOM_KILLED.search(message):
                    log.append(message)
        return OomKills(frozenset(pids), count, tuple(log), whole)


def signal_group(pid: int, sig: int) -> None:
    """Send `sig` to the process group `pid` leads (its session's processes), if any is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class CellProcess:
    """One launched cell: a process in a new session plus every descendant seen."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, marker: str) -> None:
        self.marker = marker  # PARABENCH_CELL value: finds reparented orphans
        self._seen: dict[int, psutil.Process] = {}
        started = False
        try:
            with stops_after_fork(), open(log, "ab") as out:
                self.popen = subprocess.Popen(
                    argv,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=dies_with_this(),
                )
                started = True
        except BaseException:  # a stop heard as it forked: none of the cell runs on
            if started:
                self.kill()
            raise

    def _track(self) -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.popen.pid)
            for p in [root, *root.children(recursive=True)]:
                self._seen.setdefault(p.pid, p)
        # Orphans of this cell reparented to us (we are a subreaper).
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process().children(recursive=True):
                if p.pid not in self._seen and self._belongs(p):
                    self._seen[p.pid] = p

    def _belongs(self, p: psutil.Process) -> bool:
        try:
            return p.environ().get("PARABENCH_CELL") == self.marker
        except psutil.Error:
            return False

    def wait(
        self, timeout_s: float, poll_s: float = 0.2, on_poll: Callable[[], None] | None = None
    ) -> tuple[int | None, bool]:
        """(returncode, timed_out). A cell past its deadline is killed. `on_poll` is called
        on every poll (the progress display)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._track()
            if on_poll is not None:
                on_poll()
            rc = self.popen.poll()
            if rc is not None:
                return rc, False
            if time.monotonic() > deadline:
                self.kill()
                return self.popen.poll(), True
            time.sleep(poll_s)

    def alive(self) -> list[psutil.Process]:
        out = []
        for pid, p in self._seen.items():
            if pid != self.popen.pid:
                # Orphans reparented to us become our zombies: reap exactly those pids.
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
            with contextlib.suppress(psutil.Error):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    def kill(self, grace_s: float = 3.0) -> None:
        """SIGTERM the session, then SIGKILL whatever of the tree is still there."""
        self._track()
        signal_group(self.popen.pid, signal.SIGTERM)
        for p in self.alive():
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, still = psutil.wait_procs(self.alive(), timeout=grace_s)
        signal_group(self.popen.pid, signal.SIGKILL)
        for p in still:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(self.alive(), timeout=grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)

    @property
    def pids(self) -> frozenset[int]:
        """Every process of the cell seen while it ran."""
        return frozenset(self._seen)

    def reap(self) -> None:
        """After a normal exit: anything of the tree still running is killed."""
        self._track()
        if self.alive():
            self.kill(grace_s=1.0)
