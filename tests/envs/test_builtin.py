"""The built-in suite's command: build and noise, what fails a build, the cache and the README."""

import os

import pytest

from wmrl_jax import cache
from wmrl_jax.envs import board_checks, board_structure, builtin
from wmrl_jax.envs.board_checks import BoardCheck, NoiseCheck


def test_cached_suite_is_reused(builtin_suite):
    assert builtin.cached_suite(seed=0) == builtin_suite
    assert os.path.isdir(os.path.join(builtin_suite, "digits"))
    assert builtin_suite.startswith(os.path.join(cache.cache_root(), "builtin"))


def test_cache_root_honours_the_cache_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "mine"))
    assert cache.cache_root() == str(tmp_path / "mine")
    monkeypatch.delenv(cache.CACHE_ENV)
    assert cache.cache_root() == str(tmp_path / "xdg" / "wmrl_jax")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_root() == str(tmp_path / "home" / ".cache" / "wmrl_jax")


def test_cli_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        builtin.main(["build", "--out", str(tmp_path), "--only", "iris,nope"])
    assert e.value.code == 2 and "unknown suite task ids ['nope']" in capsys.readouterr().err
    for argv in (
        ["build", "--out", str(tmp_path), "--workers", "0"],
        ["build"],  # --out is required.
        ["noise", "--resamples", "0"],
        ["noise", "--seeds", "1,x"],
        ["noise", "--readme", str(tmp_path / "absent.md")],
        ["noise", "--docs", str(tmp_path / "absent.md")],
    ):
        with pytest.raises(SystemExit):
            builtin.main(argv)
    with pytest.raises(ValueError, match="unknown suite task"):
        builtin.build(str(tmp_path), only=["nope"])
    with pytest.raises(ValueError, match="workers"):
        builtin.build(str(tmp_path), workers=0)
    assert not os.listdir(tmp_path)  # Nothing written on a bad request.


@pytest.mark.parametrize("failing", [0, 3, 10])
def test_build_exits_0_whatever_share_of_boards_misses_a_check(monkeypatch, capsys, failing):
    # The checks measure which rows small test sets drew: diagnostics, not a gate.
    ids = [f"t{k}" for k in range(10)]
    monkeypatch.setattr(builtin, "build", lambda out, **kw: [os.path.join(out, i) for i in ids])
    monkeypatch.setattr(board_structure, "structural_problems", lambda path: [])

    def check(path):
        name = os.path.basename(path)
        ok = ids.index(name) >= failing
        return BoardCheck(name, 234, 0.0, 0.6 if ok else 0.9, 0.99, "e", True, ok, True)

    monkeypatch.setattr(board_checks, "check_board", check)
    assert builtin.main(["build", "--out", "suite", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    share = (10 - failing) / 10
    assert f"{10 - failing} of 10 sound boards pass all three checks (share {share:.2f};" in out
    assert out.count("miss ") == failing and "0 structurally broken: ok" in out


def test_build_exits_1_on_a_broken_board(monkeypatch, capsys):
    ids = ["t0", "t1", "t2"]
    monkeypatch.setattr(builtin, "build", lambda out, **kw: [os.path.join(out, i) for i in ids])
    broken = lambda path: ["the board lacks the default baseline"] if path.endswith("t1") else []
    monkeypatch.setattr(board_structure, "structural_problems", broken)
    checked = []

    def check(path):
        checked.append(os.path.basename(path))
        return BoardCheck(checked[-1], 234, 0.0, 0.6, 0.99, "e", True, True, True)

    monkeypatch.setattr(board_checks, "check_board", check)
    assert builtin.main(["build", "--out", "suite"]) == 1
    out = capsys.readouterr().out
    assert checked == ["t0", "t2"]  # A broken board is not placed.
    assert "BROKEN t1: the board lacks the default baseline" in out
    assert "2 of 2 sound boards pass" in out and "1 structurally broken: FAIL" in out


def test_noise_cli_writes_the_readme_section(monkeypatch, capsys, tmp_path):
    seen = []

    def fake(only, *, seed, workers, resamples, suite_name):
        seen.append((only, seed, workers, resamples, suite_name))
        passed = seed == 0
        return [
            NoiseCheck("iris", 45, resamples, 0.0, 0.8, 0.9, passed, (0.7, 0.9), (0.6, 1.0),
                       1.0, 0.2, 0.1, 0.05),
        ]  # fmt: skip

    monkeypatch.setattr(board_checks, "check_noise", fake)
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- board-checks:begin -->\nold\n<!-- board-checks:end -->\ntail\n")
    argv = ["noise", "--only", "iris", "--seeds", "0-1", "--resamples", "5"]
    assert builtin.main([*argv, "--readme", str(readme)]) == 0
    assert seen == [(["iris"], 0, 2, 5, "core"), (["iris"], 1, 2, 5, "core")]
    out = capsys.readouterr().out
    assert "seed 0: 1/1 boards pass" in out and "seed 1: 0/1 boards pass" in out
    text = readme.read_text()
    assert "\nold\n" not in text and text.startswith("# x\n") and text.endswith("tail\n")
    assert "| 1 | 0 / 1 | 0.00 | 0.05 | iris |" in text
    assert "`python -m wmrl_jax.envs.builtin noise --only iris --seeds 0-1" in text
    # --docs (the page that holds the section, docs/tasks.md) is the flag's name now.
    page = tmp_path / "tasks.md"
    page.write_text("# x\n<!-- board-checks:begin -->\nold\n<!-- board-checks:end -->\n")
    assert builtin.main([*argv, "--docs", str(page)]) == 0
    assert "| 1 | 0 / 1 | 0.00 | 0.05 | iris |" in page.read_text()
    assert f"--docs {page}`" in page.read_text()
