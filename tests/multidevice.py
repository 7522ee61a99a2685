"""Running a check module on several forced host CPU devices, in a fresh process (the
device count is fixed when JAX starts, so it cannot change inside the test process)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_on_host_devices(module: str, *args: str, devices: int = 8, timeout: float = 600):
    """`python -m module *args` on `devices` CPU devices; returns the completed process."""
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_PLATFORMS="cpu",
    )
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip


def assert_ran(proc, marker: str) -> None:
    """The check exited 0 and printed `marker`; else its output tails are the message."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert marker in proc.stdout
