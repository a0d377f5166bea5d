"""The watch over the ranks Lightning starts (lwm.train.launcher): a rank that dies is named before rank 0
is ended, and rank 0 first has its grace to end by itself (its own error names the rank too).

Stand-ins: `sleep` processes for rank 0 and the children, a killed one for the rank that died."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

from lwm.train.checkpointing import AtomicModelParallelStrategy
from lwm.train.launcher import NamingLauncher, NamingObserver


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def test_a_dead_rank_is_named_after_the_grace_then_all_are_ended(capfd):
    main, alive, dead = _sleeper(), _sleeper(), _sleeper()
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    try:
        watch = NamingObserver(main_pid=main.pid, children=[alive, dead], poll_s=0.05, grace_s=1.0)
        start = time.monotonic()
        watch.start()
        time.sleep(0.6)
        assert main.poll() is None, "rank 0 was ended inside its grace"
        watch.join(timeout=10)
        assert not watch.is_alive()
        assert 1.0 <= time.monotonic() - start < 9  # the grace, then the kill (slack for a loaded machine)
        assert main.wait(timeout=5) == -signal.SIGKILL and alive.wait(timeout=5) == -signal.SIGKILL
    finally:
        for p in (main, alive):
            p.kill()
    err = capfd.readouterr().err
    assert (
        f"error: rank 0 lost another rank: rank 2 (pid {dead.pid} on {socket.gethostname()}) has died (exit code -9)"
        in err
    )
    assert "rank 1 " not in err  # the one still running is not named


def test_children_that_end_well_end_the_watch_and_nothing_is_killed(capfd):
    main = _sleeper()
    done = [subprocess.Popen(["true"]) for _ in range(2)]
    try:
        watch = NamingObserver(main_pid=main.pid, children=done, poll_s=0.05, grace_s=0.1)
        watch.start()
        watch.join(timeout=5)
        assert not watch.is_alive() and main.poll() is None
    finally:
        main.kill()
    assert "error" not in capfd.readouterr().err


def test_the_run_strategy_launches_with_the_naming_watch():
    strategy = AtomicModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)
    from lightning.fabric.plugins.environments import LightningEnvironment

    strategy.cluster_environment = LightningEnvironment()
    strategy._configure_launcher()
    assert isinstance(strategy.launcher, NamingLauncher)
