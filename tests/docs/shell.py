"""Shell blocks: their commands, each checked without running it, or run against a prepared home.

A block is a console session when a line starts with ``$ ``: those lines (and their ``\\``
continuations) are commands, the lines after each one its recorded output. Otherwise every line
is a command and ``#`` starts a comment.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[2]
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = ("&&", "||", ";", "|")
# pytest options whose value is the next argument (not a path to collect).
PYTEST_VALUE_OPTIONS = {"-k", "-m", "-p", "-o", "-c", "--timeout", "--durations", "--maxfail", "--rootdir",
                        "--basetemp", "--deselect", "--ignore", "-W"}


@dataclass
class Command:
    text: str  # as written, continuations joined, without the prompt
    line: int  # in the page
    output: list[str] = field(default_factory=list)  # recorded output lines, for a console session

    def simple_commands(self) -> list[tuple[dict[str, str], list[str]]]:
        """(environment assignments, argv) of each command joined by && || ; or |."""
        lexer = shlex.shlex(self.text, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
        out, current = [], []
        for token in tokens + [";"]:
            if token in SEPARATORS:
                if current:
                    env = {}
                    while current and ASSIGNMENT.match(current[0]):
                        name, _, value = current.pop(0).partition("=")
                        env[name] = value
                    out.append((env, current))
                current = []
            else:
                current.append(token)
        return out


def parse_commands(source: str, first_line: int) -> list[Command]:
    """The commands of a block whose first source line is page line ``first_line``."""
    lines = source.splitlines()
    session = any(line.startswith("$ ") for line in lines)
    commands: list[Command] = []
    pending: Command | None = None  # a command whose last line ended with a backslash
    for n, line in enumerate(lines):
        if pending is not None:
            pending.text = pending.text[:-1] + " " + line.strip()
            if not line.rstrip().endswith("\\"):
                pending = None
            continue
        if session and not line.startswith("$ "):
            if commands:
                commands[-1].output.append(line)
            continue
        text = line[2:] if session else line
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        commands.append(Command(text=text.strip(), line=first_line + n))
        if text.rstrip().endswith("\\"):
            pending = commands[-1]
    return commands


def program(argv: list[str]) -> str:
    """The program as a user names it: ``.venv/bin/python`` and ``python3`` are ``python``."""
    name = argv[0].removeprefix(".venv/bin/")
    return "python" if name == "python3" else name


def unwrap(argv: list[str]) -> list[str]:
    """The command that ``timeout``, ``nice``, ``flock`` or ``env`` run."""
    while argv and argv[0] in ("timeout", "nice", "flock", "env"):
        wrapper, rest = argv[0], argv[1:]
        if wrapper == "nice" and rest[:1] == ["-n"]:
            rest = rest[2:]
        while rest and (rest[0].startswith("-") or (wrapper == "env" and ASSIGNMENT.match(rest[0]))):
            rest = rest[1:]
        if wrapper in ("timeout", "flock"):
            rest = rest[1:]  # the duration, the lock file
        argv = rest
    return argv


def check(env: dict[str, str], argv: list[str]) -> None:
    """Raise AssertionError, naming the problem, unless ``argv`` would start as the page says."""
    argv = unwrap(argv)
    if not argv or (argv[0] == "export" and all(ASSIGNMENT.match(a) for a in argv[1:])):
        return  # variable assignments set up the commands after them: nothing of their own to check
    prog = program(argv)
    if prog == "python":
        if len(argv) >= 3 and argv[1] == "-m":
            return check_python_module(argv[2], argv[3:])
        if len(argv) >= 2 and argv[1].endswith(".py"):
            return require_path(argv[1])
        raise AssertionError(f"{shlex.join(argv)!r}: the example tests check 'python -m MODULE' and 'python FILE.py'")
    if prog == "make":
        return check_make_targets(argv[1:])
    if prog == "dagster":
        return check_dagster(argv[1:])
    if prog == "mkdocs":
        from mkdocs.__main__ import cli

        return click_parse(cli, "mkdocs", argv[1:])
    if prog in ("bash", "sh") and len(argv) >= 2:
        return require_path(argv[1])
    raise AssertionError(f"the example tests cannot check the program {argv[0]!r}; if the block needs what a "
                         f"test machine lacks (Docker, a cluster), mark it '<!-- example: external REASON -->'")


def require_path(relative: str) -> None:
    if not (REPO / relative).exists():
        raise AssertionError(f"{relative!r} does not exist in the repository")


def check_python_module(module: str, args: list[str]) -> None:
    if module == "pipelines":
        return check_pipelines_cli(args)
    if module == "pytest":
        return check_pytest_paths(args)
    if module == "dagster":
        return check_dagster(args)
    spec = importlib.util.find_spec(module)
    if spec is None:
        raise AssertionError(f"'python -m {module}': no module {module!r}")
    if spec.submodule_search_locations is not None and importlib.util.find_spec(f"{module}.__main__") is None:
        raise AssertionError(f"'python -m {module}': the package has no __main__ module")


def check_pipelines_cli(args: list[str]) -> None:
    """``python -m pipelines ARGS`` against the CLI's own parser (argparse exits 2 on a mistake)."""
    import contextlib
    import io

    from pipelines.cli.parser import build_parser

    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(args)
    except SystemExit as exc:
        if exc.code:
            raise AssertionError(f"'python -m pipelines {shlex.join(args)}' is refused by the CLI: "
                                 f"{errors.getvalue().strip()}") from None


def check_pytest_paths(args: list[str]) -> None:
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in PYTEST_VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            require_path(arg.split("::", 1)[0])


def check_make_targets(targets: list[str]) -> None:
    text = (REPO / "Makefile").read_text()
    known = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.MULTILINE))
    for target in targets:
        if not target.startswith("-") and "=" not in target and target not in known:
            raise AssertionError(f"'make {target}': the Makefile has no target {target!r}; it has {sorted(known)}")


def click_parse(cli: click.Command, name: str, args: list[str]) -> dict:
    """Parse ``args`` with a click command line as it would run, down to the subcommand, without running it."""
    ctx = click.Context(cli, info_name=name)
    command, rest = cli, list(args)
    try:
        while isinstance(command, click.Group):
            sub, command, rest = command.resolve_command(ctx, rest)
            ctx = click.Context(command, info_name=sub, parent=ctx)
        command.parse_args(ctx, rest)
    except click.ClickException as exc:
        raise AssertionError(f"'{name} {shlex.join(args)}' is refused by {name}: {exc.format_message()}") from None
    return ctx.params


def check_dagster(args: list[str]) -> None:
    """The dagster CLI's own parser; a job named with -m/-a/-j is resolved from its module."""
    from dagster._cli import cli

    params = click_parse(cli, "dagster", args)
    for workspace in params.get("workspace") or ():
        require_path(workspace)
    module, job = params.get("module_name"), params.get("job_name")
    if isinstance(module, str) and job:
        defs = getattr(importlib.import_module(module), params.get("attribute") or "defs")
        defs.resolve_job_def(job)


def normalise(line: str) -> str:
    """A line of output with what differs from run to run masked: times, ids, hashes, paths, numbers."""
    line = re.sub(r"(file|https?)://\S+", "<url>", line)
    line = re.sub(r"\$DAGSTER_HOME\S*|(?<![\w.<])/[\w.\-/]+", "<path>", line)
    line = re.sub(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(\+\d{2}:\d{2}|Z)?|\d{8}T\d{6}Z?", "<time>", line)
    line = re.sub(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", "<id>", line)
    line = re.sub(r"\b[0-9a-f]{7,}\b", "<hex>", line)
    line = re.sub(r"dirty=(True|False)", "dirty=<bool>", line)
    line = re.sub(r"\d[\d,]*(\.\d+)?(e[-+]?\d+)?", "<n>", line)
    if re.fullmatch(r"[-\s]+", line) and "-" in line:
        return "---"
    return " ".join(line.split())


def output_differs(recorded: list[str], actual: list[str]) -> str | None:
    """None when ``actual`` is ``recorded`` with masked values; a line ``...`` in ``recorded``
    stands for any number of lines. Else a diff of the masked lines."""
    want = [normalise(x) for x in recorded]
    got = [normalise(x) for x in actual]
    while want and not want[-1]:
        want.pop()
    while got and not got[-1]:
        got.pop()
    if matches(want, got):
        return None
    import difflib

    return "\n".join(difflib.unified_diff(want, got, "recorded (masked)", "actual (masked)", lineterm="", n=2))


def matches(want: list[str], got: list[str]) -> bool:
    if not want:
        return not got
    if want[0] == "...":
        return any(matches(want[1:], got[i:]) for i in range(len(got) + 1))
    return bool(got) and want[0] == got[0] and matches(want[1:], got[1:])
