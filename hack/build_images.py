"""Builds the test cluster's images as OCI archives, without a daemon or a registry.

Run by hack/build-images.sh (which installs mmdebstrap/busybox-static and holds the cache lock).
Writes ``<cache>/<key>/`` holding three archives for ``ctr -n k8s.io images import``, and
prints that directory as the last line of stdout (logs go to stderr):

- ``dra-gpu.tar``: the project's image, named as the chart pulls it by default
  (``image.repository`` of charts/dra-gpu/values.yaml, tag = Chart.yaml's appVersion). It
  follows the repository's Dockerfile: the base is a Debian rootfs from ``mmdebstrap`` in place
  of ``python:3.11-slim-bookworm`` (same Debian suite and Python minor, checked); the builder
  stage's RUN/COPY/WORKDIR steps run as written in a chroot of that rootfs; the final stage's
  ``COPY --from=builder`` takes the venv; Env/User/Entrypoint/Cmd/Labels come from the final
  stage (hack/oci_image.py parses them). python:3.11-slim has its interpreter at
  /usr/local/bin/python3.11; here it is Debian's /usr/bin/python3 (3.11.2): the venv's
  bin/python links to whichever the base has, and the image runs everything through
  /opt/dra-gpu/bin, so nothing else sees the difference. The layers: the rootfs, the venv with
  the dependencies (pyproject's list, installed after the Dockerfile's steps before its first
  COPY, as Docker's cache would keep them), and the project (the rest of the builder stage).
  Each is cached on its inputs, so a code change re-runs only the last one.
- ``pause.tar``: ``registry.k8s.io/pause:3.10.1``, hack/pause (static Go), the sandbox image.
- ``workload.tar``: ``dra-gpu.local/workload:1``, Debian's static busybox with its applet links,
  for demo and test pods (``sh -c 'env; sleep 3600'``, ``cat``).
- ``tutorial-workload.tar``: the same busybox under the tutorial's image name
  (``ghcr.io/iximiuz/labs/nginx:alpine``; no registry here): prints its environment, serves HTTP.

Needs root when it builds (mmdebstrap, overlay mounts, chroot); it re-executes itself in a
private mount namespace, so every mount it makes goes away with it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import oci_image as oci

# The environment of the base image, in place of python:3.11-slim's (its PATH starts with
# /usr/local/bin for its own Python; Debian's is in /usr/bin): Docker's default PATH and the
# locale python:3.11-slim sets.
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
# python-is-python3: python:3.11-slim has `python`, and the Dockerfile's RUN uses it.
ROOTFS_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
# As debian:*-slim: no manuals, docs (but copyrights), info or translations.
DPKG_OPTS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
)
MMDEBSTRAP_OPTS = (
    "--variant=minbase",
    "--mode=root",
    '--aptopt=APT::Install-Recommends "false"',
    # Merged /usr by symlinks, as Debian's images have it, without the usrmerge package (which
    # would pull in perl).
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    # The runtime provides these; the host's must not end up in the image.
    '--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname"',
)
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY = "http://deb.debian.org/debian-security"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
WORKLOAD_IMAGE = "dra-gpu.local/workload:1"
TUTORIAL_IMAGE = "ghcr.io/iximiuz/labs/nginx:alpine"  # crds-examples/recomendador.yaml
TUTORIAL_COMMAND = (
    "env | sort; mkdir -p /tmp/www && echo ok > /tmp/www/index.html && "
    "exec httpd -f -p 80 -h /tmp/www"
)
# Layer mtimes are clamped to this (and pip/py_compile see it as SOURCE_DATE_EPOCH, which makes
# every .pyc hash-checked, so the clamping cannot make them stale): 2025-01-01T00:00:00Z.
DEFAULT_EPOCH = 1735689600
# Bump when the recipe changes in a way the hashed inputs do not show.
RECIPE = "1"

HACK = Path(__file__).resolve().parent


def log(msg: str) -> None:
    print(f"[images {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _sha(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def python_base(ref: str) -> tuple[str, str]:
    """``python:3.11.13-slim-bookworm`` -> (``3.11``, ``bookworm``)."""
    m = re.fullmatch(r"(?:docker\.io/(?:library/)?)?python:(\d+\.\d+)(?:\.\d+)?-slim-(\w+)", ref)
    if not m:
        raise oci.DockerfileError(
            f"base image {ref!r}: this builder replaces python:<version>-slim-<debian suite>"
            " images with a Debian rootfs, and knows no others"
        )
    return m.group(1), m.group(2)


def chart_image(repo: Path) -> str:
    """The image reference the chart uses by default: image.repository + appVersion."""
    values = (repo / "charts/dra-gpu/values.yaml").read_text()
    m = re.search(r"^image:\n(?:[ \t]+.*\n)*?[ \t]+repository:[ \t]*\"?([^\s\"]+)", values, re.M)
    chart = (repo / "charts/dra-gpu/Chart.yaml").read_text()
    v = re.search(r"^appVersion:[ \t]*\"?([^\s\"]+)", chart, re.M)
    if not m or not v:
        raise SystemExit("cannot read image.repository / appVersion from charts/dra-gpu")
    return f"{m.group(1)}:{v.group(1)}"


@dataclass
class Recipe:
    """What the Dockerfile asks for, checked against what this builder can do."""

    repo: Path
    dockerfile: oci.Dockerfile
    builder: oci.Stage
    venv: str
    python: str
    suite: str
    prefix: list[oci.Step]  # the builder's steps before its first COPY (the deps layer)
    rest: list[oci.Step]  # the others (the project layer)
    dependencies: list[str]
    ignore: oci.DockerIgnore

    @property
    def config(self) -> dict[str, object]:
        return oci.image_config(self.dockerfile.final)


def load_recipe(repo: Path) -> Recipe:
    text = (repo / "Dockerfile").read_text()
    df = oci.parse_dockerfile(text, BASE_ENV)
    final = df.final
    copies = [s for s in final.steps if s.keyword == "COPY"]
    others = [s for s in final.steps if s.keyword != "COPY"]
    if others or len(copies) != 1 or not isinstance(copies[0].value, oci.Copy):
        raise oci.DockerfileError(
            "the final stage must have exactly one build step, COPY --from=<builder stage>"
            f" (got {[f'line {s.lineno}: {s.keyword}' for s in final.steps]})"
        )
    copy = copies[0].value
    if copy.from_stage is None or len(copy.sources) != 1 or copy.sources[0] != copy.dest:
        raise oci.DockerfileError(
            f"line {copies[0].lineno}: final COPY must be --from=<stage> <dir> <same dir>"
        )
    builder = df.stage(copy.from_stage)
    if builder.base != final.base:
        raise oci.DockerfileError("the builder and final stages must start from the same image")
    for step in builder.steps:
        if isinstance(step.value, oci.Copy) and step.value.from_stage is not None:
            raise oci.DockerfileError(f"line {step.lineno}: COPY --from in the builder stage")
    first_copy = next(i for i, s in enumerate(builder.steps) if s.keyword == "COPY")
    python, suite = python_base(final.base)
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    ignore_file = repo / ".dockerignore"
    return Recipe(
        repo=repo,
        dockerfile=df,
        builder=builder,
        venv=copy.dest.rstrip("/"),
        python=python,
        suite=suite,
        prefix=builder.steps[:first_copy],
        rest=builder.steps[first_copy:],
        dependencies=list(pyproject["project"]["dependencies"]),
        ignore=oci.DockerIgnore(ignore_file.read_text() if ignore_file.exists() else ""),
    )


# ---------------------------------------------------------------------------------------------
# Keys


def _file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Keys:
    base: str
    deps: str
    project: str
    pause: str
    workload: str
    out: str


def compute_keys(recipe: Recipe, epoch: int, busybox: Path) -> Keys:
    repo = recipe.repo
    tools = [_file_sha(HACK / "oci_image.py"), _file_sha(HACK / "build_images.py"), RECIPE]
    # The base and deps layers take a minute or two each: their keys hold their own inputs only
    # (bump RECIPE when their making changes); the cheap layers also change with the tools.
    base = _sha(
        "base",
        recipe.suite,
        recipe.python,
        ROOTFS_PACKAGES,
        DPKG_OPTS,
        MMDEBSTRAP_OPTS,
        epoch,
        RECIPE,
    )
    prefix = [(s.keyword, s.value, dict(s.env), s.workdir) for s in recipe.prefix]
    deps = _sha("deps", base, prefix, recipe.dependencies, recipe.venv)
    copies = [s.value for s in recipe.rest if isinstance(s.value, oci.Copy)]
    files = oci.copy_source_files(repo, copies, recipe.ignore)
    project = _sha(
        "project",
        deps,
        (repo / "Dockerfile").read_text(),
        [(s.keyword, s.value, dict(s.env), s.workdir) for s in recipe.rest],
        oci.tree_digest(repo, files),
        chart_image(repo),
        tools,
    )
    pause = _sha("pause", oci.tree_digest(HACK / "pause", ["go.mod", "main.go"]), epoch, tools)
    workload = _sha("workload", _file_sha(busybox), epoch, tools)
    return Keys(base, deps, project, pause, workload, _sha(project, pause, workload)[:20])


# ---------------------------------------------------------------------------------------------
# Steps


def _run(argv: Sequence[str | Path], **kw: Any) -> None:
    subprocess.run([str(a) for a in argv], check=True, stdout=sys.stderr, **kw)


@contextlib.contextmanager
def overlay_chroot(lowers: Sequence[Path], work: Path) -> Iterator[tuple[Path, Path]]:
    """An overlay of ``lowers`` (first on top) with its upper dir under ``work``, ready to chroot
    into (/proc, /dev, the host's resolv.conf). Yields (merged, upper)."""
    upper, ovl_work, merged = work / "upper", work / "work", work / "merged"
    for d in (upper, ovl_work, merged):
        d.mkdir(parents=True)
    lower = ":".join(str(p) for p in lowers)
    _run(["mount", "-t", "overlay", "overlay", "-o",
          f"lowerdir={lower},upperdir={upper},workdir={ovl_work}", merged])  # fmt: skip
    try:
        _run(["mount", "-t", "proc", "proc", merged / "proc"])
        _run(["mount", "--rbind", "/dev", merged / "dev"])
        resolv = merged / "etc/resolv.conf"
        if not resolv.exists():
            resolv.touch()
        _run(["mount", "--bind", os.path.realpath("/etc/resolv.conf"), resolv])
        if HOST_CA:
            (merged / HOST_CA_IN_CHROOT.lstrip("/")).touch()
            _run(["mount", "--bind", "-o", "ro", HOST_CA, merged / HOST_CA_IN_CHROOT.lstrip("/")])
        yield merged, upper
    finally:
        subprocess.run(["umount", "-R", str(merged)], check=False)
        shutil.rmtree(ovl_work, ignore_errors=True)


def run_in_chroot(root: Path, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> None:
    def enter() -> None:
        os.chroot(root)
        os.chdir(cwd)

    log(f"  $ {' '.join(argv)}")
    # Its output (pip's, mostly) only when it fails: `make run` stays readable.
    result = subprocess.run(
        list(argv),
        env=dict(env),
        preexec_fn=enter,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        check=False,
    )
    if result.returncode != 0:
        sys.stderr.buffer.write(result.stdout)
        raise subprocess.CalledProcessError(result.returncode, argv)


# How this host reaches the package index (a proxy, a mirror, a CA of its own): passed to the
# build steps' pip as it is (it is not recorded in the image; only /opt/dra-gpu is copied).
PASS_THROUGH = (
    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
)  # fmt: skip
_ca = next(
    (v for v in map(os.environ.get, ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")) if v),
    None,
)
HOST_CA = os.path.realpath(_ca) if _ca and os.path.isfile(_ca) else None
HOST_CA_IN_CHROOT = "/run/dra-gpu-build-ca.crt"


def step_env(step: oci.Step | None, epoch: int) -> dict[str, str]:
    env = {"HOME": "/root", "HOSTNAME": "dra-gpu-build"}
    env.update(step.env if step is not None else BASE_ENV)
    env.update({k: os.environ[k] for k in PASS_THROUGH if k in os.environ})
    if HOST_CA:
        env["PIP_CERT"] = HOST_CA_IN_CHROOT
    env["SOURCE_DATE_EPOCH"] = str(epoch)
    return env


def do_step(recipe: Recipe, step: oci.Step, root: Path, epoch: int) -> None:
    log(f"Dockerfile line {step.lineno}: {step.keyword} {step.value}")
    if step.keyword == "WORKDIR":
        (root / str(step.value).lstrip("/")).mkdir(parents=True, exist_ok=True)
    elif step.keyword == "COPY":
        assert isinstance(step.value, oci.Copy)
        (root / step.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        oci.copy_from_context(recipe.repo, step.value, root, step.workdir, recipe.ignore)
    elif step.keyword == "RUN":
        (root / step.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        run_in_chroot(root, ["/bin/sh", "-c", str(step.value)], step_env(step, epoch), step.workdir)


def _fresh(path: Path) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def build_base(recipe: Recipe, cache: Path, key: str, epoch: int) -> tuple[Path, oci.Layer]:
    done = cache / "base" / key
    if (done / "layer.json").exists():
        os.utime(done)
        return done / "rootfs", oci.Layer.load(done / "layer.tar.gz")
    tmp = _fresh(done)
    t0 = time.monotonic()
    suite = recipe.suite
    log(f"mmdebstrap {suite} minbase + {' '.join(ROOTFS_PACKAGES)} (about a minute)")
    _run(
        [
            "mmdebstrap", "--quiet", *MMDEBSTRAP_OPTS,
            f"--include={','.join(ROOTFS_PACKAGES)}",
            *(f"--dpkgopt={o}" for o in DPKG_OPTS),
            suite, tmp / "rootfs",
            f"deb {DEBIAN_MIRROR} {suite} main",
            f"deb {DEBIAN_MIRROR} {suite}-updates main",
            f"deb {DEBIAN_SECURITY} {suite}-security main",
        ],
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)},
    )  # fmt: skip
    version = subprocess.run(
        ["chroot", str(tmp / "rootfs"), "/usr/bin/python3", "-c",
         "import sys; print('%d.%d' % sys.version_info[:2])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    if version != recipe.python:
        raise SystemExit(
            f"the Dockerfile's base has Python {recipe.python}, Debian {suite}'s python3 is"
            f" {version}: change the Dockerfile's base image or this builder"
        )
    if (tmp / "rootfs" / recipe.venv.lstrip("/")).exists():
        raise SystemExit(f"the rootfs already has {recipe.venv}")
    log(f"packing the rootfs layer ({time.monotonic() - t0:.0f}s so far)")
    oci.write_layer(
        tmp / "layer.tar.gz", tmp / "rootfs", epoch=epoch, hollow=("dev", "proc", "sys"),
        created_by=f"mmdebstrap --variant=minbase {suite}: {' '.join(ROOTFS_PACKAGES)}",
    )  # fmt: skip
    _replace(tmp, done)
    log(f"base layer built in {time.monotonic() - t0:.0f}s")
    return done / "rootfs", oci.Layer.load(done / "layer.tar.gz")


def _replace(tmp: Path, done: Path) -> None:
    if done.exists():
        shutil.rmtree(done)
    tmp.rename(done)


def build_deps(
    recipe: Recipe, cache: Path, key: str, rootfs: Path, epoch: int
) -> tuple[Path, oci.Layer]:
    done = cache / "deps" / key
    if (done / "layer.json").exists():
        os.utime(done)
        return done / "upper", oci.Layer.load(done / "layer.tar.gz")
    tmp = _fresh(done)
    t0 = time.monotonic()
    log(f"venv with the dependencies: {' '.join(recipe.dependencies)}")
    with overlay_chroot([rootfs], tmp) as (merged, upper):
        for step in recipe.prefix:
            do_step(recipe, step, merged, epoch)
        env = step_env(recipe.prefix[-1] if recipe.prefix else None, epoch)
        pip = [f"{recipe.venv}/bin/pip", "install", "--only-binary=:all:", *recipe.dependencies]
        run_in_chroot(merged, pip, env, "/")
    shutil.rmtree(tmp / "merged")
    oci.write_layer(
        tmp / "layer.tar.gz", upper, epoch=epoch, include=[recipe.venv], overlay_upper=True,
        created_by=" && ".join(
            [*(f"{s.keyword} {s.value}" for s in recipe.prefix), " ".join(pip)]
        ),
    )  # fmt: skip
    _replace(tmp, done)
    log(f"deps layer built in {time.monotonic() - t0:.0f}s")
    return done / "upper", oci.Layer.load(done / "layer.tar.gz")


def build_project(
    recipe: Recipe, cache: Path, key: str, rootfs: Path, deps: Path, epoch: int
) -> oci.Layer:
    done = cache / "project" / key
    if (done / "layer.json").exists():
        os.utime(done)
        return oci.Layer.load(done / "layer.tar.gz")
    tmp = _fresh(done)
    t0 = time.monotonic()
    with overlay_chroot([deps, rootfs], tmp) as (merged, upper):
        for step in recipe.rest:
            do_step(recipe, step, merged, epoch)
    final_copy = next(s for s in recipe.dockerfile.final.steps if s.keyword == "COPY")
    oci.write_layer(
        tmp / "layer.tar.gz", upper, epoch=epoch, include=[recipe.venv], overlay_upper=True,
        created_by=f"Dockerfile line {final_copy.lineno}: COPY --from={recipe.builder.name}"
        f" {recipe.venv} {recipe.venv}",
    )  # fmt: skip
    for d in ("upper", "merged"):
        shutil.rmtree(tmp / d)
    _replace(tmp, done)
    log(f"project layer built in {time.monotonic() - t0:.0f}s")
    return oci.Layer.load(done / "layer.tar.gz")


def build_pause(cache: Path, key: str, epoch: int) -> oci.Layer:
    done = cache / "pause" / key
    if (done / "layer.json").exists():
        os.utime(done)
        return oci.Layer.load(done / "layer.tar.gz")
    tmp = _fresh(done)
    root = tmp / "root"
    root.mkdir()
    env = {**os.environ, "CGO_ENABLED": "0", "GOWORK": "off", "GOTOOLCHAIN": "local"}
    _run(["go", "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w",
          "-o", root / "pause", "."], cwd=HACK / "pause", env=env)  # fmt: skip
    oci.write_layer(tmp / "layer.tar.gz", root, epoch=epoch, created_by="hack/pause")
    shutil.rmtree(root)
    _replace(tmp, done)
    return oci.Layer.load(done / "layer.tar.gz")


def build_workload(cache: Path, key: str, busybox: Path, epoch: int) -> oci.Layer:
    done = cache / "workload" / key
    if (done / "layer.json").exists():
        os.utime(done)
        return oci.Layer.load(done / "layer.tar.gz")
    tmp = _fresh(done)
    root = tmp / "root"
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "var"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for d, mode in (("tmp", 0o1777), ("root", 0o700)):
        (root / d).mkdir()
        os.chmod(root / d, mode)
    shutil.copy(busybox, root / "bin/busybox")
    os.chmod(root / "bin/busybox", 0o755)
    applets = subprocess.run(
        [str(busybox), "--list-full"], check=True, capture_output=True, text=True
    ).stdout.split()
    for applet in applets:
        link = root / applet
        if not link.exists():
            link.symlink_to("/bin/busybox")
    (root / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    )
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    oci.write_layer(
        tmp / "layer.tar.gz", root, epoch=epoch, created_by="busybox-static + applet links"
    )
    shutil.rmtree(root)
    _replace(tmp, done)
    return oci.Layer.load(done / "layer.tar.gz")


def prune(parent: Path, keep: int, current: str) -> None:
    """Keeps the ``keep`` most recently written entries of ``parent`` (and ``current``)."""
    if not parent.is_dir():
        return
    entries = sorted(
        (
            p
            for p in parent.iterdir()
            if p.is_dir() and len(p.name) == len(current) and re.fullmatch(r"[0-9a-f]+", p.name)
        ),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for p in entries[keep:]:
        if p.name != current:
            log(f"pruning {p}")
            shutil.rmtree(p, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=HACK.parent)
    parser.add_argument("--cache", type=Path, required=True, help="e.g. ~/.cache/dra-gpu/images")
    parser.add_argument("--busybox", type=Path, default=Path("/bin/busybox"))
    args = parser.parse_args()
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))
    repo, cache = args.repo.resolve(), args.cache.resolve()
    recipe = load_recipe(repo)
    keys = compute_keys(recipe, epoch, args.busybox)
    out = cache / keys.out
    if (out / "images.json").exists():
        os.utime(out)
        log(f"cached: {out}")
        print(out)
        return 0
    if os.environ.get("DRA_GPU_IMAGES_NS") != str(os.getpid()):  # unshare execs in place
        if os.geteuid() != 0:
            raise SystemExit("building the images needs root (mmdebstrap, overlay, chroot)")
        # A private mount namespace: every mount made below dies with this process.
        argv = ["unshare", "--mount", "--propagation", "private", "--",
                "env", f"DRA_GPU_IMAGES_NS={os.getpid()}", sys.executable, *sys.argv]  # fmt: skip
        os.execvp("unshare", argv)
    t0 = time.monotonic()
    project_image = chart_image(repo)
    rootfs, base = build_base(recipe, cache, keys.base, epoch)
    deps_dir, deps = build_deps(recipe, cache, keys.deps, rootfs, epoch)
    project = build_project(recipe, cache, keys.project, rootfs, deps_dir, epoch)
    pause = build_pause(cache, keys.pause, epoch)
    workload = build_workload(cache, keys.workload, args.busybox, epoch)
    tmp = _fresh(out)
    path_env = [f"PATH={BASE_ENV['PATH']}"]
    images: dict[str, tuple[str, list[oci.Layer], Mapping[str, Any]]] = {
        "dra-gpu.tar": (project_image, [base, deps, project], recipe.config),
        "pause.tar": (
            PAUSE_IMAGE,
            [pause],
            {"Env": path_env, "Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/"},
        ),
        "workload.tar": (
            WORKLOAD_IMAGE,
            [workload],
            {"Env": path_env, "Cmd": ["sh"], "WorkingDir": "/"},
        ),
        # The tutorial's Deployment names its image, and no registry is reachable: this one
        # stands in under that name, prints its environment (the GPU a claim gave it) and then
        # serves HTTP on port 80, as the nginx it replaces would.
        "tutorial-workload.tar": (
            TUTORIAL_IMAGE,
            [workload],
            {"Env": path_env, "Cmd": ["sh", "-c", TUTORIAL_COMMAND], "WorkingDir": "/"},
        ),
    }
    for name, (ref, layers, config) in images.items():
        oci.write_oci_archive(tmp / name, name=ref, layers=layers, config=config, epoch=epoch)
        log(f"{name}: {ref} ({(tmp / name).stat().st_size / 1e6:.1f} MB)")
    (tmp / "images.json").write_text(
        json.dumps({name: ref for name, (ref, _, _) in images.items()}, indent=1) + "\n"
    )
    _replace(tmp, out)
    for kind, keep, current in (
        ("base", 2, keys.base), ("deps", 2, keys.deps), ("project", 3, keys.project),
        ("pause", 2, keys.pause), ("workload", 2, keys.workload),
    ):  # fmt: skip
        prune(cache / kind, keep, current)
    prune(cache, 3, keys.out)
    log(f"done in {time.monotonic() - t0:.0f}s: {out}")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
