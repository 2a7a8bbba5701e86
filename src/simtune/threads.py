"""The process's CPU thread policy, set once at start: OpenMP threads that spin only briefly
when idle, as many as the cores this process may use, split between the simtune processes
sharing them.

torch's OpenMP runtime (libgomp) spins its idle threads for ~3 ms by default: beside any other
work (a second `dvc exp run` of `dvc queue start -j 2`, pytest-xdist's workers, a browser) a
top-2 training step then took 6.9 s of wall and 1.80 s of CPU on 2 cores at load ~6.7, against
3.5 s and 0.76 s with `OMP_WAIT_POLICY=PASSIVE` (issue 51). Passive waits cost ~17 % on a quiet
machine (each parallel region wakes sleeping threads); a spin of 10,000 rounds (~0.1 ms,
`GOMP_SPINCOUNT`) bridges the gaps between one op's regions and yields before it steals a busy
machine's time: within ~5 % of the default quiet, as fast as passive waits at load 4
(`bench/threads.py` measures it). libgomp reads its settings once, when torch loads it, so
`configure` must run before `import torch`: `stages/__init__.py` calls it first thing
(`python -m stages`, the `simtune` console script, DVC's stage commands and Lightning's DDP
ranks, which re-run the command), tests/conftest.py for pytest's processes; a library user
calls it before importing torch.

The policy (`plan`, a pure function of its inputs):
- the wait policy: PASSIVE (for every OpenMP runtime: LLVM's and Intel's sleep at once) with
  `GOMP_SPINCOUNT=10000` (libgomp, torch's on Linux: the brief spin, which an explicit count
  sets whatever the wait policy);
- the threads: the cores this process may use (its affinity mask, rounded down to a cgroup's
  `cpu.max` quota: a thread beyond the quota waits for its time slice), divided by the simtune
  processes sharing them: pytest-xdist's workers (`PYTEST_XDIST_WORKER_COUNT`), else the live
  simtune processes registered in the runtime folder (`$SIMTUNE_RUNTIME`, default
  `$XDG_RUNTIME_DIR/simtune` or `<tmp>/simtune-<uid>`; one file per PID, removed at exit, a dead
  process's ignored), at least 1;
- a value the user set (`OMP_WAIT_POLICY`, `OMP_NUM_THREADS`, `GOMP_SPINCOUNT`) is kept as
  given, and a wait policy the user gave gets no spin count of ours.

All go into the environment (so child processes inherit this process's share) and, when torch
is already loaded, the threads into `torch.set_num_threads`. Lightweight: imports neither torch
nor numpy.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

log = logging.getLogger(__name__)

WAIT, THREADS, SPIN = "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT"
SPIN_ROUNDS = "10000"  # ~0.1 ms (libgomp's own estimate: 100,000 rounds a ms)
XDIST_WORKERS = "PYTEST_XDIST_WORKER_COUNT"
RUNTIME = "SIMTUNE_RUNTIME"
PASSIVE = "PASSIVE"


@dataclass(frozen=True)
class Policy:
    """What `configure` set: `threads` OpenMP threads under `wait`, spinning `spin` rounds
    before they sleep ("": the runtime's own); `cores` usable, shared by `sharers` simtune
    processes; `given`: the variables the user had set (kept)."""

    threads: int
    wait: str
    cores: int
    sharers: int
    given: tuple[str, ...] = ()
    spin: str = SPIN_ROUNDS

    def line(self) -> str:
        """The policy in one log line."""
        why = (f"{THREADS} given" if THREADS in self.given
               else f"{self.cores} usable cores / {self.sharers} simtune processes")
        wait = f"{WAIT}={self.wait}" + (" (given)" if WAIT in self.given else "")
        spin = (f", {SPIN}={self.spin}" + (" (given)" if SPIN in self.given else "")
                if self.spin else "")
        return f"threads: {self.threads} ({why}), {wait}{spin}"


def cgroup_quota(proc_cgroup: Path = Path("/proc/self/cgroup"),
                 root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """Cores the process's cgroup grants (quota / period), the smallest along its path up to
    the root; None when unlimited or unknown. cgroup v2 (`cpu.max`: "max 100000" or
    "150000 100000") and v1 (`cpu.cfs_quota_us`, -1: unlimited, over `cpu.cfs_period_us`)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2, the unified hierarchy
            base, files = root, ("cpu.max",)
        elif "cpu" in controllers.split(","):
            base, files = root / controllers, ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        here = base / path.lstrip("/")
        for folder in (here, *here.parents):
            quota = _quota(folder, files)
            if quota is not None:
                quotas.append(quota)
            if folder == base:
                break
    return min(quotas) if quotas else None


def _quota(folder: Path, files: tuple[str, ...]) -> float | None:
    try:
        values = [(folder / f).read_text().split() for f in files]
    except OSError:
        return None
    if len(files) == 1:  # v2: "<quota|max> <period>"
        quota, period = values[0][0], values[0][1]
    else:
        quota, period = values[0][0], values[1][0]
    if quota in ("max", "-1") or float(period) <= 0:
        return None
    return float(quota) / float(period)


def usable_cores(affinity: int, quota: float | None) -> int:
    """Cores to run on: the affinity mask's, at most the quota rounded down, at least 1."""
    return max(1, min(affinity, math.floor(quota)) if quota is not None else affinity)


def plan(env: dict[str, str] | os._Environ[str], cores: int, sharers: int) -> Policy:
    """The policy for a process that may use `cores` shared with `sharers` simtune processes
    (itself included) under environment `env`: a user's `OMP_NUM_THREADS` (a positive integer),
    `OMP_WAIT_POLICY` and `GOMP_SPINCOUNT` kept, else cores // sharers threads (at least 1),
    PASSIVE and a spin of `SPIN_ROUNDS` (none of ours under a wait policy the user gave)."""
    given = []
    threads = max(1, cores // max(1, sharers))
    raw = env.get(THREADS, "").strip()
    if raw.isdigit() and int(raw) > 0:
        threads = int(raw)
        given.append(THREADS)
    wait = env.get(WAIT, "").strip()
    if wait:
        given.append(WAIT)
    spin = env.get(SPIN, "").strip()
    if spin:
        given.append(SPIN)
    else:
        spin = "" if wait else SPIN_ROUNDS
    return Policy(threads, wait or PASSIVE, cores, sharers, tuple(given), spin)


def runtime_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """Where live simtune processes register (one empty file per PID)."""
    if env.get(RUNTIME):
        return Path(env[RUNTIME])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "simtune"
    return Path(tempfile.gettempdir()) / f"simtune-{os.getuid()}"


def _started(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), None when it is gone: a file whose
    PID was reused by another process does not count."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def live_sharers(folder: Path) -> int:
    """Registered processes still running (their start time matches), stale files removed."""
    live = 0
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            pid, _, started = entry.name.partition("-")
            if pid.isdigit() and started and _started(int(pid)) == started:
                live += 1
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()
    return live


def register(folder: Path) -> Path | None:
    """This process's file in `folder`, removed at exit; None where the folder is unwritable
    (the split then counts this process alone)."""
    started = _started(os.getpid())
    if started is None:
        return None
    path = folder / f"{os.getpid()}-{started}"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.touch()
    except OSError:
        return None
    atexit.register(lambda: path.unlink(missing_ok=True))
    return path


_POLICY: Policy | None = None


def configure() -> Policy:
    """Set this process's policy, once (later calls return the first): into the environment,
    for torch's OpenMP runtime when it loads and for child processes, and into torch when it
    is already loaded (its wait policy then stays what it was: call this before torch)."""
    global _POLICY
    if _POLICY is not None:
        return _POLICY
    cores = usable_cores(len(os.sched_getaffinity(0)), cgroup_quota())
    folder = runtime_dir()
    register(folder)
    workers = os.environ.get(XDIST_WORKERS, "")
    sharers = int(workers) if workers.isdigit() and int(workers) > 0 else live_sharers(folder)
    _POLICY = plan(os.environ, cores, max(1, sharers))
    os.environ[THREADS] = str(_POLICY.threads)
    os.environ[WAIT] = _POLICY.wait
    if _POLICY.spin:
        os.environ[SPIN] = _POLICY.spin
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(_POLICY.threads)
    return _POLICY


_ANNOUNCED = False


def announce() -> None:
    """Log the policy in one line (INFO), once a process, where work starts."""
    global _ANNOUNCED
    if not _ANNOUNCED:
        _ANNOUNCED = True
        log.info(configure().line())


def divide(processes: int) -> int:
    """This process's threads split between the `processes` it becomes (CPU DDP ranks, itself
    included, which inherit the environment), unless the user gave `OMP_NUM_THREADS`: each
    rank is a process of its own. Returns the threads each gets."""
    global _POLICY
    policy = configure()
    if THREADS in policy.given or processes <= 1:
        return policy.threads
    each = max(1, policy.threads // processes)
    _POLICY = replace(policy, threads=each)
    os.environ[THREADS] = str(each)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(each)
    return each
