"""The chart's TensorBoard, rendered by the real Helm engine and judged against the platform's own
code: it validates and runs unprivileged, it serves the artifact store's models/ area with the
arguments ``make ui`` uses, the proxy routes its path prefix to it behind the same sign-in, only the
proxy reaches it, and the ConfigMap tells the code location the URL runs link to. Then a real
TensorBoard 2.21 (no TensorFlow) reads that s3:// logdir from SeaweedFS with only a list-and-read
key, and shows a run's curve grow as the training op's live copy uploads more events."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from ops.tensorboard_events import EventFileSync, event_prefix, run_filter, tensorboard_link, tensorboard_logdir
from pipelines.cli.tensorboard import server_args, server_command
from pipelines.profiles import TENSORBOARD_URL_ENV, kubernetes_resources
from resources.artifacts.s3 import S3ArtifactStore
from tests.cli.tensorboard_versions import _Quiet
from tests.k8s.helpers import validate_all
from tests.k8s.network_policy import Outside, Pod, ingress_allowed
from tests.k8s.test_helm import NAMESPACE, by_kind, render
from tests.support.ports import free_ports
from tests.support.seaweed import SeaweedServer
from training_runtime.observe.tensorboard import TensorBoardReporter

TENSORBOARD = "mf-tensorboard"  # the release is "mf" in these renders
PROXY = "mf-auth-proxy"


def named(docs, kind: str, name: str) -> dict:
    (doc,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def container(docs) -> dict:
    (c,) = named(docs, "Deployment", TENSORBOARD)["spec"]["template"]["spec"]["containers"]
    return c


def tensorboard_pod(docs) -> Pod:
    labels = named(docs, "Deployment", TENSORBOARD)["spec"]["template"]["metadata"]["labels"]
    return Pod("mf-tensorboard-abc", NAMESPACE, labels, ip="10.0.3.4")


def configmap(docs) -> dict[str, str]:
    (cm,) = by_kind(docs, "ConfigMap")
    return cm["data"]


@pytest.fixture(scope="module")
def docs():
    return render()


def test_the_tensorboard_manifests_validate_and_run_without_privilege(docs):
    ours = [named(docs, kind, TENSORBOARD) for kind in ("ServiceAccount", "Deployment", "Service")]
    assert validate_all([*ours, named(docs, "NetworkPolicy", f"{TENSORBOARD}-from-proxy")]) == 4
    account = named(docs, "ServiceAccount", TENSORBOARD)
    pod = named(docs, "Deployment", TENSORBOARD)["spec"]["template"]["spec"]
    assert account["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == TENSORBOARD and pod["securityContext"]["runAsNonRoot"] is True
    c = container(docs)
    assert c["securityContext"] == {"privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    # Nothing of the shared volume or the cluster: a scratch /tmp is all it mounts.
    assert [v["name"] for v in pod["volumes"]] == ["tmp"] and "emptyDir" in pod["volumes"][0]
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    # Its S3 key comes from its own Secret, by reference; no other credential is in the pod.
    assert c["envFrom"] == [{"secretRef": {"name": "model-factory-s3-tensorboard"}}]
    assert not [e for e in c["env"] if "valueFrom" in e]
    assert c["image"] == "registry.example.com/model-factory/code-location:0.1.0"


def test_it_serves_the_artifact_store_the_code_location_writes_with_make_uis_arguments(docs):
    data = configmap(docs)
    # The kubernetes profile's artifact store, built from the same ConfigMap the code location reads.
    artifacts = kubernetes_resources(Path("/mnt/training"), environ=data)["artifacts"]
    store = S3ArtifactStore(data["ARTIFACT_BUCKET"], prefix=artifacts.prefix, endpoint_url="http://127.0.0.1:1")
    c = container(docs)
    # The image's python runs the module make ui runs with this environment's.
    assert c["command"][1:] == server_command("x", host="h", port=1)[1:3] == ["-m", "tensorboard.main"]
    assert c["args"] == server_args(tensorboard_logdir(store), host="0.0.0.0", port=6006, reload_s=30,
                                    path_prefix="/tensorboard")
    assert c["args"][0] == "--logdir=s3://model-factory-artifacts/artifacts/models"
    (port,) = c["ports"]
    (service_port,) = named(docs, "Service", TENSORBOARD)["spec"]["ports"]
    assert port["containerPort"] == service_port["port"] == 6006 and service_port["targetPort"] == port["name"]
    assert named(docs, "Service", TENSORBOARD)["spec"]["selector"] == tensorboard_pod(docs).labels
    assert c["readinessProbe"]["httpGet"]["path"] == "/tensorboard/data/environment"


def test_runs_link_to_it_behind_the_proxy_on_the_uis_host(docs):
    data = configmap(docs)
    assert data[TENSORBOARD_URL_ENV] == "https://dagster.example.com/tensorboard"
    # The code location's PlatformSettings take it from there.
    platform = kubernetes_resources(Path("/mnt/training"), environ=data)["platform"]
    assert platform.tensorboard_url == data[TENSORBOARD_URL_ENV]
    link = tensorboard_link(platform.tensorboard_url, "models/digits/checkpoints/run-1/")
    parsed = urllib.parse.urlsplit(link)
    (ingress,) = by_kind(docs, "Ingress")
    assert parsed.hostname == ingress["spec"]["rules"][0]["host"]  # through the proxy's only Ingress
    # The proxy's second upstream: the path prefix, to the Service, path passed on as is.
    args = named(docs, "Deployment", PROXY)["spec"]["template"]["spec"]["containers"][0]["args"]
    upstreams = [a.split("=", 1)[1] for a in args if a.startswith("--upstream=")]
    assert f"http://{TENSORBOARD}.{NAMESPACE}.svc.cluster.local:6006/tensorboard/" in upstreams
    assert parsed.path.startswith("/tensorboard/")
    assert len(upstreams) == 2  # the webserver at /, TensorBoard at /tensorboard/


def test_only_the_proxy_reaches_it(docs):
    policies = by_kind(docs, "NetworkPolicy")
    tensorboard, proxy = tensorboard_pod(docs), Pod(
        "mf-auth-proxy-abc", NAMESPACE, named(docs, "Deployment", PROXY)["spec"]["template"]["metadata"]["labels"])
    assert ingress_allowed(policies, proxy, tensorboard, 6006)
    assert not ingress_allowed(policies, proxy, tensorboard, 6007)
    for other in (Pod("ingress-nginx-controller", "ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}),
                  Pod("training-pod", NAMESPACE, {"app.kubernetes.io/name": "model-factory-training"}),
                  Pod("impostor", "elsewhere", dict(proxy.labels)), Outside("203.0.113.9")):
        assert not ingress_allowed(policies, other, tensorboard, 6006), other


def test_without_the_proxy_it_links_only_where_told():
    bare = render({"authProxy": {"enabled": False}})
    assert validate_all(bare) == len(bare)
    assert named(bare, "Deployment", TENSORBOARD) and not by_kind(bare, "NetworkPolicy")
    assert TENSORBOARD_URL_ENV not in configmap(bare)  # nothing serves <uiUrl>/tensorboard: no links
    told = render({"authProxy": {"enabled": False}, "tensorboard": {"url": "https://tb.example.com/", "pathPrefix": ""}})
    assert configmap(told)[TENSORBOARD_URL_ENV] == "https://tb.example.com"
    assert not [a for a in container(told)["args"] if a.startswith("--path_prefix")]


def test_switched_off_nothing_of_it_renders_and_nothing_links():
    docs = render({"tensorboard": {"enabled": False}})
    assert not [d for d in docs if "tensorboard" in d["metadata"]["name"]]
    assert TENSORBOARD_URL_ENV not in configmap(docs)
    args = named(docs, "Deployment", PROXY)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert len([a for a in args if a.startswith("--upstream=")]) == 1


def test_settings_that_cannot_work_are_refused_at_install_time():
    with pytest.raises(Exception, match="tensorboard.pathPrefix must name a path"):
        render({"tensorboard": {"pathPrefix": ""}})  # the proxy serves the UI at /
    with pytest.raises(Exception, match="pathPrefix"):
        render({"tensorboard": {"pathPrefix": "/tensorboard/"}})
    with pytest.raises(Exception, match="url"):
        render({"tensorboard": {"url": "tb.example.com"}})
    irsa = render({"tensorboard": {"s3SecretName": "", "serviceAccountAnnotations": {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/tensorboard"}}})
    assert "envFrom" not in container(irsa)
    assert named(irsa, "ServiceAccount", TENSORBOARD)["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/tensorboard"}


# ---------------------------------------------------------------- a real TensorBoard on S3

BUCKET = "model-factory-artifacts"
READER_KEY, READER_SECRET = "tensorboard-reader", "tensorboard-reader-secret"
START_TIMEOUT_S = 120.0


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _wait(what: str, probe, proc: subprocess.Popen, log: Path, timeout_s: float = START_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"TensorBoard exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            value = probe()
            if value:
                return value
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        time.sleep(0.5)
    raise TimeoutError(f"TensorBoard: {what} not seen within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def test_tensorboard_reads_the_s3_logdir_with_a_read_only_key_and_sees_the_curve_grow(tmp_path):
    # The key the chart's Secret holds: list and read the models/ area, nothing else, no write.
    reader = {"name": "tensorboard", "credentials": [{"accessKey": READER_KEY, "secretKey": READER_SECRET}],
              "actions": [f"List:{BUCKET}/artifacts/models*", f"Read:{BUCKET}/artifacts/models/*"]}
    with SeaweedServer(tmp_path / "seaweed", bucket=BUCKET, identities=[reader]) as s3:
        # The orchestrator's copy, as the training op makes it while the run trains.
        store = S3ArtifactStore(BUCKET, prefix="artifacts", endpoint_url=s3.endpoint_url, region="us-east-1",
                                access_key_id=s3.access_key_id, secret_access_key=s3.secret_access_key)
        folder, other = "models/digits/checkpoints/run-live/", "models/digits/checkpoints/run-other/"
        events = tmp_path / "work" / "tensorboard"
        sync = EventFileSync(store, events, event_prefix(folder))
        reporter = TensorBoardReporter(_Quiet(), events)
        for step in (10, 20):
            reporter.custom({"kind": "telemetry", "step": step, "loss": 1.0 / step})
        assert sync.sync() == 1
        with TensorBoardReporter(_Quiet(), tmp_path / "other" / "tensorboard") as decoy:
            decoy.custom({"kind": "telemetry", "step": 5, "loss": 3.0})
        EventFileSync(store, tmp_path / "other" / "tensorboard", event_prefix(other)).sync()
        (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
        store.put_file(tmp_path / "rows.csv", "sources/digits/rows.csv")
        # The reader key is what the chart documents: it reads models/ and nothing else, and writes nothing.
        as_reader = s3.client(READER_KEY, READER_SECRET)
        with pytest.raises(Exception, match="AccessDenied"):
            as_reader.get_object(Bucket=BUCKET, Key="artifacts/sources/digits/rows.csv")
        with pytest.raises(Exception, match="AccessDenied"):
            as_reader.put_object(Bucket=BUCKET, Key=f"artifacts/{folder}tensorboard/forged", Body=b"x")

        # The chart's environment: only AWS_* from the Secret (no S3_ENDPOINT, TensorBoard's own variable).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
        env.update(AWS_ACCESS_KEY_ID=READER_KEY, AWS_SECRET_ACCESS_KEY=READER_SECRET,
                   AWS_ENDPOINT_URL=s3.endpoint_url, AWS_REGION="us-east-1", TMPDIR=str(tmp_path))
        (port,) = free_ports(1)
        log = tmp_path / "tensorboard.log"
        command = server_command(tensorboard_logdir(store), host="127.0.0.1", port=port, reload_s=1,
                                 path_prefix="/tensorboard")
        with log.open("w") as out:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}/tensorboard"
        try:
            run = "digits/checkpoints/run-live/tensorboard"
            decoy_run = "digits/checkpoints/run-other/tensorboard"

            def both_runs():
                names = _get_json(base + "/data/runs")
                return names if {run, decoy_run} <= set(names) else None

            runs = _wait("both runs", both_runs, proc, log)
            # The link's run filter keeps this run's curves and hides the other's.
            assert [r for r in runs if re.search(run_filter(folder), r)] == [run]
            scalars = base + "/data/plugin/scalars/scalars?" + urllib.parse.urlencode({"run": run, "tag": "train/loss"})

            def points(more_than: int):
                def probe():
                    try:
                        got = _get_json(scalars)
                    except urllib.error.HTTPError:
                        return None  # the run is listed before its tags are loaded
                    return got if len(got) > more_than else None
                return probe

            first = _wait("the first points", points(0), proc, log)
            assert [p[1] for p in first] == [10, 20]
            # The training goes on and the op copies again: TensorBoard reads the grown object on.
            for step in (30, 40):
                reporter.custom({"kind": "telemetry", "step": step, "loss": 1.0 / step})
            assert sync.sync() == 1
            grown = _wait("more points", points(2), proc, log)
            assert [p[1] for p in grown] == [10, 20, 30, 40]
            assert grown[-1][2] == pytest.approx(1 / 40)
        finally:
            reporter.close()
            os.killpg(proc.pid, 15)
            proc.wait(timeout=20)
        assert "AccessDenied" not in log.read_text()
