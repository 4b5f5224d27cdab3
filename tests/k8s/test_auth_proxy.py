"""The chart's authenticating proxy in front of the Dagster UI, rendered by the real Helm engine:
the Ingress leads to the proxy only, the NetworkPolicy admits only the proxy's pods to the
webserver (a forged identity header from anywhere else never reaches it), the proxy sets the
identity header itself, and the run coordinator reads that same header."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from core.identity import PROXY_IDENTITY_HEADERS
from tests.k8s.helpers import validate_all
from tests.k8s.network_policy import Outside, Pod, ingress_allowed, selects
from tests.k8s.test_helm import NAMESPACE, by_kind, render

REPO = Path(__file__).resolve().parents[2]
DAGSTER_VALUES = yaml.safe_load((REPO / "helm" / "dagster-values.yaml").read_text())
INSTANCE = yaml.safe_load((REPO / "helm" / "instance" / "dagster.yaml").read_text())
WEBSERVER_PORT = 80  # dagsterWebserver.service.port, the Dagster chart's default (also its containerPort)


def dagster_release() -> str:
    """The release name the install command in helm/dagster-values.yaml's header uses."""
    command = next(line for line in (REPO / "helm" / "dagster-values.yaml").read_text().splitlines()
                   if "helm upgrade --install" in line)
    return command.lstrip("# ").split()[3]


def dagster_pod(component: str, name: str | None = None) -> Pod:
    """A pod of the official Dagster chart (1.13): selector labels plus ``component``, as its
    templates give them (helm/dagster/templates/helpers/_helpers.tpl "dagster.selectorLabels",
    _deployment-webserver.tpl; the daemon's and user deployments' likewise)."""
    labels = {"app.kubernetes.io/name": "dagster", "app.kubernetes.io/instance": dagster_release(),
              "component": component}
    return Pod(name or component, NAMESPACE, labels, ip="10.0.1.5")


@pytest.fixture(scope="module")
def docs():
    return render()


PROXY = "mf-auth-proxy"  # the release is "mf" in these renders
WEBSERVER_POLICY = "mf-dagster-webserver-from-proxy"


def named(docs, kind: str, name: str) -> dict:
    (doc,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def proxy_args(docs) -> list[str]:
    return named(docs, "Deployment", PROXY)["spec"]["template"]["spec"]["containers"][0]["args"]


def proxy_pod(docs) -> Pod:
    deployment = named(docs, "Deployment", PROXY)
    return Pod("mf-auth-proxy-abc", deployment["metadata"]["namespace"],
               deployment["spec"]["template"]["metadata"]["labels"], ip="10.0.2.7")


def test_the_evaluator_follows_the_documented_semantics():
    web = Pod("web", "a", {"app": "web"}, ports={"http": 80})
    deny_all = {"kind": "NetworkPolicy", "metadata": {"namespace": "a"}, "spec": {"podSelector": {}}}
    other_ns = {"kind": "NetworkPolicy", "metadata": {"namespace": "b"}, "spec": {"podSelector": {}}}
    from_b = {"kind": "NetworkPolicy", "metadata": {"namespace": "a"}, "spec": {
        "podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}], "ports": [{"port": "http"}]}]}}
    client = Pod("c", "b", {"app": "client"})
    assert ingress_allowed([], client, web, 80) and ingress_allowed([other_ns], client, web, 80)
    assert not ingress_allowed([deny_all], client, web, 80)
    assert ingress_allowed([deny_all, from_b], client, web, 80, namespace_labels={"b": {"team": "b"}})
    assert not ingress_allowed([from_b], client, web, 81, namespace_labels={"b": {"team": "b"}})
    assert not ingress_allowed([from_b], client, web, 80, namespace_labels={"b": {"team": "c"}})
    assert not ingress_allowed([from_b], Outside("203.0.113.9"), web, 80)
    assert selects({"matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["1"]}]}, {"x": "2"})
    assert not selects({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, {})


def test_the_proxy_manifests_validate_and_run_without_privilege(docs):
    proxy = [named(docs, kind, PROXY) for kind in ("ServiceAccount", "Deployment", "Service", "Ingress")]
    assert validate_all([*proxy, named(docs, "NetworkPolicy", WEBSERVER_POLICY)]) == 5
    pod = named(docs, "Deployment", PROXY)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {"privileged": False, "allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    # The OIDC client and cookie secrets come from a Secret by reference, never as values.
    assert {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]} == {
        "OAUTH2_PROXY_CLIENT_ID": "model-factory-auth-proxy", "OAUTH2_PROXY_CLIENT_SECRET": "model-factory-auth-proxy",
        "OAUTH2_PROXY_COOKIE_SECRET": "model-factory-auth-proxy"}


def test_the_proxy_sets_the_identity_headers_itself_and_forwards_to_the_webserver(docs):
    listed = proxy_args(docs)
    args = {a.removeprefix("--").split("=", 1)[0]: a.split("=", 1)[1] for a in listed}
    # --pass-user-headers: X-Forwarded-{User,Email,Groups,Preferred-Username} on every upstream
    # request, each deleted from the client's request first; no tokens are passed on.
    assert args["pass-user-headers"] == "true"
    assert args["set-xauthrequest"] == args["pass-access-token"] == args["pass-authorization-header"] == "false"
    # The webserver at the root; the Dagster chart names its Service <release>-webserver.
    webserver = f"--upstream=http://{dagster_release()}-webserver.{NAMESPACE}.svc.cluster.local:{WEBSERVER_PORT}/"
    assert webserver in listed
    assert args["redirect-url"] == "https://dagster.example.com/oauth2/callback"
    assert args["oidc-issuer-url"].startswith("https://") and args["cookie-secure"] == "true"


def test_the_ingress_leads_to_the_proxy_only_at_the_platforms_ui_address(docs):
    ingresses = by_kind(docs, "Ingress")
    (ingress,) = ingresses  # the only way in from outside
    (rule,) = ingress["spec"]["rules"]
    backends = {p["backend"]["service"]["name"] for p in rule["http"]["paths"]}
    service = named(docs, "Service", PROXY)
    assert backends == {service["metadata"]["name"]}
    assert service["spec"]["selector"] == proxy_pod(docs).labels
    (cm,) = by_kind(docs, "ConfigMap")
    assert rule["host"] == urlparse(cm["data"]["DAGSTER_UI_URL"]).hostname == ingress["spec"]["tls"][0]["hosts"][0]
    # The Dagster chart's own Ingress (straight to the webserver) stays off.
    assert DAGSTER_VALUES["ingress"] == {"enabled": False}


def test_only_the_proxys_pods_reach_the_webserver_so_a_forged_header_cannot(docs):
    policies = by_kind(docs, "NetworkPolicy")
    webserver, read_only = dagster_pod("dagster-webserver"), dagster_pod("dagster-webserver-read-only")
    proxy = proxy_pod(docs)
    assert ingress_allowed(policies, proxy, webserver, WEBSERVER_PORT)
    assert ingress_allowed(policies, proxy, read_only, WEBSERVER_PORT)
    assert not ingress_allowed(policies, proxy, webserver, 3030)  # nothing but the UI's port
    # Everyone else who could send "X-Forwarded-Email: admin@example.com" straight to the webserver:
    forgers = [
        Pod("ingress-nginx-controller", "ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}),
        dagster_pod("dagster-daemon"),
        dagster_pod("user-deployments", "code-location"),
        Pod("run-pod", NAMESPACE, {"app.kubernetes.io/part-of": "model-factory", "dagster/job": "digits_training"}),
        Pod("training-pod", NAMESPACE, {"app.kubernetes.io/name": "model-factory-training"}),
        # The proxy's labels copied by a pod in another namespace do not count there.
        Pod("impostor", "elsewhere", dict(proxy.labels)),
        Outside("203.0.113.9"),
    ]
    for source in forgers:
        assert not ingress_allowed(policies, source, webserver, WEBSERVER_PORT), source
        assert not ingress_allowed(policies, source, read_only, WEBSERVER_PORT), source
    # The proxy itself is open to the ingress controller: it authenticates every request.
    assert ingress_allowed(policies, forgers[0], proxy, 4180)
    # Its selector is exactly the webserver pods of the Dagster release, not the daemon's.
    policy = named(docs, "NetworkPolicy", WEBSERVER_POLICY)
    assert selects(policy["spec"]["podSelector"], webserver.labels)
    assert not selects(policy["spec"]["podSelector"], dagster_pod("dagster-daemon").labels)


def test_the_run_coordinator_reads_the_header_the_proxy_sets():
    docs = render({"authProxy": {"identityHeader": "X-Forwarded-User"}})
    chart = yaml.safe_load((REPO / "helm" / "model-factory" / "values.yaml").read_text())["authProxy"]["identityHeader"]
    coordinator = DAGSTER_VALUES["dagsterDaemon"]["runCoordinator"]["config"]["customRunCoordinator"]["config"]
    assert coordinator["identity_header"] == INSTANCE["run_coordinator"]["config"]["identity_header"] == chart
    assert coordinator["trust_identity_header"] is True and chart in PROXY_IDENTITY_HEADERS
    # Any header the schema allows is one the proxy sets; the others are refused at install time.
    assert validate_all(docs) == len(docs)
    with pytest.raises(Exception, match="identityHeader"):
        render({"authProxy": {"identityHeader": "X-Auth-Request-Email"}})


def test_without_the_proxy_nothing_of_it_renders():
    docs = render({"authProxy": {"enabled": False}})
    assert not [d for d in docs if re.search("auth-proxy|webserver-from-proxy", d["metadata"]["name"])]
    assert not [d for d in by_kind(docs, "Ingress") if d["metadata"]["name"] == PROXY]
