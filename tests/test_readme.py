"""The README and the docs pages: short, well-formed markers, every generated section where
its command writes it, and the headlines the study commands write."""

import json
import os
import re
import subprocess
import sys

import pytest

from wmrl_jax import readme

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
_MARKER = re.compile(r"<!-- ([\w-]+):(begin|end) -->")


def _docs() -> list[str]:
    docs = os.path.join(REPO, readme.DOCS_DIR)
    return sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))


def _sections(path: str) -> list[str]:
    """The section names of `path`, in order; fails on a marker out of pair or nested."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    names, open_ = [], None
    for m in _MARKER.finditer(text):
        name, kind = m.groups()
        if kind == "begin":
            assert open_ is None, f"{path}: {name} begins inside {open_}"
            assert name not in names, f"{path}: section {name} twice"
            open_ = name
        else:
            assert open_ == name, f"{path}: {name} ends without its begin (open: {open_})"
            names.append(name)
            open_ = None
    assert open_ is None, f"{path}: {open_} never ends"
    return names


def test_the_readme_is_short():
    with open(README, encoding="utf-8") as f:
        assert len(f.read().splitlines()) < 300


@pytest.mark.parametrize("path", [README, *_docs()], ids=os.path.basename)
def test_markers_are_well_formed(path):
    _sections(path)


def test_well_formed_rejects_broken_markers(tmp_path):
    for text in (
        "<!-- a:begin -->\n<!-- b:begin -->\n<!-- b:end -->\n<!-- a:end -->",
        "<!-- a:begin -->\nx",
        "<!-- a:end -->",
        "<!-- a:begin -->\n<!-- a:end -->\n<!-- a:begin -->\n<!-- a:end -->",
    ):
        path = tmp_path / "x.md"
        path.write_text(text)
        with pytest.raises(AssertionError):
            _sections(str(path))


def test_every_generated_section_is_where_its_command_writes_it():
    head = _sections(README)
    for name in readme.PAGES:
        page = readme.docs_page(README, name)
        assert name in _sections(page), f"{page} lacks section {name}"
        assert name not in head, f"the README holds the full {name} section"
    assert set(head) == {readme.headline_marker(n) for n in readme.HEADLINES}


def test_makefile_targets_write_the_pages_of_their_sections():
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as f:
        lines = [line for line in f if "--readme=" in line or "--docs=" in line]
    pages = {os.path.join(readme.DOCS_DIR, page): name for name, page in readme.PAGES.items()}
    # One command per README headline; others (the real sweep, the paired study) write
    # their section of a page only.
    assert sum("--readme=" in line for line in lines) == len(readme.HEADLINES)
    for line in lines:
        (docs,) = re.findall(r"--docs=(\S+)", line)
        assert docs in pages, line
        for head in re.findall(r"--readme=(\S+)", line):
            assert head == "README.md", line
            # The same page the command derives from --readme when --docs is left out.
            assert readme.report_paths(pages[docs], README, None)[1] == os.path.join(REPO, docs)


def test_report_paths_refuse_a_missing_page(tmp_path):
    (tmp_path / "README.md").write_text("x")
    with pytest.raises(ValueError, match="--docs .*controlled_study.md"):
        readme.report_paths("controlled", str(tmp_path / "README.md"), None)
    with pytest.raises(ValueError, match="--readme"):
        readme.report_paths("study", str(tmp_path / "absent.md"), str(tmp_path / "README.md"))
    assert readme.report_paths("study", None, None) == (None, None)


def test_write_report_writes_the_page_in_full_and_the_readme_headline(tmp_path):
    head, page = tmp_path / "README.md", tmp_path / "docs" / "embodied.md"
    page.parent.mkdir()
    head.write_text("a\n<!-- embodied-headline:begin -->\nold\n<!-- embodied-headline:end -->\n")
    page.write_text("b\n<!-- embodied:begin -->\nold\n<!-- embodied:end -->\nc\n")
    readme.write_report("embodied", "FULL", "HEAD", readme=str(head), docs=None)
    assert head.read_text() == (
        "a\n<!-- embodied-headline:begin -->\nHEAD\n<!-- embodied-headline:end -->\n"
    )
    assert page.read_text() == "b\n<!-- embodied:begin -->\nFULL\n<!-- embodied:end -->\nc\n"
    # A page without the section's markers is named in the error.
    page.write_text("no markers")
    with pytest.raises(ValueError, match="embodied.md: markers <!-- embodied:begin -->"):
        readme.write_report("embodied", "FULL", "HEAD", readme=None, docs=str(page))


def _call(module: str, function: str, *args, **kwargs) -> str:
    """`module.function(*args, **kwargs)` in a fresh interpreter: the entry points define
    absl flags of the same names, which one process cannot import together."""
    code = (
        "import json, sys; from importlib import import_module; "
        f"a, k = json.load(sys.stdin); print(import_module({module!r}).{function}(*a, **k))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps([args, kwargs]), cwd=REPO,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.rstrip("\n")


def _row(final, se, seeds=5, **ratios):
    row = {"heldout_before": 0.380, "heldout_final": final, "heldout_final_se": se}
    row.update(seeds=seeds, heldout_target_above_start=True, ratio_median=None)
    for key, (median, lo, hi, n) in ratios.items():
        row.update({f"{key}_median": median, f"{key}_min": lo, f"{key}_max": hi})
        row[f"{key}_seeds"] = n
    return row


def test_compute_study_headline_from_a_fixture():
    """The README's study headline: the answer sentences of the study section, from the
    numbers of the run in the table (a fixture of the analysis)."""
    analysis = {
        "real": _row(0.488, 0.007, ratio=(1.0, 1.0, 1.0, 5)),
        "anchors_only": _row(0.546, 0.019, ratio=(3.36, 1.03, 3.46, 5)),
        "wmrl": _row(
            0.538, 0.018, ratio=(2.58, 0.84, 3.49, 5), ratio_vs_control=(1.0, 0.75, 1.98, 5)
        ),
        "wmrl_plus": _row(0.554, 0.030, ratio=(2.57, 2.49, 5.04, 5)),
    }
    short = _call("experiments.study_compute", "short_headline", analysis)
    assert short == (
        "**How much less compute does `wmrl` need than `real` to reach `real`'s final held-out "
        "level?** `real` needs **2.58× [0.84, 3.49] (5/5)** the compute of `wmrl` (median "
        "[min, max] over the seeds where both get there). **Does it beat `anchors_only`?** At "
        "the same compute `wmrl` ends level with `anchors_only` on the held-out tasks (0.538 vs "
        "0.546, difference -0.008 ± 0.026); `anchors_only` needs 1.00× [0.75, 1.98] (5/5) the "
        "compute of `wmrl` to reach `real`'s final level. Our aim, ≥ 3× against `real` and a "
        "clear win over `anchors_only`: **not met** on this benchmark. The world model does "
        "not pay for itself on this benchmark: `wmrl` does not end above `anchors_only`, which "
        "executes the same groups and trains on nothing else."
    )
    # Every sentence but the last is the full headline's (the docs page's), word for word.
    full = _call("experiments.study_compute", "headline", analysis)
    assert short.split(" The world model does not")[0] in full
    assert "`wmrl_plus`" in full and "`wmrl_plus`" not in short
    # A clear win over the control drops the sentence that says the world model does not pay.
    analysis["wmrl"]["heldout_final"] = 0.700
    assert "does not pay" not in _call("experiments.study_compute", "short_headline", analysis)


def test_controlled_study_headline_from_a_fixture():
    def row(final, se, executions):
        return {"final_true_reward": final, "final_true_reward_se": se,
                "total_executions": executions}  # fmt: skip

    summary = {
        "real": row(0.938, 0.002, 64000), "anchors_only": row(0.811, 0.001, 6400),
        "wmrl": row(0.837, 0.010, 6400), "wmrl_memory": row(0.930, 0.003, 6400),
        "wmrl_local": row(0.930, 0.003, 6400), "wmrl_plus": row(0.931, 0.003, 6400),
        "wmrl_adaptive": row(0.837, 0.008, 6209),
    }  # fmt: skip
    text = _call(
        "experiments.controlled", "headline", summary, [0.0, 0.05, 0.15, 0.3],
        fraction=0.15, seeds=8, steps=400,
    )  # fmt: skip
    assert text == (
        "At blind-spot fraction 15% (8 seeds, 400 updates per arm) `real` ends at 0.938 ± 0.002 "
        "true reward with 64000 executions per seed; `wmrl` at 0.837 ± 0.010 with 6400, its "
        "control `anchors_only` at 0.811 ± 0.001. Best among the arms executing no more than "
        "`wmrl` (within two standard errors): `wmrl_memory` (0.930 ± 0.003), `wmrl_local` "
        "(0.930 ± 0.003), `wmrl_plus` (0.931 ± 0.003). The tables give every arm and the "
        "sweep over blind-spot fractions 0%, 5%, 15%, 30%."
    )
