"""Run a command inside a built image's root file system, as its pod would: the image's own
environment under the container's, its working directory, a user id, and host folders mounted
where the pod mounts its volumes.

No container runtime works in this sandbox (``podman run`` cannot set rlimits), so the image is
mounted with ``buildah mount`` and the command runs under ``chroot --userspec`` with /proc, /dev
and /dev/shm mounted into it. What that leaves out of a real container: its own PID, network and
mount namespaces, cgroup limits and dropped capabilities.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence


def tools_missing() -> str | None:
    """Why images cannot be run here, or None."""
    for tool in ("buildah", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install buildah debootstrap)"
    return None


def image_config(ref: str) -> dict:
    info = json.loads(subprocess.run(["buildah", "inspect", "--type", "image", ref], capture_output=True,
                                     text=True, check=True).stdout)
    return info["OCIv1"]["config"]


class ImageRoot:
    def __init__(self, ref: str, mnt: Path, config: dict):
        self.ref, self.mnt, self.config = ref, mnt, config
        self.mounted: list[Path] = []

    def _mount(self, args: Sequence[str], target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", *args, str(target)], check=True)
        self.mounted.append(target)

    def bind(self, host: Path, inside: str) -> None:
        """A host folder at ``inside`` (a pod's volume)."""
        self._mount(["--bind", str(host)], self.mnt / inside.lstrip("/"))

    def environment(self, container_env: Mapping[str, str]) -> dict[str, str]:
        """The image's ENV, then the container's (a pod's env overrides the image's)."""
        env = dict(e.split("=", 1) for e in self.config.get("Env") or [])
        env.update(container_env)
        return env

    def _argv(self, command: Sequence[str], env: Mapping[str, str], user: str | None, cwd: str | None) -> list[str]:
        user = user or self.config.get("User") or "0:0"
        workdir = cwd or self.config.get("WorkingDir") or "/"
        script = "cd \"$1\" && shift && exec \"$@\""
        return ["chroot", f"--userspec={user}", str(self.mnt), "/usr/bin/env", "-i",
                *[f"{k}={v}" for k, v in self.environment(env).items()], "/bin/sh", "-c", script, "sh", workdir,
                *command]

    def run(self, command: Sequence[str], *, env: Mapping[str, str], user: str | None = None,
            timeout: float = 600, cwd: str | None = None) -> subprocess.CompletedProcess:
        """``command`` inside the image as ``user`` (default: the image's USER), from ``cwd``
        (default: its WORKDIR), with exactly ``environment(env)``."""
        return subprocess.run(self._argv(command, env, user, cwd), capture_output=True, text=True, timeout=timeout)

    def start(self, command: Sequence[str], *, env: Mapping[str, str], user: str | None = None,
              cwd: str | None = None) -> subprocess.Popen:
        """``run``'s command left running (a server), its output on a pipe."""
        return subprocess.Popen(self._argv(command, env, user, cwd), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)


@contextmanager
def image_root(ref: str) -> Iterator[ImageRoot]:
    """A working container of ``ref``, mounted, with /proc, /dev and /dev/shm; removed after."""
    ctr = subprocess.run(["buildah", "from", ref], capture_output=True, text=True, check=True).stdout.strip()
    root = None
    try:
        mnt = Path(subprocess.run(["buildah", "mount", ctr], capture_output=True, text=True,
                                  check=True).stdout.strip())
        root = ImageRoot(ref, mnt, image_config(ref))
        root._mount(["-t", "proc", "proc"], mnt / "proc")
        root._mount(["--bind", "/dev"], mnt / "dev")
        root._mount(["-t", "tmpfs", "-o", "mode=1777", "shm"], mnt / "dev/shm")
        root._mount(["-t", "tmpfs", "-o", "mode=1777", "tmp"], mnt / "tmp")  # the pod's /tmp emptyDir
        # What the kubelet writes into every pod: localhost and the pod's own host name resolve
        # (torchrun --standalone binds one, c10d the other). The chroot shares this host's name.
        hosts = mnt / "etc/hosts"
        hosts.write_text(f"127.0.0.1\tlocalhost {socket.gethostname()}\n::1\tlocalhost ip6-localhost ip6-loopback\n")
        yield root
    finally:
        if root is not None:
            for target in reversed(root.mounted):
                subprocess.run(["umount", "-l", str(target)], capture_output=True)
        subprocess.run(["buildah", "umount", ctr], capture_output=True)
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
