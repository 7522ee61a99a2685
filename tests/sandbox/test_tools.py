"""Episode tools (`sandbox.tools`) on both backends: real runs, public facts only."""

from __future__ import annotations

import types

import pytest

from tests.sandbox.conftest import local_executor
from wmrl_jax.envs.task import SubmissionSpec
from wmrl_jax.sandbox.tools import ToolBox, submission_report

GOOD = """import csv, os
with open(os.path.join(os.environ["WMRL_INPUT_DIR"], "test.csv")) as f:
    ids = [r["id"] for r in csv.DictReader(f)]
with open(os.path.join(os.environ["WMRL_OUTPUT_DIR"], "submission.csv"), "w") as f:
    f.write("id,target\\n" + "".join(f"{i},0.5\\n" for i in ids))
print("rows", len(ids))
"""


@pytest.fixture
def task(tmp_path):
    public = tmp_path / "public"
    (public / "images").mkdir(parents=True)
    (public / "train.csv").write_text("id,f0,name,target\n" + "".join(
        f"{i},{i / 10},{'' if i % 4 else 'x'},{i % 2}\n" for i in range(30)))  # fmt: skip
    (public / "test.csv").write_text("id,f0,name\n" + "".join(f"{i},{i},n\n" for i in range(12)))
    (public / "images" / "a.bin").write_bytes(b"\0" * 10)
    spec = SubmissionSpec("submission.csv", "id", ("target",), "target")
    return types.SimpleNamespace(public_dir=str(public), submission=spec)


@pytest.fixture(params=["local", "docker"])
def tools(request):
    if request.param == "local":
        executor = local_executor(timeout_s=30)
    else:
        executor = request.getfixturevalue("docker_executor")
    box = ToolBox(executor, validate_timeout_s=2, validate_rows=4,
                  close_executor=request.param == "local")  # fmt: skip
    yield box
    box.close()


def test_info_describes_the_public_files(tools, task):
    result = tools.call(task, "info").result()
    assert result.status == "ok" and result.seconds > 0
    text = result.text
    assert text.startswith("3 files in the input directory")
    assert "- images/a.bin: 10 bytes" in text and "train.csv: 30 rows, 4 columns" in text
    assert "f0: numeric, 0 missing" in text and "name: text, 22 missing in the first 30" in text
    assert "test.csv: 12 rows, 3 columns" in text and "  0,0.0,x,0" in text


def test_validate_runs_on_the_sample_and_checks_the_submission(tools, task):
    ok = tools.call(task, "validate", GOOD).result()
    assert ok.status == "ok" and "stdout:\nrows 4" in ok.text
    assert "submission: submission.csv, 4 rows, columns id, target" in ok.text
    assert "every expected column" in ok.text and "4 of the sample's 4 test ids present" in ok.text
    crash = tools.call(task, "validate", "import sys\nsys.exit('no model')").result()
    assert crash.status == "error" and "no model" in crash.text and "submission:" not in crash.text
    spin = tools.call(task, "validate", "while True:\n    pass").result()
    assert spin.status == "timeout" and "(budget 2 s)" in spin.text


def test_submission_report_by_hand():
    task = types.SimpleNamespace(
        submission=SubmissionSpec("submission.csv", "id", ("p0", "p1"), "target")
    )
    assert "was not written (output files: other.csv)" in submission_report(
        task, {"other.csv": b"x"}, None
    )
    report = submission_report(task, {"submission.csv": b"id,p0,extra\n1,0.1,z\n9,0.2,z\n"},
                               ["1", "2"])  # fmt: skip
    assert "missing columns: p1" in report and "unexpected columns: extra" in report
    assert "1 of the sample's 2 test ids present" in report
    assert "not a CSV file" in submission_report(task, {"submission.csv": b"\xff\xfe"}, None)


def test_unknown_tool_and_bad_budgets_are_refused(task):
    box = ToolBox(local_executor(timeout_s=5))
    try:
        with pytest.raises(ValueError, match="unknown tool"):
            box.call(task, "shell")
    finally:
        box.close()
    with pytest.raises(ValueError, match="budgets"):
        ToolBox(None, info_timeout_s=0)


def test_a_file_name_that_is_not_utf8_is_escaped_text(tools, task):
    """The sandbox returns such a name with a lone surrogate; the answer escapes it."""
    program = """import os
out = os.fsencode(os.environ["WMRL_OUTPUT_DIR"])
open(os.path.join(out, b"pred\\xff.csv"), "w").close()
"""
    answer = tools.call(task, "validate", program).result()
    assert answer.status == "ok"
    assert "was not written (output files: pred\\xff.csv)" in answer.text
    answer.text.encode("utf-8")  # valid text: a tokenizer takes it
