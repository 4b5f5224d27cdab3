"""helm/model-factory rendered by the real Helm engine (helm-python-sdk bundles Helm's Go SDK):
it lints, every manifest validates against Kubernetes 1.31, and the output is least-privilege."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests.k8s.helpers import validate_all

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "model-factory"
NAMESPACE = "model-factory"
ALLOWED_VERBS = {"create", "get", "list", "watch", "delete"}


def render(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    rendered = helm_python.Chart.load(str(CHART)).render(values or {}, name="mf", namespace=namespace)
    docs = []
    for path, text in rendered.items():
        if not path.endswith((".yaml", ".yml")):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


@pytest.fixture(scope="module")
def default_docs():
    return render()


def test_chart_lints_without_errors():
    result = helm_python.lint(str(CHART))
    assert result["errors"] == []
    assert not [m for m in result["messages"] if m["severity"] > 1], result["messages"]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"trainingNamespace": {"name": "training", "create": True},
         "rbac": {"launcherSubjects": [{"name": "dagster", "namespace": "dagster"}]}},
        {"quota": {"enabled": False}, "limitRange": {"enabled": False},
         "rbac": {"nodeReader": {"enabled": False}}, "sharedVolume": {"create": False}},
        {"sharedVolume": {"storageClassName": "efs-sc", "size": "2Ti"},
         "training": {"imagePullSecrets": ["regcred"]}},
        {"authProxy": {"enabled": False}},
        {"authProxy": {"ingress": {"enabled": False}, "allowedGroups": ["ml-platform"], "emailDomains": ["*"]},
         "serviceAccounts": {"trainingAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/training"}}},
    ],
    ids=["defaults", "own-namespace", "minimal", "storage-class", "no-auth-proxy", "groups-and-irsa"],
)
def test_every_rendered_manifest_validates(values):
    docs = render(values)
    assert validate_all(docs) == len(docs) >= 6


def test_expected_objects(default_docs):
    kinds = sorted(d["kind"] for d in default_docs)
    assert kinds == sorted([
        "ConfigMap", "LimitRange", "PersistentVolumeClaim", "PriorityClass", "PriorityClass",
        "ResourceQuota", "Role", "RoleBinding", "ServiceAccount", "ClusterRole",
        "ClusterRoleBinding",
        # The authenticating proxy (tests/k8s/test_auth_proxy.py).
        "ServiceAccount", "Deployment", "Service", "Ingress", "NetworkPolicy",
        # The platform's TensorBoard behind it (templates/tensorboard*.yaml).
        "ServiceAccount", "Deployment", "Service", "NetworkPolicy",
    ])
    for d in default_docs:
        if d["kind"] not in ("PriorityClass", "ClusterRole", "ClusterRoleBinding", "Namespace"):
            assert d["metadata"]["namespace"] == NAMESPACE, d["kind"]


def test_quota_limits_gpus_and_mig_slices(default_docs):
    (quota,) = by_kind(default_docs, "ResourceQuota")
    hard = quota["spec"]["hard"]
    assert hard["requests.nvidia.com/gpu"] == "8"
    assert hard["requests.nvidia.com/mig-1g.10gb"] == "14"
    # A cpu/memory quota rejects pods without requests; the LimitRange supplies defaults.
    (limits,) = by_kind(default_docs, "LimitRange")
    assert set(limits["spec"]["limits"][0]["defaultRequest"]) == {"cpu", "memory"}


def test_priority_classes_training_preempts_adhoc_does_not(default_docs):
    classes = {d["metadata"]["name"]: d for d in by_kind(default_docs, "PriorityClass")}
    training, adhoc = classes["model-factory-training"], classes["model-factory-adhoc"]
    assert training["value"] > adhoc["value"]
    assert adhoc["preemptionPolicy"] == "Never"
    assert not training["globalDefault"] and not adhoc["globalDefault"]


def test_rbac_is_namespaced_and_limited(default_docs):
    (role,) = by_kind(default_docs, "Role")
    granted = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert set(rule["verbs"]) <= ALLOWED_VERBS
        for r in rule["resources"]:
            granted[r] = set(rule["verbs"])
    assert granted["jobs"] == ALLOWED_VERBS
    assert granted["pods"] == ALLOWED_VERBS
    assert granted["services"] == ALLOWED_VERBS
    assert granted["pods/log"] == {"get"}
    assert granted["events"] <= {"get", "list", "watch"}  # read-only
    assert "secrets" not in granted and "pods/exec" not in granted
    # The only cluster-scoped grant is reading nodes, for the feasibility check.
    (cluster_role,) = by_kind(default_docs, "ClusterRole")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    (binding,) = by_kind(default_docs, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mf-launcher"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dagster", "namespace": NAMESPACE}]


def test_without_node_reader_nothing_is_cluster_wide():
    docs = render({"rbac": {"nodeReader": {"enabled": False}}})
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "Namespace"}
    assert not [d for d in docs if d["kind"] in cluster_scoped]


def test_no_service_account_of_the_chart_mounts_a_token(default_docs):
    accounts = {sa["metadata"]["name"]: sa for sa in by_kind(default_docs, "ServiceAccount")}
    assert {"model-factory-training", "mf-auth-proxy"} <= set(accounts)
    assert all(sa["automountServiceAccountToken"] is False for sa in accounts.values())
    assert "annotations" not in accounts["model-factory-training"]["metadata"]


def test_the_training_service_account_can_carry_its_cloud_role():
    role = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/model-factory-training"}
    docs = render({"serviceAccounts": {"trainingAnnotations": role}})
    (sa,) = [d for d in by_kind(docs, "ServiceAccount") if d["metadata"]["name"] == "model-factory-training"]
    assert sa["metadata"]["annotations"] == role


def test_namespace_enforces_pod_security_when_created():
    docs = render({"trainingNamespace": {"name": "training", "create": True}})
    (ns,) = by_kind(docs, "Namespace")
    labels = ns["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert all(d["metadata"].get("namespace") in (None, "training") for d in docs)


def test_secrets_are_named_never_valued(default_docs):
    assert not by_kind(default_docs, "Secret")
    (cm,) = by_kind(default_docs, "ConfigMap")
    assert cm["data"]["MODEL_FACTORY_S3_SECRET"] == "model-factory-s3"
    assert cm["data"]["MODEL_FACTORY_LAKEFS_SECRET"] == "model-factory-lakefs"
    assert cm["data"]["MODEL_FACTORY_TRAINING_S3_SECRET"] == "model-factory-s3-training"
    assert cm["data"]["MODEL_FACTORY_TRAINING_LAKEFS_SECRET"] == "model-factory-lakefs-training"
    text = yaml.safe_dump_all(default_docs)
    for needle in ("AWS_SECRET_ACCESS_KEY:", "password", "LAKEFS_SECRET_ACCESS_KEY:", "stringData"):
        assert needle not in text
    # Nothing base64-looking long enough to be a key hides in the data either.
    for value in cm["data"].values():
        try:
            decoded = base64.b64decode(value, validate=True)
        except ValueError:
            continue
        assert len(decoded) < 20, value


def test_configmap_feeds_the_launcher_settings(default_docs):
    from resources.k8s.step_config import platform_settings

    (cm,) = by_kind(default_docs, "ConfigMap")
    settings = platform_settings(cm["data"])
    assert settings.namespace == NAMESPACE
    assert settings.shared_claim == "model-factory-shared"
    assert settings.shared_mount_path == "/mnt/training"
    assert settings.image == "registry.example.com/model-factory/training:0.1.0"
    # Training pods get the training keys, never the orchestrator's (tests/k8s/test_storage_keys.py).
    assert {s.secret for s in settings.secret_env} == {"model-factory-s3-training"}
    assert {s.secret for s in settings.lakefs_secret_env} == {"model-factory-lakefs-training"}
    assert cm["data"]["PLATFORM_PROFILE"] == "kubernetes"


def test_no_privileged_or_host_access_anywhere(default_docs):
    text = yaml.safe_dump_all(default_docs)
    for needle in ("privileged: true", "hostPath", "hostNetwork", "hostPID", "allowPrivilegeEscalation: true"):
        assert needle not in text


def test_shared_volume_is_read_write_many_and_kept(default_docs):
    (pvc,) = by_kind(default_docs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_missing_required_value_fails_rendering():
    with pytest.raises(Exception, match="platform.artifactBucket is required"):
        render({"platform": {"artifactBucket": ""}})
