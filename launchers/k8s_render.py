"""Render one Kubernetes Job per cell of a sweep (see k8s/README.md).

    python launchers/k8s_render.py --sweep seed-grid --image registry.example.com/lorabench:0.1.0 \
        --out k8s/rendered -- +experiment=seed_baseline seq_len=512,1024 batch=4,8
    kubectl apply -k k8s/base && kubectl apply -f k8s/rendered/seed-grid/
"""

import argparse
import sys
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from lorabench.sweep import k8s  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", required=True, help="sweep name: the Jobs' name prefix and the output dir")
    ap.add_argument("--image", default=k8s.IMAGE,
                    help=f"the lorabench image (docker/Dockerfile; make image and docker build tag it {k8s.IMAGE}):"
                         f" REGISTRY/{k8s.IMAGE} once pushed where the cluster pulls from")
    ap.add_argument("--out", default="k8s/rendered", help="one <job>.yaml per cell goes to <out>/<sweep>/")
    ap.add_argument("overrides", nargs="*", help="what you would give train.py -m")
    a = ap.parse_args()
    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        jobs = k8s.render(a.sweep, a.overrides, a.image,
                          lambda o, **kw: compose(config_name="train", overrides=list(o), **kw))
    out = Path(a.out) / a.sweep
    out.mkdir(parents=True, exist_ok=True)
    for docs in jobs:
        j = docs[-1]  # the Job (a multi-node cell's Service comes first)
        path = out / f"{j['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        print(f"{path}: {j['metadata']['annotations']['lorabench/overrides']}")
