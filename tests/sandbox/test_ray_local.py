"""LocalRayCluster and RayExecutor's connect, apart from any machine state.

A cluster is started with and without a `~/.ray/auth_token` (HOME points at a
temporary dir): Ray's head switches to token authentication when it finds
that file while a driver given an address does not, so the helper must set
one mode and one token for every node and the driver itself. An address
where nothing listens (a loopback port nobody holds) must fail in seconds,
not after Ray's minutes of retries. Skipped without Ray unless
WMRL_REQUIRE_RAY is set (as in CI).
"""

import os
import secrets
import socket

import pytest

if os.environ.get("WMRL_REQUIRE_RAY"):  # CI: a missing extra is a failure, not a skip
    import ray
else:
    ray = pytest.importorskip("ray", reason='needs the ray extra: pip install -e ".[ray]"')

from wmrl_jax.sandbox import InfraError  # noqa: E402
from wmrl_jax.sandbox.ray_executor import RayExecutor  # noqa: E402
from wmrl_jax.sandbox.ray_local import (  # noqa: E402
    AUTH_VARS,
    HOST,
    LocalRayCluster,
    reload_ray_auth,
)


def unused_loopback_address() -> str:
    """host:port on loopback where nothing listens (bound once, then released)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return f"{HOST}:{s.getsockname()[1]}"


def test_an_address_nobody_listens_on_fails_in_seconds_naming_it(monkeypatch):
    assert not ray.is_initialized()  # else RayExecutor would not connect at all
    address = unused_loopback_address()
    with pytest.raises(InfraError) as raised:
        RayExecutor(address, connect_timeout_s=1.0)
    message = str(raised.value)
    assert f"no Ray cluster answers at {address}" in message and "\n" not in message
    monkeypatch.setenv("RAY_ADDRESS", address)  # the trainer's default: address=None
    with pytest.raises(InfraError, match=f"no Ray cluster answers at {address}"):
        RayExecutor(connect_timeout_s=1.0)
    with pytest.raises(ValueError, match="connect_timeout_s"):
        RayExecutor(address, connect_timeout_s=0)
    assert not ray.is_initialized()


@pytest.mark.parametrize(
    "home_token, workers", [(True, 1), (False, 0)], ids=["home-token", "no-home-token"]
)
def test_cluster_joins_whatever_the_home_dir_holds_and_makes_its_log_dir(
    home_token, workers, tmp_path, monkeypatch
):
    home = tmp_path / "home"
    if home_token:  # what `ray get-auth-token --generate` (or a first ray.init) leaves
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    monkeypatch.setenv("HOME", str(home))
    for key in AUTH_VARS:  # the installed Ray's defaults decide, as for a new user
        monkeypatch.delenv(key, raising=False)
    log_dir = tmp_path / "logs" / "not" / "there"
    with LocalRayCluster(workers=workers, log_dir=str(log_dir)) as cluster:
        assert (log_dir / "head.log").is_file()
        assert len(cluster.alive_nodes()) == 1 + workers  # a worker joins the head too
        assert ray.get(ray.remote(lambda: 6 * 7).options(num_cpus=0).remote()) == 42
        assert cluster.env["RAY_AUTH_MODE"] == os.environ["RAY_AUTH_MODE"] == "token"
        if home_token:  # a driver without the cluster's token: one line saying so
            ray.shutdown()
            monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
            monkeypatch.setenv("RAY_gcs_server_port_wait_time_s", "2")  # Ray's retries
            reload_ray_auth()
            with pytest.raises(InfraError, match="refused this driver's authentication"):
                RayExecutor(cluster.address)
    assert not any(key in os.environ for key in AUTH_VARS)  # the driver's own, back
    assert not ray.is_initialized()
