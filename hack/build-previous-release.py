#!/usr/bin/env python3
"""Builds an earlier release of the project for the upgrade tests: its tree and its image.

    hack/build-previous-release.py COMMIT

Writes ``${DRA_GPU_CACHE:-~/.cache/dra-gpu}/previous/<sha>/``: ``tree/`` (``git archive`` of
COMMIT: its chart is ``tree/charts/dra-gpu``) and ``dra-gpu.tar``, that tree's own image (its
``hack/build-images.sh``, sharing the image cache: the Debian layer is reused) under another
name, ``dra-gpu.local/dra-gpu-previous:<sha12>``, so that a node can hold it beside the
current one (same chart version, same default name). ``images.json`` maps the archive to the
name, as ``hack/build-images.sh``'s does. Prints the directory on the last line of stdout;
logs go to stderr. Cached: a second call prints the directory at once.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = "io.containerd.image.name"
REF = "org.opencontainers.image.ref.name"


def log(message: str) -> None:
    print(f"[previous] {message}", file=sys.stderr, flush=True)


def renamed(source: Path, target: Path, name: str) -> None:
    """``source`` (an OCI layout tar of one image) as ``target``, the image called ``name``."""
    repository, tag = name.rsplit(":", 1)
    with tarfile.open(source) as src, tarfile.open(target, "w") as out:
        for member in src.getmembers():
            data = src.extractfile(member) if member.isfile() else None
            if member.name == "index.json" and data is not None:
                index = json.load(data)
                for manifest in index["manifests"]:
                    manifest.setdefault("annotations", {}).update({NAME: name, REF: tag})
                body = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
                member.size = len(body)
                out.addfile(member, io.BytesIO(body))
            else:
                out.addfile(member, data)
    log(f"{target}: {repository}:{tag}")


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} COMMIT")
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{sys.argv[1]}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise SystemExit(
            f"commit {sys.argv[1]} is not in {REPO}'s history (a shallow clone?): "
            f"{found.stderr.strip()}"
        )
    sha = found.stdout.strip()
    cache = Path(os.environ.get("DRA_GPU_CACHE", Path.home() / ".cache" / "dra-gpu"))
    out = cache / "previous" / sha
    if (out / "images.json").exists():
        print(out)
        return 0
    shutil.rmtree(out, ignore_errors=True)
    tree = out / "tree"
    tree.mkdir(parents=True)
    log(f"extracting {sha[:12]} into {tree}")
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", sha],
        capture_output=True,
        check=True,
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="tar")
    log("building its images (its own hack/build-images.sh)")
    built = subprocess.run(
        [str(tree / "hack" / "build-images.sh")],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        env={**os.environ, "DRA_GPU_CACHE": str(cache)},
    )
    images = Path(built.stdout.strip().splitlines()[-1])
    name = f"dra-gpu.local/dra-gpu-previous:{sha[:12]}"
    renamed(images / "dra-gpu.tar", out / "dra-gpu.tar.tmp", name)
    os.replace(out / "dra-gpu.tar.tmp", out / "dra-gpu.tar")
    (out / "images.json").write_text(json.dumps({"dra-gpu.tar": name}, indent=1) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
