"""The built-in offline suite with its synthetic leaderboards: the one command.

    python -m wmrl_jax.envs.builtin build --out DIR [--seed 0] [--workers 2] [--only ID,ID]
        [--suite core]
    python -m wmrl_jax.envs.builtin noise [--seeds 0,1] [--workers 2] [--only ID,ID]
        [--suite core] [--resamples 200] [--docs docs/tasks.md]

Each task (`suite`) gets a board of a few hundred competitors (`ladder`):
single models really fitted in parallel worker processes and scored on the
private answers, then tuned ensembles built from the candidates' out-of-fold
predictions on the training data only (`boards`, `ensembles`). Every file is
byte-identical across builds of one seed except `private/fit_predict_seconds.csv`
(wall-clock fit-and-predict seconds per entry). `build` prints `check_board`
for every task and the share of boards passing all three checks (diagnostics:
on small test sets they measure which rows the split drew), and exits 1 only
on a structural failure (`board_structure.structural_problems`). `noise`
refits the boards in memory and reports each board's bootstrap share
(`board_checks.check_noise`); with `--docs` (formerly `--readme`) it rewrites
the `board-checks` section of that page (docs/tasks.md).

Example:
    >>> root = cached_suite(seed=0)                             # doctest: +SKIP
    >>> board_checks.check_board(f"{root}/iris").passed         # doctest: +SKIP
    True
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Sequence

import numpy as np
import sklearn

from wmrl_jax import cache, readme
from wmrl_jax.envs import (
    board_checks,
    board_structure,
    boards,
    ensembles,
    families,
    ladder,
    metrics,
    report,
    suite,
)
from wmrl_jax.envs import task as task_lib

README_SECTION = "board-checks"


def build(
    out_dir: str,
    *,
    seed: int = 0,
    workers: int = 2,
    only: Sequence[str] | None = None,
    suite_name: str = "core",
) -> list[str]:
    """Writes the suite (or the tasks in `only`) with leaderboards; returns task dirs.

    Args:
        out_dir: created if absent; existing built-in task dirs are replaced.
        seed: suite seed; the same seed gives byte-identical files except the
            seconds file.
        workers: worker processes fitting the competitors.
        only: task ids to build (suite order kept); unknown ids raise ValueError.
        suite_name: one of `suite.SUITES`.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    specs = suite.select_specs(only, name=suite_name)
    os.makedirs(out_dir, exist_ok=True)
    written = {s.id: suite.write_task(s, out_dir, seed=seed)[0] for s in specs}
    fitted = boards.fit_boards(specs, seed=seed, workers=workers)
    for spec in specs:
        boards.write_board(written[spec.id], spec.id, seed, fitted[spec.id])
    return [written[s.id] for s in specs]


def _source_key(seed: int) -> str:
    """What decides a built suite's files: the seed, library versions, generator sources."""
    h = hashlib.sha256(f"seed={seed};sklearn={sklearn.__version__};np={np.__version__}".encode())
    modules = (
        sys.modules[__name__], boards, ensembles, families, suite, ladder, metrics, report,
        task_lib,
    )  # fmt: skip
    for module in modules:
        with open(module.__file__, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def cached_suite(seed: int = 0, *, workers: int = 2, suite_name: str = "core") -> str:
    """Suite `suite_name` for `seed`, built once per generator source; returns its dir.

    The suite lives under `cache.cache_root()/builtin`; the key hashes the
    generator's source files, the seed and the scikit-learn / numpy versions.
    A file lock makes concurrent callers (test workers) build once; the build
    goes to a temporary dir renamed into place.
    """
    root = os.path.join(cache.cache_root(), "builtin")
    os.makedirs(root, exist_ok=True)
    if suite_name not in suite.SUITES:
        raise ValueError(f"unknown suite {suite_name!r}; choose from {suite.SUITES}")
    tag = "" if suite_name == "core" else f"-{suite_name}"
    final = os.path.join(root, f"{_source_key(seed)}-seed{seed}{tag}")
    with open(final + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(final):
            tmp = f"{final}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp, seed=seed, workers=workers, suite_name=suite_name)
            os.rename(tmp, final)
    return final


def _seeds(text: str) -> list[int]:
    """'0,1,2' or '0-5' -> sorted unique seeds; ValueError otherwise."""
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.strip().isdigit() or (hi and not hi.strip().isdigit()):
            raise ValueError(f"--seeds takes non-negative integers like 0,1,2 or 0-5, got {text!r}")
        out.update(range(int(lo), int(hi or lo) + 1))
    if not out:
        raise ValueError(f"--seeds names no seed: {text!r}")
    return sorted(out)


def _noise(args, only, argv_text: str) -> int:
    """Runs `check_noise` for each seed; with --docs, rewrites the section after each seed
    (a long run that is stopped leaves the seeds it finished)."""
    per_seed = {}
    for seed in args.seeds:
        start = time.perf_counter()
        checks = board_checks.check_noise(
            only, seed=seed, workers=args.workers, resamples=args.resamples, suite_name=args.suite
        )
        per_seed[seed] = checks
        for check in checks:
            print(check.line())
        passed = sum(c.passed for c in checks)
        print(
            f"seed {seed}: {passed}/{len(checks)} boards pass all three checks on their test rows"
            f" (share {passed / len(checks):.2f}); mean "
            f"bootstrap share {np.mean([c.p_all for c in checks]):.2f} over {args.resamples} "
            f"draws; {time.perf_counter() - start:.1f} s",
            flush=True,
        )
        if args.docs:
            body = board_checks.shares_markdown(per_seed, command=argv_text)
            readme.write_section(args.docs, README_SECTION, body)
            print(f"wrote the {README_SECTION} section of {args.docs}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="write the suite with its leaderboards and check them")
    cmd.add_argument("--out", required=True, help="output directory")
    cmd.add_argument("--seed", type=int, default=0)
    noise = sub.add_parser(
        "noise", help="refit the boards in memory and bootstrap their test rows (no files)"
    )
    noise.add_argument("--seeds", default="0", help="suite seeds: 0,1,2 or 0-5")
    noise.add_argument("--resamples", type=int, default=200, help="bootstrap draws per board")
    noise.add_argument(
        "--docs",
        "--readme",
        dest="docs",
        default=None,
        help=f"rewrite this page's {README_SECTION} section (docs/tasks.md)",
    )
    for p in (cmd, noise):
        p.add_argument("--suite", default="core", choices=suite.SUITES, help="which suite")
        p.add_argument("--workers", type=int, default=2, help="worker processes")
        p.add_argument("--only", default=None, help="comma-separated task ids")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    try:
        suite.select_specs(only, name=args.suite)
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        if args.command == "noise":
            args.seeds = _seeds(args.seeds)
            if args.resamples < 1:
                raise ValueError(f"--resamples must be >= 1, got {args.resamples}")
            if args.docs and not os.path.isfile(args.docs):
                raise ValueError(f"--docs {args.docs} is not a file")
    except ValueError as e:
        parser.error(str(e))
    if args.command == "noise":
        words = ["python -m wmrl_jax.envs.builtin", *(argv if argv is not None else sys.argv[1:])]
        return _noise(args, only, " ".join(words))
    start = time.perf_counter()
    paths = build(args.out, seed=args.seed, workers=args.workers, only=only, suite_name=args.suite)
    return _report(paths, start)


def _report(paths: Sequence[str], start: float) -> int:
    """Prints every board's checks and structural failures; 1 when any board is broken."""
    broken = {path: board_structure.structural_problems(path) for path in paths}
    checks = [board_checks.check_board(path) for path in paths if not broken[path]]
    for check in checks:
        print(check.line())
    for path, problems in broken.items():
        for problem in problems:
            print(f"BROKEN {os.path.basename(path)}: {problem}")
    n_broken = sum(bool(p) for p in broken.values())
    share = board_checks.passing_share(checks) if checks else 0.0
    print(
        f"{len(paths)} tasks in {time.perf_counter() - start:.1f} s; "
        f"{sum(c.passed for c in checks)} of {len(checks)} sound boards pass all three checks "
        f"(share {share:.2f}; diagnostics, not a gate); {n_broken} structurally broken: "
        f"{'FAIL' if n_broken else 'ok'}"
    )
    return 1 if n_broken else 0


if __name__ == "__main__":
    sys.exit(main())
