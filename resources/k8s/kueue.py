"""Cluster-level queueing with Kueue: which LocalQueue a training Job goes to, at which priority.

Off by default. With the model-factory chart's `kueue.enabled`, the chart renders one ClusterQueue
per team (GPU quota per ResourceFlavor, borrowing within a cohort), a LocalQueue for each in the
training namespace, and WorkloadPriorityClasses named and valued like its PriorityClasses. Every
training Job is then created suspended and labelled for its team's LocalQueue: Kueue unsuspends it
once the queue's quota (nominal or borrowed) holds *all* of its pods at once, which is the
all-or-nothing admission a multi-node training needs, and orders waiting Jobs by the workload
priority class, so GPU quota and fair sharing between teams come from the cluster's batch system
as well as from Dagster's pools.

One configuration path, as for the RDMA profile (fabric.py): the chart writes the
`MODEL_FACTORY_KUEUE_*` keys into its ConfigMap, the Dagster pods load them as environment
variables, and `kueue_settings()` reads them. Pure: nothing here talks to a cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

# The labels Kueue's Job integration reads (kueue.x-k8s.io/v1beta1 and v1beta2 alike).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"

# ConfigMap keys (helm/model-factory/templates/configmap.yaml) -> the chart value each comes from.
ENV_ENABLED = "MODEL_FACTORY_KUEUE_ENABLED"
ENV_QUEUES = "MODEL_FACTORY_KUEUE_QUEUES"
# The PriorityClass names the chart already publishes; its WorkloadPriorityClasses carry the same.
ENV_TRAINING_PRIORITY = "MODEL_FACTORY_TRAINING_PRIORITY_CLASS"
ENV_ADHOC_PRIORITY = "MODEL_FACTORY_ADHOC_PRIORITY_CLASS"
# The second scheduler that bin-packs GPU nodes (templates/scheduler-profile.yaml); empty: default.
ENV_SCHEDULER_NAME = "MODEL_FACTORY_SCHEDULER_NAME"
CHART_VALUE = {
    ENV_ENABLED: "kueue.enabled",
    ENV_QUEUES: "kueue.teams",
    ENV_TRAINING_PRIORITY: "priorityClasses.training.name",
    ENV_ADHOC_PRIORITY: "priorityClasses.adhoc.name",
    ENV_SCHEDULER_NAME: "binPackingScheduler.schedulerName",
}

# LocalQueue and WorkloadPriorityClass names are object names (DNS subdomains) and label values,
# so they must also fit a label value: at most 63 characters.
_LABEL_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_TEAM = re.compile(r"^[a-z0-9_]+$")


class KueueSettingsError(ValueError):
    """The chart's Kueue keys, or a Job's team or priority class, contradict each other."""


@dataclass(frozen=True, kw_only=True)
class KueueSettings:
    """Where training Jobs queue when Kueue is on (one LocalQueue per team)."""

    queues: Mapping[str, str]  # platform team (core/spec.py PipelineSpec.team) -> LocalQueue name
    training_priority_class: str  # WorkloadPriorityClass of scheduled and new-data retrains
    adhoc_priority_class: str  # WorkloadPriorityClass of everything else (the lower one)

    def __post_init__(self) -> None:
        if not self.queues:
            raise KueueSettingsError(
                f"{CHART_VALUE[ENV_QUEUES]} lists no team: with kueue.enabled every training Job "
                "needs its team's LocalQueue; add at least one team to kueue.teams."
            )
        for team, queue in self.queues.items():
            if not _TEAM.match(team):
                raise KueueSettingsError(
                    f"{CHART_VALUE[ENV_QUEUES]}: team {team!r} is not a platform team name "
                    "(lowercase letters, digits and '_', as PipelineSpec.team)."
                )
            _check_name(f"{CHART_VALUE[ENV_QUEUES]} ({team})", queue)
        _check_name(CHART_VALUE[ENV_TRAINING_PRIORITY], self.training_priority_class)
        _check_name(CHART_VALUE[ENV_ADHOC_PRIORITY], self.adhoc_priority_class)

    @property
    def priority_classes(self) -> tuple[str, str]:
        return (self.training_priority_class, self.adhoc_priority_class)

    def to_environ(self) -> dict[str, str]:
        """The ConfigMap keys these settings are read from (the inverse of `kueue_settings`)."""
        return {
            ENV_ENABLED: "true",
            ENV_QUEUES: ",".join(f"{t}={q}" for t, q in sorted(self.queues.items())),
            ENV_TRAINING_PRIORITY: self.training_priority_class,
            ENV_ADHOC_PRIORITY: self.adhoc_priority_class,
        }


def _check_name(what: str, name: str) -> None:
    if len(name) > 63 or not _LABEL_NAME.match(name):
        raise KueueSettingsError(
            f"{what} is {name!r}: Kueue reads it from a label, so it must be a DNS label of at most "
            "63 characters (lowercase letters, digits, '-')."
        )


def parse_queues(raw: str) -> dict[str, str]:
    """`team=queue,team=queue` (the ConfigMap's form) as a mapping."""
    queues: dict[str, str] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        team, sep, queue = item.partition("=")
        if not sep or not team.strip() or not queue.strip():
            raise KueueSettingsError(
                f"{ENV_QUEUES} entry {item!r} is not 'team=localqueue'; the chart writes it from "
                f"{CHART_VALUE[ENV_QUEUES]}, re-render it instead of editing the ConfigMap."
            )
        team = team.strip()
        if team in queues:
            raise KueueSettingsError(f"{ENV_QUEUES} names team {team!r} twice; list each team once in kueue.teams.")
        queues[team] = queue.strip()
    return queues


def _enabled(environ: Mapping[str, Any]) -> bool:
    raw = str(environ.get(ENV_ENABLED, "")).strip().lower()
    if raw in ("", "false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise KueueSettingsError(f"{CHART_VALUE[ENV_ENABLED]} ({ENV_ENABLED}) is {raw!r}; use true or false")


def kueue_settings(environ: Mapping[str, Any]) -> KueueSettings | None:
    """The queueing the chart's ConfigMap describes, or None when Kueue is off (the default)."""
    if not _enabled(environ):
        return None
    missing = [k for k in (ENV_QUEUES, ENV_TRAINING_PRIORITY, ENV_ADHOC_PRIORITY) if not environ.get(k)]
    if missing:
        raise KueueSettingsError(
            f"{ENV_ENABLED} is true but {', '.join(missing)} not set: the model-factory chart's "
            "ConfigMap writes them together; load all of it (envConfigMaps) in the Dagster pods."
        )
    return KueueSettings(
        queues=parse_queues(str(environ[ENV_QUEUES])),
        training_priority_class=str(environ[ENV_TRAINING_PRIORITY]).strip(),
        adhoc_priority_class=str(environ[ENV_ADHOC_PRIORITY]).strip(),
    )


def kueue_keys(environ: Mapping[str, Any]) -> dict[str, str]:
    """Only the Kueue keys of `environ` (the scheduler's apart): what a launcher keeps of the ConfigMap."""
    return {k: str(environ[k]) for k in CHART_VALUE if k in environ and k != ENV_SCHEDULER_NAME}


def scheduler_name(environ: Mapping[str, Any]) -> str | None:
    """The bin-packing scheduler the training pods use, or None for the cluster's default."""
    name = str(environ.get(ENV_SCHEDULER_NAME, "")).strip()
    if name:
        _check_name(CHART_VALUE[ENV_SCHEDULER_NAME], name)
    return name or None


def queue_labels(team: str | None, priority_class: str | None, settings: KueueSettings) -> dict[str, str]:
    """The labels that put one training Job into its team's LocalQueue at its priority.

    `priority_class` is the pod's PriorityClass (GpuRequest.priority_class); the chart's
    WorkloadPriorityClasses share the names of its two PriorityClasses. A Job without one is
    ad-hoc work: it queues at the lower class, so it never jumps ahead of a scheduled retrain. A
    pipeline's own PriorityClass, which has no WorkloadPriorityClass, gets no label: Kueue then
    takes the workload's priority from the pod's PriorityClass, as its documentation says."""
    if not team:
        raise KueueSettingsError(
            "TrainingJob.team is not set, but with kueue.enabled (helm/model-factory) every training "
            "Job goes to its team's LocalQueue: set team (ops/training_config.training_job takes "
            "it from the pipeline's PipelineSpec.team)."
        )
    queue = settings.queues.get(team)
    if queue is None:
        raise KueueSettingsError(
            f"team {team!r} has no Kueue LocalQueue; the chart has queues for {sorted(settings.queues)}. "
            f"Add the team to kueue.teams in the helm/model-factory values (with its GPU quota), "
            "or set the pipeline's team to one of those."
        )
    labels = {QUEUE_LABEL: queue}
    priority = priority_class or settings.adhoc_priority_class
    if priority in settings.priority_classes:
        labels[PRIORITY_LABEL] = priority
    return labels


def queued_job(manifest: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """A copy of a batch/v1 Job manifest that waits in a Kueue LocalQueue.

    `spec.suspend: true` keeps the Job controller from creating pods until Kueue admits the Job
    (it then unsuspends it, after adding the admitted ResourceFlavor's node labels to the pod
    template). Created unsuspended, the pods would be scheduled before Kueue ever saw the Job."""
    metadata = dict(manifest["metadata"])
    metadata["labels"] = {**metadata.get("labels", {}), **labels}
    return {**manifest, "metadata": metadata, "spec": {**manifest["spec"], "suspend": True}}


def is_suspended(job: Any) -> bool:
    """Whether a V1Job (as the API returns it) is still suspended, i.e. waiting in its queue."""
    spec = getattr(job, "spec", None)
    return bool(spec is not None and spec.suspend)
