"""Docker runs with awkward outputs and paths: a huge sparse file, ':' in a path."""

import dataclasses
import os
import tempfile

from tests.sandbox.conftest import TEST_LIMITS
from wmrl_jax.sandbox import DockerExecutor, Limits, container_io

# The default file size cap (256 MiB) lets the program make the 200 MiB file.
LIMITS = dataclasses.replace(TEST_LIMITS, file_size_bytes=Limits().file_size_bytes)


def test_sparse_file_over_the_cap_is_dropped_alone(docker_available):
    # 200 MiB of holes costs no memory nor disk; only that file is left out.
    with DockerExecutor(docker_available, limits=LIMITS, timeout_s=60) as ex:
        result = ex.run(
            "import os\n"
            "open('output/submission.csv', 'w').write('id,y\\n1,0\\n')\n"
            "open('output/notes.txt', 'w').write('kept')\n"
            "with open('output/big.bin', 'wb') as f:\n"
            "    os.truncate(f.fileno(), 200 << 20)\n"
            "with open('output/holes.bin', 'wb') as f:\n"  # sparse, within the cap: comes back
            "    f.seek(1 << 20)\n"
            "    f.write(b'end')\n"
        )
    assert result.status == "ok", result
    assert result.files["submission.csv"] == b"id,y\n1,0\n"
    assert result.files["notes.txt"] == b"kept"
    assert result.files["holes.bin"] == b"\0" * (1 << 20) + b"end"
    assert "big.bin" not in result.files
    assert result.message == (
        f"output files left out: big.bin (over the {LIMITS.output_bytes} byte output cap)"
    )


def test_paths_holding_a_colon_are_mounted(docker_executor, tmp_path, monkeypatch):
    # The input dir is mounted as it is (world-readable, no links), and the
    # program's own dir lives under a temporary dir whose path holds ':' too.
    task = tmp_path / "task:v2" / "public"
    task.mkdir(parents=True)
    (task / "train.csv").write_text("x\n1\n")
    for path, mode in ((task.parent, 0o755), (task, 0o755), (task / "train.csv", 0o644)):
        os.chmod(path, mode)
    assert container_io.readable_input(task, str(tmp_path)) == os.path.realpath(task)
    scratch = tmp_path / "tmp:dir"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    result = docker_executor.run("print(open('input/train.csv').read(), end='')", input_dir=task)
    assert result.status == "ok", result
    assert result.stdout == "x\n1\n"


def test_an_engine_refusal_is_not_blamed_on_a_missing_engine(docker_executor, monkeypatch):
    import docker

    def refuse(*args, **kwargs):
        raise docker.errors.APIError("invalid mount config", explanation="invalid mount config")

    monkeypatch.setattr(docker.models.containers.ContainerCollection, "create", refuse)
    result = docker_executor.run("print(1)")
    assert result.status == "infra_error", result
    assert result.message.startswith("the Docker engine refused a request during the run")
    assert "invalid mount config" in result.message and "start an engine" not in result.message


def test_a_container_stopped_under_the_program_points_at_the_engine(docker_executor, monkeypatch):
    # An engine shutting down stops the containers first; the next request about the
    # program is then refused (409: not running). That is the engine's failure, not a
    # refusal of the request, and the message says how to get an engine back.
    import docker

    create = docker.api.client.APIClient.exec_create

    def stop_first(api, container, *args, **kwargs):
        api.kill(container)
        api.wait(container)
        return create(api, container, *args, **kwargs)

    monkeypatch.setattr(docker.api.client.APIClient, "exec_create", stop_first)
    result = docker_executor.run("print(1)")
    assert result.status == "infra_error", result
    assert result.message.startswith("Docker engine failed during the run"), result.message
    assert "is not running" in result.message and "start an engine" in result.message


def _lose_tar_output(monkeypatch, times: int) -> list:
    """The engine loses the output of the first `times` output-archive execs (their
    stream comes back empty, as when a short exec ends before it is attached)."""
    import docker

    create, start = docker.api.client.APIClient.exec_create, docker.api.client.APIClient.exec_start
    tar_ids, lost = set(), []

    def record(api, container, cmd, *args, **kwargs):
        out = create(api, container, cmd, *args, **kwargs)
        if cmd[0] == "tar":
            tar_ids.add(out["Id"])
        return out

    def lose(api, exec_id, *args, **kwargs):
        if exec_id in tar_ids and len(lost) < times:
            lost.append(exec_id)
            return iter(())
        return start(api, exec_id, *args, **kwargs)

    monkeypatch.setattr(docker.api.client.APIClient, "exec_create", record)
    monkeypatch.setattr(docker.api.client.APIClient, "exec_start", lose)
    return lost


WRITES_OUTPUT = "open('output/a.txt', 'w').write('kept')\nprint('done')"


def test_a_lost_output_archive_is_read_again(docker_executor, monkeypatch, caplog):
    lost = _lose_tar_output(monkeypatch, times=1)
    result = docker_executor.run(WRITES_OUTPUT)
    assert len(lost) == 1
    assert result.status == "ok", result
    assert result.files == {"a.txt": b"kept"} and result.stdout == "done\n"
    assert "output archive unreadable" in caplog.text


def test_an_output_archive_lost_every_time_is_an_infra_error(docker_executor, monkeypatch):
    from wmrl_jax.sandbox.docker_backend import OUTPUT_READS

    lost = _lose_tar_output(monkeypatch, times=OUTPUT_READS)
    result = docker_executor.run(WRITES_OUTPUT)
    assert len(lost) == OUTPUT_READS
    assert result.status == "infra_error", result
    assert f"unreadable {OUTPUT_READS} times" in result.message, result.message
