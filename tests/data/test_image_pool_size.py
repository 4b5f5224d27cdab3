"""How many processes the image pool starts by default: the CPUs this process may use (its
affinity), capped by its cgroup's CPU quota, a pod's CPU limit; never the node's whole core count."""

import os

import pytest

from assets.kinds import image_pool
from assets.kinds.image_pool import cpu_quota, default_workers


@pytest.mark.parametrize("line, cpus", [("max 100000\n", None), ("200000 100000", 2), ("150000 100000", 2),
                                        ("50000 100000", 1), ("6400000 100000", 64)])
def test_a_cgroup_quota_is_whole_cpus_rounded_up(line, cpus):
    assert cpu_quota(line) == cpus


def test_the_pool_takes_the_quota_when_it_is_below_the_affinity(tmp_path, monkeypatch):
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(image_pool, "CGROUP_CPU_MAX", str(cpu_max))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))  # a 64-core node
    cpu_max.write_text("200000 100000\n")  # a pod limited to 2 CPUs
    assert default_workers() == 2
    cpu_max.write_text("max 100000\n")  # no limit: every CPU the process may run on
    assert default_workers() == 64
    cpu_max.unlink()  # no cgroup v2 CPU controller
    assert default_workers() == 64


def test_the_pool_takes_the_affinity_when_it_is_below_the_quota(tmp_path, monkeypatch):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("800000 100000\n")
    monkeypatch.setattr(image_pool, "CGROUP_CPU_MAX", str(cpu_max))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})  # e.g. taskset -c 0-2
    assert default_workers() == 3
