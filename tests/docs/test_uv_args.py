"""make install's uv reads what pip reads: .ci/uv_args.py's mapping of ``pip config list``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("uv_args", REPO / ".ci" / "uv_args.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pip_settings_become_uv_options():
    m = _module()
    listing = "\n".join([
        "global.cert='/etc/ssl/certs/ca-certificates.crt'",  # uv reads SSL_CERT_FILE itself
        "global.constraint='/etc/xdg/pip/constraints.txt'",
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
        "global.find-links='/opt/old'",
        ":env:.find-links='/opt/wheels'",  # the environment comes last and wins, as in pip
        ":env:.default-timeout='180'",
    ])
    assert m.uv_args(m.pip_settings(listing)) == [
        "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple",
        "--find-links", "/opt/wheels", "--constraint", "/etc/xdg/pip/constraints.txt"]


def test_no_pip_configuration_means_no_options():
    m = _module()
    assert m.uv_args(m.pip_settings("")) == []


def test_it_reads_this_interpreters_pip(tmp_path):
    """Against pip itself: a config file named by PIP_CONFIG_FILE reaches the options."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nfind-links = /nowhere/wheels\n")
    out = subprocess.run([sys.executable, str(REPO / ".ci" / "uv_args.py")], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": str(conf),
                                          "HOME": str(tmp_path)}).stdout
    assert "--find-links /nowhere/wheels" in out
