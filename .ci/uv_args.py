"""Print the `uv pip install` options that make uv read what pip reads on this machine.

`make install` installs with uv (the same pins as pip, from the same places, in a fraction of
pip's time), but uv does not read pip's configuration files or PIP_* variables. Where a machine
points pip at local wheels, extra indexes or a constraints file (as CI machines and corporate
mirrors do), uv must be told the same, or it resolves against PyPI alone and fetches builds
that pip would not (torch's multi-GB CUDA builds, for one). This reads `pip config list`, which
merges the files and the environment in pip's own order, and maps each setting to uv's option.

Run with the interpreter whose pip is configured: `python .ci/uv_args.py`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip's setting -> uv's option; each value may hold several whitespace-separated entries
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
           "find-links": "--find-links", "constraint": "--constraint"}


def pip_settings(listing: str) -> dict[str, list[str]]:
    """``pip config list``'s lines (``global.find-links='/opt/wheels'``, ``:env:.cert='...'``) as
    setting -> values, later lines winning as in pip (the environment comes last)."""
    settings: dict[str, list[str]] = {}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        if not sep:
            continue
        key = name.rsplit(".", 1)[-1]
        if key in OPTIONS:
            settings[key] = shlex.split(value)[0].split() if value.strip() else []
    return settings


def uv_args(settings: dict[str, list[str]]) -> list[str]:
    args = []
    for key, option in OPTIONS.items():
        for value in settings.get(key, ()):
            args += [option, value]
    return args


def main() -> int:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=True).stdout
    print(shlex.join(uv_args(pip_settings(listing))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
