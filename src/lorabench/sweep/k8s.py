"""Kubernetes: one Job manifest per cell of a sweep, rendered from the composed Hydra configs.

The sweep is expanded the way Hydra's basic sweeper does it (the experiment's hydra.sweeper.params,
then the command line's comma lists, which win for the same key), and every cell's config is
composed and checked against the schemas here, so a typo fails on your machine, not in a pod. In
the pod, train.py runs that one cell in single-run mode with its run dir set explicitly, on the
shared volume; `python bench.py sweep_dir=/data/outputs/<sweep>` then reports the sweep.
"""

from __future__ import annotations

import hashlib
import re

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from lorabench import __version__
from lorabench.core.config import Config
from lorabench.sweep import grid

NAMESPACE = "lorabench"
# The tag that `make image` and README's `docker build` give the image; a cluster pulls it from your
# registry as REGISTRY/lorabench:<version> (launchers/k8s_render.py --image).
IMAGE = f"lorabench:{__version__}"
DATA = "/data"  # the PVC: outputs/, cache/ (tokenised data), models/ (local weights)


def expand(overrides: list[str], compose) -> list[list[str]]:
    """The cells of `python train.py -m <overrides>`: a list of override lists, in Hydra's order."""
    given = OverridesParser.create().parse_overrides(overrides)
    fixed = [o.input_line for o in given if not o.is_sweep_override()]
    return grid.expand(overrides, compose(fixed, return_hydra_config=True).hydra.sweeper.params)


def dns_name(sweep: str, index: int, cell: list[str]) -> str:
    """A DNS-1123 label (lower-case alphanumerics and '-', at most 63): sweep, cell number, hash."""
    digest = hashlib.sha1(" ".join(cell).encode()).hexdigest()[:6]
    base = re.sub(r"[^a-z0-9-]+", "-", sweep.lower()).strip("-")[:45] or "sweep"
    return f"{base}-{index:03d}-{digest}"


def job(name: str, sweep: str, cell: list[str], gpus: int, image: str, nodes: int = 1) -> dict:
    """The Job of one cell. A multi-node cell (train.nnodes > 1) is an Indexed Job of `nodes` pods
    that find pod 0 through the headless Service of the same name (service()): each pod's index is
    its node rank (JOB_COMPLETION_INDEX), pod 0's stable DNS name the rendezvous address."""
    labels = {"app.kubernetes.io/name": "lorabench", "lorabench/sweep": re.sub(r"[^A-Za-z0-9_.-]", "-", sweep)[:63],
              "lorabench/cell": name}
    container = {
        "name": "cell",
        "image": image,
        "workingDir": "/app",
        "command": ["python", "train.py"],
        # One cell in single-run mode (an experiment may set MULTIRUN), in a run dir all can find.
        "args": [*cell, "hydra.mode=RUN", f"hydra.run.dir={DATA}/outputs/{sweep}/{name}"],
        "envFrom": [{"configMapRef": {"name": "lorabench-env"}}],
        # The W&B key only ever from a Secret, never in a manifest: kubectl create secret (k8s/README.md).
        "env": [{"name": "WANDB_API_KEY",
                 "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key", "optional": True}}}],
        "resources": {"limits": {"nvidia.com/gpu": gpus, "memory": f"{32 + 32 * gpus}Gi"},
                      "requests": {"cpu": str(4 + 4 * gpus), "memory": f"{32 + 32 * gpus}Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "data", "mountPath": DATA}, {"name": "shm", "mountPath": "/dev/shm"}],
    }
    spec_extra, pod_extra = {}, {}
    if nodes > 1:
        spec_extra = {"completionMode": "Indexed", "completions": nodes, "parallelism": nodes}
        pod_extra = {"subdomain": name}  # pod i is <name>-i.<name>: the Service below
        container["env"] += [{"name": "MASTER_ADDR", "value": f"{name}-0.{name}"},
                             {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)}]
        container["ports"] = [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels,
                     "annotations": {"lorabench/overrides": " ".join(cell)}},
        "spec": {
            "backoffLimit": 0,  # a failed cell is a result (its metrics.json says why), not a retry
            **spec_extra,
            "ttlSecondsAfterFinished": 7 * 24 * 3600,
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    **pod_extra,
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    # GPU nodes only (the label NVIDIA's GPU feature discovery sets), and their taint tolerated.
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [container],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "lorabench-data"}},
                                # NCCL and DataLoader workers need more shared memory than a pod's 64 MiB
                                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
                },
            },
        },
    }


def service(name: str) -> dict:
    """Headless Service giving a multi-node cell's pods stable DNS names (published before they are
    ready: the rendezvous happens before any readiness)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/name": "lorabench"}},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"lorabench/cell": name},
                     "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}]}}


RENDEZVOUS_PORT = 29500


def render(sweep: str, overrides: list[str], image: str, compose) -> list[list[dict]]:
    """The manifests of each cell (its Job; a multi-node cell's headless Service first); every
    cell's config is composed and type-checked first."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", sweep):
        raise ValueError(f"sweep name {sweep!r}: use lower-case letters, digits and '-' (it names Kubernetes Jobs)")
    jobs = []
    for i, cell in enumerate(expand(overrides, compose)):
        cfg = OmegaConf.to_object(compose(cell))  # Hydra's and the schemas' checks, here, not in the pod
        assert isinstance(cfg, Config)
        name = dns_name(sweep, i, cell)
        nodes = cfg.train.nnodes
        jobs.append(([service(name)] if nodes > 1 else []) + [job(name, sweep, cell, cfg.train.nproc, image, nodes)])
    return jobs
