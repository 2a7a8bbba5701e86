"""simtune.threads: the process's CPU thread policy (issue 51 item 1): the cores a process may
use (affinity, cgroup quota), the split between simtune processes, the user's values kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simtune import threads
from simtune.threads import Policy, cgroup_quota, live_sharers, plan, register, usable_cores
from tests.conftest import ROOT


def _cgroup(tmp_path: Path, lines: str, files: dict[str, str]) -> float | None:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "fs").mkdir(exist_ok=True)
    (tmp_path / "cgroup").write_text(lines)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    return cgroup_quota(tmp_path / "cgroup", tmp_path / "fs")


def test_cgroup_v2_quota_is_the_smallest_along_the_path(tmp_path: Path) -> None:
    files = {"cpu.max": "max 100000\n", "user.slice/cpu.max": "300000 100000\n",
             "user.slice/job/cpu.max": "150000 100000\n"}
    assert _cgroup(tmp_path, "0::/user.slice/job\n", files) == 1.5
    files["user.slice/cpu.max"] = "50000 100000\n"  # a parent's tighter quota binds
    assert _cgroup(tmp_path, "0::/user.slice/job\n", files) == 0.5


def test_cgroup_unlimited_or_unreadable_is_none(tmp_path: Path) -> None:
    assert _cgroup(tmp_path, "0::/a\n", {"cpu.max": "max 100000\n", "a/cpu.max": "max 100000\n"}
                   ) is None
    assert _cgroup(tmp_path / "x", "0::/\n", {}) is None  # no cpu.max anywhere
    assert cgroup_quota(tmp_path / "missing", tmp_path) is None


def test_cgroup_v1_quota_over_period(tmp_path: Path) -> None:
    lines = "12:memory:/docker/1\n4:cpu,cpuacct:/docker/1\n"
    files = {"cpu,cpuacct/docker/1/cpu.cfs_quota_us": "200000\n",
             "cpu,cpuacct/docker/1/cpu.cfs_period_us": "100000\n",
             "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}
    assert _cgroup(tmp_path, lines, files) == 2.0
    files["cpu,cpuacct/docker/1/cpu.cfs_quota_us"] = "-1\n"
    assert _cgroup(tmp_path, lines, files) is None


def test_usable_cores_round_a_quota_down_and_keep_one() -> None:
    assert usable_cores(8, None) == 8
    assert usable_cores(8, 2.5) == 2  # a third thread would wait for its time slice
    assert usable_cores(2, 4.0) == 2  # the affinity mask binds
    assert usable_cores(4, 0.5) == 1


def test_plan_splits_the_cores_between_simtune_processes() -> None:
    assert plan({}, 8, 1) == Policy(8, "PASSIVE", 8, 1)
    assert plan({}, 8, 3) == Policy(2, "PASSIVE", 8, 3)  # 8 // 3
    assert plan({}, 2, 4) == Policy(1, "PASSIVE", 2, 4)  # never 0
    assert plan({"OMP_NUM_THREADS": "abc"}, 4, 2).threads == 2  # not a count: ours


def test_plan_keeps_what_the_user_set() -> None:
    env = {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "active"}
    # a wait policy the user gave: no spin count of ours (it would override theirs in libgomp)
    assert plan(env, 8, 4) == Policy(3, "active", 8, 4, ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"),
                                     "")
    assert plan(env, 8, 4).line() == ("threads: 3 (OMP_NUM_THREADS given), "
                                      "OMP_WAIT_POLICY=active (given)")
    assert plan({}, 2, 2).line() == ("threads: 1 (2 usable cores / 2 simtune processes), "
                                     "OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=10000")
    assert plan({"GOMP_SPINCOUNT": "0"}, 2, 1) == Policy(2, "PASSIVE", 2, 1,
                                                         ("GOMP_SPINCOUNT",), "0")


def test_registry_counts_live_processes_only(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    mine = register(folder)
    assert mine is not None and mine.exists()
    (folder / "999999999-1").touch()  # a dead process
    (folder / f"{os.getpid()}-1").touch()  # this PID under another start time: reused
    (folder / "stray").touch()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as child:
        try:
            started = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
            (folder / f"{child.pid}-{started}").touch()
            assert live_sharers(folder) == 2
        finally:
            child.kill()
    child.wait()
    assert live_sharers(folder) == 1
    assert sorted(p.name for p in folder.iterdir()) == [mine.name]  # stale files removed


def test_divide_splits_between_ddp_ranks_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_POLICY", Policy(4, "PASSIVE", 4, 1))
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # torch's threads untouched here
    assert threads.divide(2) == 2 and os.environ["OMP_NUM_THREADS"] == "2"
    assert threads.configure().threads == 2  # the log line says the rank's share
    monkeypatch.setattr(threads, "_POLICY", Policy(3, "PASSIVE", 4, 1, ("OMP_NUM_THREADS",)))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.divide(2) == 3 and os.environ["OMP_NUM_THREADS"] == "3"


# a stage process's start (`import stages`): what torch's OpenMP reads when it loads (that torch
# takes it: bench/threads.py's smoke test, tests/test_bench_smoke.py::test_threads_runs_tiny)
PROBE = ("import json, os, stages; print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), "
         "os.environ.get('OMP_NUM_THREADS'), os.environ.get('GOMP_SPINCOUNT')]))")


def _stage_process(tmp_path: Path, **env: str) -> list:
    """What a stage process runs with (`probe`), on one core (affinity {0})."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                          "PYTEST_XDIST_WORKER_COUNT")}
    run = {**clean, "SIMTUNE_RUNTIME": str(tmp_path / "run"),
           "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", **env}
    code = f"import os; os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}}); {PROBE}"
    proc = subprocess.run([sys.executable, "-c", code], env=run, capture_output=True,
                          text=True, check=True, cwd=ROOT)
    return json.loads(proc.stdout)


def test_a_stage_process_sets_its_policy_before_torch(tmp_path: Path) -> None:
    """On its one core: 1 thread that spins briefly, then sleeps (old code: no variable set,
    torch's default of every core, spinning ~3 ms); the user's values kept (2 threads on the
    one core, as given, and no spin count under their wait policy)."""
    assert _stage_process(tmp_path) == ["PASSIVE", "1", "10000"]
    assert _stage_process(tmp_path, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="ACTIVE") == [
        "ACTIVE", "2", None]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to split")
def test_registered_processes_split_the_cores(tmp_path: Path) -> None:
    """Two cores, this test's process registered beside the child: one thread each."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                          "PYTEST_XDIST_WORKER_COUNT")}
    folder = tmp_path / "run"
    assert register(folder) is not None
    cores = len(os.sched_getaffinity(0))
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          check=True, cwd=ROOT,
                          env={**clean, "SIMTUNE_RUNTIME": str(folder),
                               "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"})
    assert json.loads(proc.stdout) == ["PASSIVE", str(cores // 2), "10000"]


def test_pytest_workers_share_the_cores() -> None:
    """This process (tests/conftest.py): a pytest-xdist worker's share, sleeping waits."""
    import torch

    policy = threads.configure()
    assert torch.get_num_threads() == policy.threads
    assert os.environ["OMP_WAIT_POLICY"] == policy.wait
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in policy.given:
        assert policy.threads == max(1, policy.cores // int(workers))
