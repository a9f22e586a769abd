"""``deploy/kuberay/rayjob.yaml`` checked against KubeRay's RayJob CRD and against this repository.

The schema below covers the levels the manifest uses: the RayJob, its ``spec``,
``rayClusterSpec``, ``headGroupSpec``, the ``workerGroupSpecs`` items, the pod templates and their
containers. At each level it lists every key the CRD defines there, with its type and the keys the
CRD requires; a key the manifest does not use may be marked "not looked into" (``ANY_*``), but
it is still a known key. It was written by hand from KubeRay's CRD file
``ray-operator/config/crd/bases/ray.io_rayjobs.yaml`` in ray-project/kuberay at commit
007412988d067642eeb67f8b80c373fc9ab401dd (the CRD's ``v1`` version), a KubeRay v1.1 CRD:
controller-gen v0.13.0, with ``activeDeadlineSeconds`` and ``submissionMode`` (new in v1.1.0) and
without ``backoffLimit`` (new in v1.2.0). Later releases add optional keys at these levels and no
longer require ``rayStartParams``, so a manifest that passes here is accepted by them too.

Nothing here starts Kubernetes or Ray, or touches the network: the file is read with PyYAML
and the job's config with :func:`pipeline.config.loading.load_config`.
"""

from __future__ import annotations

import copy
import difflib
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.config.loading import load_config

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "deploy/kuberay/rayjob.yaml"

# --- A small schema language: just what the CRD's levels used here need --------------------

STR, INT, BOOL, NUM = "string", "integer", "boolean", "number"
QUANTITY = "quantity"
"""A Kubernetes quantity: the CRD's ``anyOf: [integer, string]`` with the pattern below."""
QUANTITY_PATTERN = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
ANY = "any"
"""A value these tests do not look into."""


def obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object with these keys only (the CRD's ``properties``), ``required`` among them."""
    return {"type": "object", "properties": properties, "required": required}


def map_of(values: Any) -> dict[str, Any]:
    """An object with any keys (the CRD's ``additionalProperties``)."""
    return {"type": "map", "values": values}


def array_of(items: Any) -> dict[str, Any]:
    return {"type": "array", "items": items}


ANY_OBJECT = map_of(ANY)
ANY_ARRAY = array_of(ANY)

# --- The CRD's levels (ray.io_rayjobs.yaml, v1, at the commit named above) -----------------

ENV_REF = obj({"name": STR, "optional": BOOL})
CONTAINER = obj(
    {
        "args": array_of(STR),
        "command": array_of(STR),
        "env": array_of(obj({"name": STR, "value": STR, "valueFrom": ANY_OBJECT}, required=("name",))),
        "envFrom": array_of(obj({"configMapRef": ENV_REF, "prefix": STR, "secretRef": ENV_REF})),
        "image": STR,
        "imagePullPolicy": STR,
        "lifecycle": ANY_OBJECT,
        "livenessProbe": ANY_OBJECT,
        "name": STR,
        "ports": array_of(
            obj(
                {"containerPort": INT, "hostIP": STR, "hostPort": INT, "name": STR, "protocol": STR},
                required=("containerPort",),
            )
        ),
        "readinessProbe": ANY_OBJECT,
        "resizePolicy": ANY_ARRAY,
        "resources": obj(
            {
                "claims": array_of(obj({"name": STR}, required=("name",))),
                "limits": map_of(QUANTITY),
                "requests": map_of(QUANTITY),
            }
        ),
        "restartPolicy": STR,
        "securityContext": ANY_OBJECT,
        "startupProbe": ANY_OBJECT,
        "stdin": BOOL,
        "stdinOnce": BOOL,
        "terminationMessagePath": STR,
        "terminationMessagePolicy": STR,
        "tty": BOOL,
        "volumeDevices": ANY_ARRAY,
        "volumeMounts": ANY_ARRAY,
        "workingDir": STR,
    },
    required=("name",),
)
POD_SPEC = obj(
    {
        "activeDeadlineSeconds": INT,
        "affinity": ANY_OBJECT,
        "automountServiceAccountToken": BOOL,
        "containers": array_of(CONTAINER),
        "dnsConfig": ANY_OBJECT,
        "dnsPolicy": STR,
        "enableServiceLinks": BOOL,
        "ephemeralContainers": ANY_ARRAY,
        "hostAliases": ANY_ARRAY,
        "hostIPC": BOOL,
        "hostNetwork": BOOL,
        "hostPID": BOOL,
        "hostUsers": BOOL,
        "hostname": STR,
        "imagePullSecrets": array_of(obj({"name": STR})),
        "initContainers": array_of(CONTAINER),
        "nodeName": STR,
        "nodeSelector": map_of(STR),
        "os": ANY_OBJECT,
        "overhead": map_of(QUANTITY),
        "preemptionPolicy": STR,
        "priority": INT,
        "priorityClassName": STR,
        "readinessGates": ANY_ARRAY,
        "resourceClaims": ANY_ARRAY,
        "restartPolicy": STR,
        "runtimeClassName": STR,
        "schedulerName": STR,
        "schedulingGates": ANY_ARRAY,
        "securityContext": ANY_OBJECT,
        "serviceAccount": STR,
        "serviceAccountName": STR,
        "setHostnameAsFQDN": BOOL,
        "shareProcessNamespace": BOOL,
        "subdomain": STR,
        "terminationGracePeriodSeconds": INT,
        "tolerations": ANY_ARRAY,
        "topologySpreadConstraints": ANY_ARRAY,
        "volumes": ANY_ARRAY,
    },
    required=("containers",),
)
POD_TEMPLATE = obj(
    {
        "metadata": obj(
            {
                "annotations": map_of(STR),
                "finalizers": array_of(STR),
                "labels": map_of(STR),
                "name": STR,
                "namespace": STR,
            }
        ),
        "spec": POD_SPEC,
    }
)
HEAD_GROUP_SPEC = obj(
    {
        "enableIngress": BOOL,
        "headService": ANY_OBJECT,
        "rayStartParams": map_of(STR),
        "serviceType": STR,
        "template": POD_TEMPLATE,
    },
    required=("rayStartParams", "template"),
)
WORKER_GROUP_SPEC = obj(
    {
        "groupName": STR,
        "maxReplicas": INT,
        "minReplicas": INT,
        "numOfHosts": INT,
        "rayStartParams": map_of(STR),
        "replicas": INT,
        "scaleStrategy": obj({"workersToDelete": array_of(STR)}),
        "template": POD_TEMPLATE,
    },
    required=("groupName", "maxReplicas", "minReplicas", "rayStartParams", "template"),
)
RAY_CLUSTER_SPEC = obj(
    {
        "autoscalerOptions": ANY_OBJECT,
        "enableInTreeAutoscaling": BOOL,
        "headGroupSpec": HEAD_GROUP_SPEC,
        "headServiceAnnotations": map_of(STR),
        "rayVersion": STR,
        "suspend": BOOL,
        "workerGroupSpecs": array_of(WORKER_GROUP_SPEC),
    },
    required=("headGroupSpec",),
)
RAYJOB_SPEC = obj(
    {
        "activeDeadlineSeconds": INT,
        "clusterSelector": map_of(STR),
        "entrypoint": STR,
        "entrypointNumCpus": NUM,
        "entrypointNumGpus": NUM,
        "entrypointResources": STR,
        "jobId": STR,
        "metadata": map_of(STR),
        "rayClusterSpec": RAY_CLUSTER_SPEC,
        "runtimeEnvYAML": STR,
        "shutdownAfterJobFinishes": BOOL,
        "submissionMode": STR,
        "submitterPodTemplate": POD_TEMPLATE,
        "suspend": BOOL,
        "ttlSecondsAfterFinished": INT,
    },
    required=("entrypoint",),
)
RAYJOB = obj(
    {"apiVersion": STR, "kind": STR, "metadata": ANY_OBJECT, "spec": RAYJOB_SPEC, "status": ANY_OBJECT}
)

# A ConfigMap's values must be strings (Kubernetes refuses `KEY: 5`).
CONFIG_MAP = obj(
    {"apiVersion": STR, "kind": STR, "metadata": ANY_OBJECT, "data": map_of(STR)},
    required=("apiVersion", "kind", "metadata"),
)

_SCALARS = {
    STR: lambda v: isinstance(v, str),
    INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
    BOOL: lambda v: isinstance(v, bool),
    NUM: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def _child(path: str, key: Any) -> str:
    key = str(key)
    if re.fullmatch(r"[A-Za-z0-9_-]+", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def problems(value: Any, schema: Any, path: str = "") -> list[str]:
    """Every way ``value`` breaks ``schema``, each as ``path: what`` (path like
    ``spec.rayClusterSpec.workerGroupSpecs[0].replicas``); empty when it fits."""
    where = path or "(top)"
    if schema == ANY:
        return []
    if schema == QUANTITY:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return [f"{where}: expected a quantity (integer or string), got {type(value).__name__} {value!r}"]
        if isinstance(value, str) and not QUANTITY_PATTERN.match(value):
            return [f"{where}: {value!r} is not a quantity"]
        return []
    if isinstance(schema, str):
        if _SCALARS[schema](value):
            return []
        return [f"{where}: expected {schema}, got {type(value).__name__} {value!r}"]
    kind = schema["type"]
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: expected array, got {type(value).__name__} {value!r}"]
        found = []
        for i, item in enumerate(value):
            found += problems(item, schema["items"], f"{path}[{i}]")
        return found
    if not isinstance(value, dict):
        return [f"{where}: expected object, got {type(value).__name__} {value!r}"]
    found = []
    if kind == "map":
        for key, item in value.items():
            found += problems(item, schema["values"], _child(path, key))
        return found
    known = schema["properties"]
    found += [f"{where}: missing required key {key!r}" for key in schema["required"] if key not in value]
    for key, item in value.items():
        if key in known:
            found += problems(item, known[key], _child(path, key))
        else:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            found.append(f"{_child(path, key)}: unknown key{hint}")
    return found


# --- The manifest -------------------------------------------------------------------------

ENV_REFERENCE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def _documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")) if doc is not None]


def _one(kind: str) -> dict[str, Any]:
    found = [doc for doc in _documents() if doc.get("kind") == kind]
    assert len(found) == 1, f"{MANIFEST.name} holds {len(found)} {kind} documents, expected 1"
    return found[0]


@pytest.fixture
def rayjob() -> dict[str, Any]:
    return _one("RayJob")


@pytest.fixture
def config_map() -> dict[str, Any]:
    return _one("ConfigMap")


def _containers(rayjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The head, worker and submitter containers, by role."""
    spec = rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    return {
        "head": cluster["headGroupSpec"]["template"]["spec"]["containers"][0],
        "worker": cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0],
        "submitter": spec["submitterPodTemplate"]["spec"]["containers"][0],
    }


def rayjob_entrypoint() -> str:
    """The RayJob's entrypoint as written, ``$VARS`` unexpanded: the command that
    tests/test_cotenancy.py submits to its multi-node cluster."""
    return _one("RayJob")["spec"]["entrypoint"]


def _entrypoint(rayjob: dict[str, Any], env: dict[str, str]) -> tuple[list[str], str, list[str]]:
    """(argv, the --config value, the --set values) of the entrypoint with its ``$VARS``
    expanded from ``env`` as the submitter's shell does: expansion, then word splitting."""
    text = rayjob["spec"]["entrypoint"]
    missing = set(ENV_REFERENCE.findall(text)) - set(env)
    assert not missing, f"the entrypoint refers to {sorted(missing)}, which the ConfigMap does not set"
    argv = shlex.split(ENV_REFERENCE.sub(lambda m: env[m.group(1)], text))
    config = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"]
    sets = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--set"]
    assert len(config) == 1, f"entrypoint needs one --config FILE: {argv}"
    return argv, config[0], sets


def _cpus(quantity: int | str) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


# --- Tests --------------------------------------------------------------------------------


def test_manifest_fits_the_rayjob_crd(rayjob, config_map):
    assert problems(rayjob, RAYJOB) == []
    assert problems(config_map, CONFIG_MAP) == []


def test_is_a_ray_io_v1_rayjob(rayjob, config_map):
    assert rayjob["apiVersion"] == "ray.io/v1"
    assert rayjob["kind"] == "RayJob"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", rayjob["metadata"]["name"])
    assert (config_map["apiVersion"], config_map["kind"]) == ("v1", "ConfigMap")


def test_entrypoint_config_exists_and_loads_with_its_overrides(rayjob, config_map):
    env = config_map["data"]
    argv, config, sets = _entrypoint(rayjob, env)
    assert argv[:2] == ["python", "jobs/train.py"]
    assert (REPO / argv[1]).is_file()
    assert (REPO / config).is_file(), f"--config {config} is not in the repository"

    cfg = load_config(REPO / config, sets)

    assert cfg.run.storage_path == env["SIMCSE_STORAGE_PATH"]
    assert cfg.run.output_dir == env["SIMCSE_OUTPUT_DIR"]
    assert cfg.model.name_or_path == "bert-base-uncased"  # SIMCSE_SETTINGS: the pods reach the hub
    # Unset, so the job takes MLFLOW_TRACKING_URI from the pod's environment.
    assert cfg.tracking.uri is None
    assert cfg.train.gpus_per_worker > 0


def test_the_environment_the_job_reads_comes_from_the_config_map(rayjob, config_map):
    needed = set(ENV_REFERENCE.findall(rayjob["spec"]["entrypoint"])) | {"MLFLOW_TRACKING_URI"}
    assert needed <= set(config_map["data"]), (
        f"missing from the ConfigMap: {needed - set(config_map['data'])}"
    )
    # $VARS expand in the submitter's shell (or the job's on the head); the driver on the head
    # reads MLFLOW_TRACKING_URI; workers write checkpoints with the storage credentials.
    for role, container in _containers(rayjob).items():
        names = [ref["configMapRef"]["name"] for ref in container.get("envFrom", []) if "configMapRef" in ref]
        assert config_map["metadata"]["name"] in names, f"the {role} container lacks the ConfigMap in envFrom"


def test_one_gpu_worker_group_and_no_training_on_the_head(rayjob):
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert len(cluster["workerGroupSpecs"]) == 1
    group = cluster["workerGroupSpecs"][0]
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) >= 1
    params = cluster["headGroupSpec"]["rayStartParams"]
    assert params.get("num-gpus") == "0"


def test_the_worker_group_fits_the_config(rayjob, config_map):
    _, config, sets = _entrypoint(rayjob, config_map["data"])
    cfg = load_config(REPO / config, sets)
    group = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    miner = cfg.runs_miner
    gpus = cfg.train.num_workers * cfg.train.gpus_per_worker + (cfg.mining.num_gpus if miner else 0)
    cpus = cfg.train.num_workers * cfg.train.cpus_per_worker + (cfg.mining.num_cpus if miner else 0)
    assert gpus <= group["replicas"] * int(limits["nvidia.com/gpu"])
    assert cpus <= group["replicas"] * _cpus(limits["cpu"])


def test_ray_version_is_inside_the_pin(rayjob):
    pin = re.search(r'"ray\[[^\]]*\]>=([0-9.]+),<([0-9.]+)"', (REPO / "pyproject.toml").read_text())
    assert pin, "no ray[...]>=X,<Y pin in pyproject.toml"

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("."))

    ray_version = rayjob["spec"]["rayClusterSpec"]["rayVersion"]
    assert version(pin.group(1)) <= version(ray_version) < version(pin.group(2))


def test_runtime_env_passes_the_git_commit(rayjob):
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert isinstance(runtime_env, dict)
    env_vars = runtime_env["env_vars"]
    # Ray wants env_vars as strings; an unquoted sha of digits only would be a number.
    assert all(isinstance(value, str) for value in env_vars.values())
    assert env_vars.get("SIMCSE_GIT_COMMIT")


def test_cluster_is_deleted_after_the_job_and_one_image_runs_everywhere(rayjob):
    spec = rayjob["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    assert len({container["image"] for container in _containers(rayjob).values()}) == 1
    assert spec["submitterPodTemplate"]["spec"]["restartPolicy"] in ("Never", "OnFailure")  # a Job's rule


def _set(*keys: Any, value: Any):
    def mutate(doc):
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value

    return mutate


def _drop(*keys: Any):
    def mutate(doc):
        for key in keys[:-1]:
            doc = doc[key]
        del doc[keys[-1]]

    return mutate


def _rename(*keys: Any, to: str):
    def mutate(doc):
        for key in keys[:-1]:
            doc = doc[key]
        doc[to] = doc.pop(keys[-1])

    return mutate


CLUSTER = ("spec", "rayClusterSpec")
WORKER = (*CLUSTER, "workerGroupSpecs", 0)
WORKER_CONTAINER = (*WORKER, "template", "spec", "containers", 0)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (
            _rename(*CLUSTER, "workerGroupSpecs", to="workerGroupSpec"),
            "spec.rayClusterSpec.workerGroupSpec: unknown key (did you mean 'workerGroupSpecs'?)",
        ),
        (
            _rename("spec", "ttlSecondsAfterFinished", to="ttlSecondAfterFinished"),
            "spec.ttlSecondAfterFinished: unknown key (did you mean 'ttlSecondsAfterFinished'?)",
        ),
        (
            _rename(*WORKER_CONTAINER, "resources", "limits", to="limit"),
            "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].resources.limit: unknown key",
        ),
        (
            _set(*WORKER, "replicas", value="1"),
            "spec.rayClusterSpec.workerGroupSpecs[0].replicas: expected integer",
        ),
        (
            _set(*CLUSTER, "headGroupSpec", "rayStartParams", "num-gpus", value=0),
            "spec.rayClusterSpec.headGroupSpec.rayStartParams.num-gpus: expected string",
        ),
        (
            _set(*WORKER_CONTAINER, "resources", "limits", "cpu", value=0.5),
            "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].resources.limits.cpu: "
            "expected a quantity",
        ),
        (
            _set("spec", "shutdownAfterJobFinishes", value="true"),
            "spec.shutdownAfterJobFinishes: expected boolean",
        ),
        (
            _drop(*WORKER, "groupName"),
            "spec.rayClusterSpec.workerGroupSpecs[0]: missing required key 'groupName'",
        ),
        (
            _drop(*CLUSTER, "headGroupSpec", "template"),
            "spec.rayClusterSpec.headGroupSpec: missing required key 'template'",
        ),
        (
            _drop(*WORKER_CONTAINER, "name"),
            "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0]: missing required key 'name'",
        ),
        (_drop("spec", "entrypoint"), "spec: missing required key 'entrypoint'"),
    ],
    ids=[
        "unknown-workerGroupSpec",
        "unknown-spec-key",
        "unknown-resources-key",
        "replicas-as-string",
        "rayStartParams-not-string",
        "quantity-as-float",
        "bool-as-string",
        "worker-without-groupName",
        "head-without-template",
        "container-without-name",
        "no-entrypoint",
    ],
)
def test_checker_names_the_bad_path(rayjob, mutate, expected):
    broken = copy.deepcopy(rayjob)
    mutate(broken)
    found = problems(broken, RAYJOB)
    assert any(problem.startswith(expected) for problem in found), found


def test_the_cluster_launcher_config_submits_the_same_entrypoint(rayjob):
    """cluster.yaml's usage submits the RayJob's entrypoint: one command on every kind of
    cluster, the one the multi-node test runs."""
    lines = (REPO / "cluster.yaml").read_text(encoding="utf-8").splitlines()
    usage = " ".join(line.lstrip("#").strip().rstrip("\\").strip() for line in lines[:14])
    submitted = usage.split(" ray job submit --working-dir . -- ", 1)[1].split(" ray down", 1)[0]
    assert " ".join(submitted.split()) == " ".join(rayjob["spec"]["entrypoint"].split()), submitted
