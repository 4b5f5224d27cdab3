"""Which connections Kubernetes NetworkPolicies admit, evaluated as the API documents them
(https://kubernetes.io/docs/concepts/services-networking/network-policies/), so rendered policies
can be checked against the pods they are meant to let in or keep out without a cluster.

- A pod is isolated for ingress once any policy in its namespace selects it with Ingress among its
  policyTypes (a policy without policyTypes has Ingress); an isolated pod admits a connection only
  if some rule of some selecting policy admits it. Policies only add.
- A rule admits a connection when its ports match (none listed: every port) and one of its peers
  matches (none listed: every source). A podSelector peer alone selects pods in the policy's own
  namespace; with a namespaceSelector, pods in the namespaces it selects; a namespaceSelector
  alone, every pod there; an ipBlock, addresses in its CIDR outside its exceptions.
- Traffic from the pod's own node (kubelet probes) is always admitted: not modelled here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: str = "10.0.0.1"
    ports: Mapping[str, int] = field(default_factory=dict)  # named container ports


@dataclass(frozen=True)
class Outside:
    """A client outside the cluster's pod network (no labels, no namespace)."""

    ip: str


def selects(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions); the empty selector selects everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {operator!r}")
    return True


def _ports_match(ports: list | None, target: Pod, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for entry in ports:
        wanted = entry.get("port")
        if entry.get("protocol", "TCP") != protocol:
            continue
        if wanted is None or wanted == port or (isinstance(wanted, str) and target.ports.get(wanted) == port):
            if entry.get("endPort") is None or wanted <= port <= entry["endPort"]:
                return True
    return False


def _peer_matches(peer: Mapping, policy_namespace: str, source: Pod | Outside,
                  namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(source.ip)
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in block.get("except") or [])
    if isinstance(source, Outside):
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], namespace_labels.get(source.namespace, {})):
            return False
    elif source.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector"), source.labels)


def ingress_allowed(policies: Iterable[Mapping], source: Pod | Outside, target: Pod, port: int,
                    protocol: str = "TCP", namespace_labels: Mapping[str, Mapping[str, str]] | None = None) -> bool:
    """Whether ``source`` may open a connection to ``target`` on ``port``."""
    namespace_labels = namespace_labels or {}
    selecting = [p for p in policies
                 if p["kind"] == "NetworkPolicy" and p["metadata"]["namespace"] == target.namespace
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and selects(p["spec"].get("podSelector"), target.labels)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            if not _ports_match(rule.get("ports"), target, port, protocol):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_matches(peer, policy["metadata"]["namespace"], source, namespace_labels)
                                for peer in peers):
                return True
    return False
