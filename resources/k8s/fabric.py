"""The RDMA profile of multi-node training pods: NCCL over InfiniBand or RoCE instead of TCP.

Off by default: NCCL then talks TCP sockets over the pod network, which works on every cluster. On,
each pod of a multi-node Job requests the RDMA device resource its cluster's device plugin
advertises (the NVIDIA Network Operator's `rdma/rdma_shared_device_a`, an SR-IOV pool such as
`rdma/ib`, ...), the trainer container may add IPC_LOCK, and NCCL is told which HCAs and interface
to use. Single-node Jobs never get it: their ranks talk over NVLink/PCIe and shared memory, so an
RDMA device would only be held idle. Pods stay on the pod network (no hostNetwork): the RDMA
device plugin hands the verbs devices in, and bootstrap traffic uses the pod's own interface.

The fabric belongs to the cluster, not to a pipeline, so there is one configuration path: the
model-factory chart's `training.rdma` values become the `MODEL_FACTORY_RDMA_*` keys of its
ConfigMap, the Dagster pods load them as environment variables, and `rdma_profile()` reads them.

Memory registration (ibv_reg_mr) pins pages and is bounded by RLIMIT_MEMLOCK unless the process has
CAP_IPC_LOCK. The training pods run as uid 1000, and container runtimes put an added capability of a
non-root container in its bounding set only, not in its effective set (kubernetes/kubernetes#56374):
the node's container runtime must therefore run with an unlimited memlock limit (containerd's
systemd unit with LimitMEMLOCK=infinity, the usual setting on RDMA GPU nodes), which the
containers inherit. IPC_LOCK is still added by default for runtimes and images that grant it;
`ipc_lock=False` leaves it out where the namespace's Pod Security level must stay at baseline
(which forbids IPC_LOCK).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

TRANSPORTS = ("infiniband", "roce")
# NCCL_NET_GDR_LEVEL: the farthest PCI distance between GPU and NIC at which NCCL still uses GPU
# Direct RDMA (LOC: never ... SYS: across the CPU interconnect too). Unset, NCCL decides from the topology.
GDR_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")

# ConfigMap keys (helm/model-factory/templates/configmap.yaml) -> the chart value each comes from.
ENV_ENABLED = "MODEL_FACTORY_RDMA_ENABLED"
ENV_TRANSPORT = "MODEL_FACTORY_RDMA_TRANSPORT"
ENV_RESOURCE = "MODEL_FACTORY_RDMA_RESOURCE"
ENV_RESOURCE_COUNT = "MODEL_FACTORY_RDMA_RESOURCE_COUNT"
ENV_HCA = "MODEL_FACTORY_RDMA_HCA"
ENV_SOCKET_IFNAME = "MODEL_FACTORY_RDMA_SOCKET_IFNAME"
ENV_GID_INDEX = "MODEL_FACTORY_RDMA_GID_INDEX"
ENV_GDR_LEVEL = "MODEL_FACTORY_RDMA_GDR_LEVEL"
ENV_IPC_LOCK = "MODEL_FACTORY_RDMA_IPC_LOCK"
CHART_VALUE = {
    ENV_ENABLED: "training.rdma.enabled",
    ENV_TRANSPORT: "training.rdma.transport",
    ENV_RESOURCE: "training.rdma.resourceName",
    ENV_RESOURCE_COUNT: "training.rdma.resourcesPerPod",
    ENV_HCA: "training.rdma.hca",
    ENV_SOCKET_IFNAME: "training.rdma.socketIfname",
    ENV_GID_INDEX: "training.rdma.gidIndex",
    ENV_GDR_LEVEL: "training.rdma.gdrLevel",
    ENV_IPC_LOCK: "training.rdma.ipcLock",
}
_FIELD_KEY = {
    "transport": ENV_TRANSPORT, "resource_name": ENV_RESOURCE, "resource_count": ENV_RESOURCE_COUNT,
    "hca": ENV_HCA, "socket_ifname": ENV_SOCKET_IFNAME, "gid_index": ENV_GID_INDEX,
    "gdr_level": ENV_GDR_LEVEL, "ipc_lock": ENV_IPC_LOCK,
}

# An extended resource name: <DNS subdomain>/<name>, outside the kubernetes.io domains.
_RESOURCE_NAME = re.compile(
    r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
# NCCL_IB_HCA: an optional ^ (exclude) and/or = (exact names), then device[:port] entries, comma-separated.
_HCA = re.compile(r"^\^?=?[A-Za-z0-9_.-]+(:[0-9]+)?(,[A-Za-z0-9_.-]+(:[0-9]+)?)*$")
# NCCL_SOCKET_IFNAME: the same prefix/exclude/exact syntax over interface names.
_IFNAME = re.compile(r"^\^?=?[A-Za-z0-9_.@-]+(,[A-Za-z0-9_.@-]+)*$")


class RdmaProfileError(ValueError):
    """A `training.rdma` setting that cannot make a working pod."""


def _problem(field_name: str, message: str) -> RdmaProfileError:
    key = _FIELD_KEY[field_name]
    return RdmaProfileError(f"RDMA profile {CHART_VALUE[key]} ({key} in the model-factory-platform ConfigMap): "
                            f"{message}")


@dataclass(frozen=True, kw_only=True)
class RdmaProfile:
    """How multi-node training pods reach the RDMA fabric."""

    transport: str = "infiniband"  # or "roce" (RDMA over Converged Ethernet)
    resource_name: str = "rdma/rdma_shared_device_a"  # the RDMA device plugin's extended resource
    resource_count: int = 1  # of that resource per pod
    hca: str = ""  # NCCL_IB_HCA, e.g. "mlx5" or "=mlx5_0:1,mlx5_1:1"; empty: every HCA the pod sees
    socket_ifname: str = "eth0"  # NCCL_SOCKET_IFNAME for bootstrap: the pod network's interface
    gid_index: int | None = None  # NCCL_IB_GID_INDEX (RoCE only); None: NCCL >= 2.21 picks the RoCE v2 GID
    gdr_level: str = ""  # NCCL_NET_GDR_LEVEL, one of GDR_LEVELS; empty: NCCL's topology-based choice
    ipc_lock: bool = True  # add CAP_IPC_LOCK to the trainer container (see the module docstring)

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise _problem("transport", f"{self.transport!r}: use one of {list(TRANSPORTS)}")
        if not isinstance(self.resource_name, str) or not _RESOURCE_NAME.match(self.resource_name) \
                or self.resource_name.split("/")[0].endswith("kubernetes.io"):
            raise _problem("resource_name", f"{self.resource_name!r} is not an extended resource name such as "
                           "'rdma/rdma_shared_device_a' or 'rdma/ib'; use the name your RDMA device plugin "
                           "advertises (kubectl describe node shows it under Allocatable)")
        if isinstance(self.resource_count, bool) or not isinstance(self.resource_count, int) \
                or self.resource_count < 1:
            raise _problem("resource_count", f"{self.resource_count!r} must be a whole number of at least 1")
        if self.hca and not _HCA.match(self.hca):
            raise _problem("hca", f"{self.hca!r} is not an NCCL_IB_HCA list such as 'mlx5' or "
                           "'=mlx5_0:1,mlx5_1:1'")
        if not _IFNAME.match(self.socket_ifname or ""):
            raise _problem("socket_ifname", f"{self.socket_ifname!r} is not an NCCL_SOCKET_IFNAME such as "
                           "'eth0' or '=eth0'")
        if self.gid_index is not None:
            if self.transport != "roce":
                raise _problem("gid_index", "NCCL reads the GID index in RoCE mode only; leave it empty for "
                               "InfiniBand or set transport to 'roce'")
            if isinstance(self.gid_index, bool) or not isinstance(self.gid_index, int) or self.gid_index < 0:
                raise _problem("gid_index", f"{self.gid_index!r} must be a whole number of 0 or more "
                               "(show_gids on a node lists them; RoCE v2 over IPv4 is often 3)")
        if self.gdr_level and self.gdr_level not in GDR_LEVELS:
            raise _problem("gdr_level", f"{self.gdr_level!r}: use one of {list(GDR_LEVELS)} or leave it empty")

    def nccl_env(self) -> dict[str, str]:
        """The NCCL settings of every trainer container of a multi-node Job."""
        env = {
            # Explicit so that a site-wide /etc/nccl.conf that disables IB cannot silently win.
            "NCCL_IB_DISABLE": "0",
            "NCCL_SOCKET_IFNAME": self.socket_ifname,
        }
        if self.hca:
            env["NCCL_IB_HCA"] = self.hca
        if self.gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(self.gid_index)
        if self.gdr_level:
            env["NCCL_NET_GDR_LEVEL"] = self.gdr_level
        return env

    def resources(self) -> dict[str, str]:
        """Extended resources of one pod (requests and limits: they must be equal)."""
        return {self.resource_name: str(self.resource_count)}

    def capabilities(self) -> tuple[str, ...]:
        return ("IPC_LOCK",) if self.ipc_lock else ()

    def to_environ(self) -> dict[str, str]:
        """The ConfigMap keys this profile is read from (the inverse of `rdma_profile`)."""
        env = {
            ENV_ENABLED: "true", ENV_TRANSPORT: self.transport, ENV_RESOURCE: self.resource_name,
            ENV_RESOURCE_COUNT: str(self.resource_count), ENV_HCA: self.hca,
            ENV_SOCKET_IFNAME: self.socket_ifname, ENV_GDR_LEVEL: self.gdr_level,
            ENV_IPC_LOCK: "true" if self.ipc_lock else "false",
        }
        if self.gid_index is not None:
            env[ENV_GID_INDEX] = str(self.gid_index)
        return env


def _flag(environ: Mapping[str, str], key: str, default: bool) -> bool:
    raw = str(environ.get(key, "")).strip().lower()
    if raw == "":
        return default
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no"):
        return False
    raise RdmaProfileError(f"{CHART_VALUE[key]} ({key}) is {raw!r}; use true or false")


def _whole(environ: Mapping[str, str], key: str) -> int | None:
    raw = str(environ.get(key, "")).strip()
    if raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise RdmaProfileError(f"{CHART_VALUE[key]} ({key}) is {raw!r}; give a whole number") from None


def rdma_profile(environ: Mapping[str, Any]) -> RdmaProfile | None:
    """The profile the chart's ConfigMap describes, or None when it is off (the default)."""
    if not _flag(environ, ENV_ENABLED, False):
        return None
    defaults = RdmaProfile()
    count = _whole(environ, ENV_RESOURCE_COUNT)
    return RdmaProfile(
        transport=str(environ.get(ENV_TRANSPORT) or defaults.transport).strip(),
        resource_name=str(environ.get(ENV_RESOURCE) or defaults.resource_name).strip(),
        resource_count=defaults.resource_count if count is None else count,
        hca=str(environ.get(ENV_HCA) or "").strip(),
        socket_ifname=str(environ.get(ENV_SOCKET_IFNAME) or defaults.socket_ifname).strip(),
        gid_index=_whole(environ, ENV_GID_INDEX),
        gdr_level=str(environ.get(ENV_GDR_LEVEL) or "").strip(),
        ipc_lock=_flag(environ, ENV_IPC_LOCK, defaults.ipc_lock),
    )


def rdma_settings(environ: Mapping[str, Any]) -> dict[str, str]:
    """Only the `MODEL_FACTORY_RDMA_*` keys of `environ`: what a launcher keeps of the ConfigMap."""
    return {k: str(v) for k, v in environ.items() if k in CHART_VALUE}
