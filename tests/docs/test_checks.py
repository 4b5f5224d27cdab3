"""The example checks themselves refuse what they are there to catch: a page's examples passing
says something only if a wrong one would fail."""

from __future__ import annotations

import pytest
from sybil import Document

from tests.docs.blocks import BlockParser, MarkerError, check_block
from tests.docs.excerpts import check_excerpt, missing_lines
from tests.docs.paths import path_problem
from tests.docs.shell import Command, check, output_differs, parse_commands


def blocks(text: str):
    return [r.parsed for r in BlockParser(evaluate=None)(Document(text, "page.md"))]


def test_markers_are_read_from_the_line_above_the_fence():
    text = "<!-- example: run exit=2 -->\n```\n$ python -m pipelines lineage x\nerror: no\n```\n\n```python\nx = 1\n```\n"
    run, plain = blocks(text)
    assert (run.kind, run.args, run.language) == ("run", "exit=2", "console")  # a $ session without a language
    assert (plain.kind, plain.language, plain.source) == ("default", "python", "x = 1\n")


@pytest.mark.parametrize("text, problem", [
    ("```ruby\nputs 1\n```\n", "no example test knows the language 'ruby'"),
    ("<!-- example: skip -->\n```bash\nls\n```\n", "unknown marker 'example: skip'"),
    ("<!-- example: external -->\n```bash\ndocker ps\n```\n", "needs the reason"),
    ("<!-- example: run -->\n```yaml\na: 1\n```\n", "does not apply to a yaml block"),
])
def test_a_block_the_tests_would_not_check_is_refused(text, problem):
    (block,) = blocks(text)
    with pytest.raises(MarkerError, match=problem):
        check_block(block)


def test_sessions_split_into_commands_and_their_output():
    source = "$ python -m pipelines versions \\\n    digits\nalias  version\n$ make demo\n"
    first, second = parse_commands(source, first_line=10)
    assert (first.text, first.line, first.output) == ("python -m pipelines versions  digits", 10, ["alias  version"])
    assert (second.text, second.output) == ("make demo", [])
    env, argv = Command("DAGSTER_HOME=h .venv/bin/python -m x && make test  # why", 1).simple_commands()[0]
    assert env == {"DAGSTER_HOME": "h"} and argv == [".venv/bin/python", "-m", "x"]


@pytest.mark.parametrize("argv, problem", [
    (["python", "-m", "pipelines", "lineage", "digits", "--versoin", "1"], "refused by the CLI"),
    (["python", "-m", "pipelines", "nosuchcommand"], "refused by the CLI"),
    (["make", "deploy"], "no target 'deploy'"),
    (["python", "-m", "pipelines_nowhere"], "no module"),
    (["python", "-m", "pytest", "tests/no_such_dir"], "does not exist"),
    (["dagster", "job", "execute", "--no-such-option"], "refused by dagster"),
    (["kubectl", "get", "pods"], "cannot check the program 'kubectl'"),
])
def test_a_wrong_command_fails_its_check(argv, problem):
    with pytest.raises(AssertionError, match=problem):
        check({}, argv)


def test_right_commands_pass_their_check():
    check({}, [".venv/bin/python", "-m", "pipelines", "compare", "digits", "1", "2", "--only-differences"])
    check({}, ["timeout", "60", "nice", "-n", "5", "make", "test"])
    check({}, ["export", "LAKEFS_ENDPOINT=http://127.0.0.1:8000"])


def test_an_excerpt_must_match_its_file_in_order():
    text = "def f():\n    a = 1\n\n    return a\n\n\nx = f()\n"
    assert missing_lines("a = 1\n\nreturn a", text) is None  # dedented, as Sybil hands blocks over
    assert missing_lines("def f():\n...\nx = f()", text) is None
    assert "file line 4 is '    return a' where the block has '    return 2'" in missing_lines(
        "def f():\n    a = 1\n\n    return 2", text)
    assert missing_lines("x = f()\n...\ndef f():", text) is not None  # out of order
    with pytest.raises(AssertionError, match="no such file"):
        check_excerpt("x", "pipelines/no_such_module.py", "python")


def test_recorded_output_is_compared_with_values_masked():
    recorded = ["digits v2  (created 2026-12-01T09:17:28+00:00)", "  sha256  5b3a3481b5450ea2b6b777a59f1d872a"]
    assert output_differs(recorded, ["digits v3  (created 2027-01-02T00:00:00+00:00)", "  sha256  0123456789abcdef"]) is None
    assert "+checksum <hex>" in output_differs(recorded, [recorded[0], "  checksum  5b3a3481b5450ea2b6b777a59f1d872a"])
    assert output_differs(["first", "...", "last"], ["first", "a", "b", "last"]) is None
    assert output_differs(["first", "last"], ["first", "a", "last"]) is not None


def test_named_repository_paths_must_exist_unless_git_ignores_them():
    assert path_problem("pipelines/api.py") is None
    assert path_problem("tests/cli/demo_platform.py::shared_demo_platform") is None
    assert "does not exist" in path_problem("pipelines/no_such_file.py")
    assert path_problem("dagster_home/platform/sources") is None  # runtime state
    assert path_problem("models/<model>/aliases/production.json") is None  # a placeholder, no path
