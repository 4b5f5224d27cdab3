"""Every rendered Kubernetes object, across the shapes users ask for, checked for what the issue
forbids: privileged or root pods, privilege escalation, host paths/network/PID, service-account
tokens in training pods, and RBAC beyond the training namespace and the verbs the launcher needs.

The per-feature assertions live in tests/k8s; this sweeps many renderings with one checker and
counts them for RELIABILITY.md."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from resources.k8s.manifests import build_manifests
from tests.k8s.helpers import make_job, pod_settings
from tests.k8s.test_helm import NAMESPACE, render

LAUNCHER_VERBS = {"create", "get", "list", "watch", "delete"}
HOST_ACCESS = ("hostNetwork", "hostPID", "hostIPC")


def _pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec") or {}
    if doc["kind"] == "Pod":
        return [spec]
    template = (spec.get("jobTemplate", {}).get("spec", spec)).get("template")
    return [template["spec"]] if template else []


def pod_violations(pod: dict[str, Any]) -> list[str]:
    found = [f"{key} is set" for key in HOST_ACCESS if pod.get(key)]
    found += [f"volume {v['name']} is a hostPath" for v in pod.get("volumes", []) if "hostPath" in v]
    pod_sc = pod.get("securityContext") or {}
    if pod.get("automountServiceAccountToken") is not False:
        found.append("the service-account token is mounted")
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        sc = c.get("securityContext") or {}
        if sc.get("privileged") is not False:
            found.append(f"container {c['name']}: privileged not set to false")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"container {c['name']}: privilege escalation allowed")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            found.append(f"container {c['name']}: may run as root")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            found.append(f"container {c['name']}: runs as uid 0")
        if "ALL" not in (sc.get("capabilities") or {}).get("drop", []):
            found.append(f"container {c['name']}: capabilities not dropped")
    return found


def rbac_violations(doc: dict[str, Any]) -> list[str]:
    found = []
    if doc["kind"] == "Role":
        if doc["metadata"].get("namespace") not in (None, NAMESPACE, "training"):
            found.append(f"Role in namespace {doc['metadata'].get('namespace')}")
        for rule in doc["rules"]:
            if "*" in rule["verbs"] or "*" in rule["resources"] or not set(rule["verbs"]) <= LAUNCHER_VERBS:
                found.append(f"Role grants {rule['verbs']} on {rule['resources']}")
            if {"secrets", "pods/exec"} & set(rule["resources"]):
                found.append(f"Role grants {rule['resources']}")
    if doc["kind"] == "ClusterRole":
        for rule in doc["rules"]:  # only reading nodes, for the GPU feasibility check
            if rule["resources"] != ["nodes"] or not set(rule["verbs"]) <= {"get", "list", "watch"}:
                found.append(f"ClusterRole grants {rule['verbs']} on {rule['resources']}")
    if doc["kind"] == "ClusterRoleBinding" and doc["roleRef"]["kind"] == "ClusterRole" \
            and doc["roleRef"]["name"] in ("cluster-admin", "admin", "edit"):
        found.append(f"binds {doc['roleRef']['name']}")
    return found


def _violations(doc: dict[str, Any]) -> list[str]:
    return [v for pod in _pod_specs(doc) for v in pod_violations(pod)] + rbac_violations(doc)


CHART_VALUES = [
    {},
    {"trainingNamespace": {"name": "training", "create": True},
     "rbac": {"launcherSubjects": [{"name": "dagster", "namespace": "dagster"}]}},
    {"quota": {"enabled": False}, "limitRange": {"enabled": False},
     "rbac": {"nodeReader": {"enabled": False}}, "sharedVolume": {"create": False}},
    {"sharedVolume": {"storageClassName": "efs-sc", "size": "2Ti"}, "training": {"imagePullSecrets": ["regcred"]}},
]


@pytest.mark.parametrize("values", CHART_VALUES, ids=["defaults", "own-namespace", "minimal", "storage-class"])
def test_helm_chart_objects_are_least_privilege(values, ledger):
    docs = render(values, namespace=values.get("trainingNamespace", {}).get("name", NAMESPACE))
    assert docs
    for doc in docs:
        found = _violations(doc)
        ledger.record("security: rendered manifests least-privilege", not found, True,
                      f"Helm chart, {len(CHART_VALUES)} value sets; training Jobs in every shape")
        assert not found, f"{doc['kind']}/{doc['metadata']['name']}: {found}"


SHAPES = list(itertools.product([1, 2, 4], [1, 2, 8], [None, "nvidia.com/mig-1g.10gb"]))


@pytest.mark.parametrize("nnodes, nproc, resource", SHAPES)
def test_training_job_objects_are_least_privilege(nnodes, nproc, resource, ledger):
    gpu = {"resource_name": resource} if resource else {}
    docs = build_manifests(make_job(nnodes=nnodes, nproc=nproc, **gpu), pod_settings(),
                           {"DAGSTER_PIPES_CONTEXT": "e30=", "DAGSTER_PIPES_MESSAGES": "e30="})
    assert _pod_specs(docs[0]), "the training Job has no pod template"
    for doc in docs:
        found = _violations(doc)
        ledger.record("security: rendered manifests least-privilege", not found, True,
                      f"Helm chart, {len(CHART_VALUES)} value sets; training Jobs in every shape")
        assert not found, f"{doc['kind']}/{doc['metadata']['name']}: {found}"


def test_the_checker_catches_what_it_looks_for():
    bad_pod = {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
               "containers": [{"name": "c", "securityContext": {"privileged": True, "runAsUser": 0}}]}
    found = pod_violations(bad_pod)
    assert len(found) == 8, found
    wide_role = {"kind": "Role", "metadata": {"namespace": NAMESPACE},
                 "rules": [{"verbs": ["*"], "resources": ["secrets"]}]}
    assert len(rbac_violations(wide_role)) == 2
