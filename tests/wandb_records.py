"""Read the records of an offline W&B run file (run-*.wandb), to check what a run holds without a
network. The file is W&B's transaction log: a 7-byte header (":W&B", magic, version), then 32 KiB
blocks of records, each a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)
and a piece of a serialised wandb_internal_pb2.Record."""

import json
import struct
from pathlib import Path

BLOCK = 32768


def records(path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            yield record
            buf = b""


def summarize_run(path) -> dict:
    """The run's name, project, entity, group, job type, tags, config, history keys, artifacts, final summary and
    exit code."""
    out = {"summary": {}, "config": {}}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out.update(name=r.run.display_name, group=r.run.run_group, job_type=r.run.job_type, tags=list(r.run.tags),
                       project=r.run.project, entity=r.run.entity)
            out["config"].update({u.key: json.loads(u.value_json) for u in r.run.config.update})
        elif kind == "config":
            out["config"].update({u.key: json.loads(u.value_json) for u in r.config.update})
        elif kind == "summary":
            out["summary"].update({u.key: json.loads(u.value_json) for u in r.summary.update if u.key})
        elif kind == "exit":
            out["exit_code"] = r.exit.exit_code
        elif kind == "history":
            out.setdefault("history_keys", set()).update(i.key or i.nested_key[0] for i in r.history.item)
            out.setdefault("history", []).append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                                  for i in r.history.item})
        elif kind == "artifact":
            out.setdefault("artifacts", {})[r.artifact.name] = [e.path for e in r.artifact.manifest.contents]
    return out
