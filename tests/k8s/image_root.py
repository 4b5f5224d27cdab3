"""Run a command inside a built image's root file system, as its pod would: the image's own
environment under the container's, its working directory, a user id, and host folders mounted
where the pod mounts its volumes.

No container runtime works in this sandbox (``podman run`` cannot set rlimits), so the image is
mounted with ``buildah mount`` and the command runs under ``chroot --userspec`` with /proc, /dev
and the pod's volumes mounted into it, the root itself read-only where the pod asks for that.
What that leaves out of a real container: its own PID, network and mount namespaces, cgroup limits
and dropped capabilities (a non-root user has none here either).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator, Mapping, Sequence


def tools_missing() -> str | None:
    """Why images cannot be run here, or None."""
    for tool in ("buildah", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install buildah debootstrap)"
    return None


def image_inspect(ref: str) -> dict:
    return json.loads(subprocess.run(["buildah", "inspect", "--type", "image", ref], capture_output=True,
                                     text=True, check=True).stdout)


def image_config(ref: str) -> dict:
    return image_inspect(ref)["OCIv1"]["config"]


def _under(path: str, folder: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(folder))


class ImageRoot:
    def __init__(self, ref: str, mnt: Path, config: dict, container: str = ""):
        self.ref, self.mnt, self.config, self.container = ref, mnt, config, container
        self.mounted: list[Path] = []

    @classmethod
    def open(cls, ref: str, name: str | None = None) -> "ImageRoot":
        """A working container of ``ref`` (named ``name``), mounted, with the /etc/hosts a kubelet
        writes; nothing else mounted yet. ``close`` removes it."""
        cmd = ["buildah", "from", *(["--name", name] if name else []), ref]
        ctr = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
        try:
            mnt = Path(subprocess.run(["buildah", "mount", ctr], capture_output=True, text=True,
                                      check=True).stdout.strip())
            root = cls(ref, mnt, image_config(ref), ctr)
            # What the kubelet writes into every pod: localhost and the pod's own host name resolve
            # (torchrun --standalone binds one, c10d the other). The chroot shares this host's name.
            (mnt / "etc/hosts").write_text(
                f"127.0.0.1\tlocalhost {socket.gethostname()}\n::1\tlocalhost ip6-localhost ip6-loopback\n")
            return root
        except BaseException:
            subprocess.run(["buildah", "rm", ctr], capture_output=True)
            raise

    def _mount(self, args: Sequence[str], target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", *args, str(target)], check=True, capture_output=True)
        self.mounted.append(target)

    def bind(self, host: Path, inside: str) -> None:
        """A host folder at ``inside`` (a pod's volume)."""
        self._mount(["--bind", str(host)], self.mnt / inside.lstrip("/"))

    def mount_pod(self, *, tmpfs: Sequence[str] = (), binds: Sequence[tuple[Path, str]] = (),
                  read_only_root: bool = False) -> None:
        """What a container's root gets: /proc, /dev, then the pod's volumes (``tmpfs``: fresh
        emptyDirs; ``binds``: host folders), parents before children; with ``read_only_root`` the
        image's own files cannot be written (readOnlyRootFilesystem), the volumes still can."""
        volumes = sorted([(p, None) for p in tmpfs] + [(inside, host) for host, inside in binds],
                         key=lambda v: len(PurePosixPath(v[0]).parts))
        if read_only_root:
            # Mount points must exist before the root turns read-only, except those inside a volume.
            for inside, _ in volumes:
                if not any(_under(inside, other) and inside != other for other, _ in volumes):
                    (self.mnt / inside.lstrip("/")).mkdir(parents=True, exist_ok=True)
            for d in ("proc", "dev"):
                (self.mnt / d).mkdir(exist_ok=True)
            self._mount(["--bind", str(self.mnt)], self.mnt)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(self.mnt)], check=True, capture_output=True)
        self._mount(["-t", "proc", "proc"], self.mnt / "proc")
        self._mount(["--bind", "/dev"], self.mnt / "dev")
        for inside, host in volumes:
            if host is None:
                self._mount(["-t", "tmpfs", "-o", "mode=1777", "tmpfs"], self.mnt / inside.lstrip("/"))
            else:
                self.bind(Path(host), inside)

    def environment(self, container_env: Mapping[str, str]) -> dict[str, str]:
        """The image's ENV, then the container's (a pod's env overrides the image's)."""
        env = dict(e.split("=", 1) for e in self.config.get("Env") or [])
        env.update(container_env)
        return env

    def argv(self, command: Sequence[str], env: Mapping[str, str], user: str | None = None,
             cwd: str | None = None, groups: Sequence[int] = ()) -> list[str]:
        """The host command line that runs ``command`` in this root, as ``user`` (default: the
        image's USER) with supplementary ``groups`` (a pod's fsGroup), from ``cwd`` (default: its
        WORKDIR), with exactly ``environment(env)``. chroot, env and sh each exec the next, so the
        process started is the command's own (signals reach it, its pid is the pod's)."""
        user = user or self.config.get("User") or "0:0"
        workdir = cwd or self.config.get("WorkingDir") or "/"
        script = "cd \"$1\" && shift && exec \"$@\""
        return ["chroot", f"--userspec={user}", *([f"--groups={','.join(map(str, groups))}"] if groups else []),
                str(self.mnt), "/usr/bin/env", "-i", *[f"{k}={v}" for k, v in self.environment(env).items()],
                "/bin/sh", "-c", script, "sh", workdir, *command]

    def run(self, command: Sequence[str], *, env: Mapping[str, str], user: str | None = None,
            timeout: float = 600, cwd: str | None = None) -> subprocess.CompletedProcess:
        """``command`` inside the image, waited for (see ``argv``)."""
        return subprocess.run(self.argv(command, env, user, cwd), capture_output=True, text=True, timeout=timeout)

    def start(self, command: Sequence[str], *, env: Mapping[str, str], user: str | None = None,
              cwd: str | None = None) -> subprocess.Popen:
        """``run``'s command left running (a server), its output on a pipe."""
        return subprocess.Popen(self.argv(command, env, user, cwd), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def close(self) -> None:
        """Unmounts what was mounted (lazily: a process that outlived its pod cannot pin it) and
        removes the working container."""
        for target in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(target)], capture_output=True)
        self.mounted.clear()
        if self.container:
            subprocess.run(["buildah", "umount", self.container], capture_output=True)
            subprocess.run(["buildah", "rm", self.container], capture_output=True)
            self.container = ""


@contextmanager
def image_root(ref: str) -> Iterator[ImageRoot]:
    """A working container of ``ref``, mounted, with /proc, /dev, and /dev/shm and /tmp as fresh
    tmpfs (the pod's emptyDirs); removed after."""
    root = ImageRoot.open(ref)
    try:
        root.mount_pod(tmpfs=("/dev/shm", "/tmp"))
        yield root
    finally:
        root.close()
