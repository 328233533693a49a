"""The image recipe (hack/build_images.py, hack/oci_image.py): the project's image takes its
configuration and build steps from the Dockerfile, and the OCI archives are well formed."""

from __future__ import annotations

import importlib
import os
import shutil
import stat
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]
EPOCH = 1735689600


@pytest.fixture(scope="module")
def hack() -> Iterator[tuple[ModuleType, ModuleType]]:
    sys.path.insert(0, str(REPO / "hack"))
    try:
        yield importlib.import_module("oci_image"), importlib.import_module("build_images")
    finally:
        sys.path.remove(str(REPO / "hack"))


@pytest.fixture(scope="module")
def oci(hack: tuple[ModuleType, ModuleType]) -> ModuleType:
    return hack[0]


@pytest.fixture(scope="module")
def builder(hack: tuple[ModuleType, ModuleType]) -> ModuleType:
    return hack[1]


def _env(config: dict) -> dict[str, str]:
    return dict(item.split("=", 1) for item in config["Env"])


def test_project_image_config_from_our_dockerfile(oci: ModuleType, builder: ModuleType) -> None:
    df = oci.parse_dockerfile((REPO / "Dockerfile").read_text(), builder.BASE_ENV)
    config = oci.image_config(df.final)
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["dra-gpu"]
    assert config["Cmd"] == ["--help"]
    assert config["WorkingDir"] == "/"
    env = _env(config)
    path = env["PATH"].split(":")
    assert path[0] == "/opt/dra-gpu/bin"
    assert "/usr/bin" in path  # the base's PATH follows: $PATH was expanded
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert config["Labels"]["org.opencontainers.image.title"] == "dra-gpu"
    assert config["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"
    # The builder stage's ENV applies to its steps, not to the final image.
    assert "PIP_NO_CACHE_DIR" not in env
    assert df.final.base.startswith("python:3.11")


def test_builder_uses_the_dockerfile(builder: ModuleType, oci: ModuleType) -> None:
    recipe = builder.load_recipe(REPO)
    df = oci.parse_dockerfile((REPO / "Dockerfile").read_text(), builder.BASE_ENV)
    assert recipe.config == oci.image_config(df.final)
    assert (recipe.venv, recipe.python, recipe.suite) == ("/opt/dra-gpu", "3.11", "bookworm")
    # Docker's cache would keep the steps before the first COPY: they make the deps layer.
    assert [s.keyword for s in recipe.prefix] == ["RUN", "WORKDIR"]
    assert [s.keyword for s in recipe.rest] == ["COPY", "COPY", "RUN"]
    assert "pip install" in recipe.rest[-1].value
    assert recipe.rest[-1].env["PIP_ONLY_BINARY"] == ":all:"
    assert recipe.rest[-1].workdir == "/src"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert recipe.dependencies == pyproject["project"]["dependencies"]
    assert builder.chart_image(REPO) == "ghcr.io/dra-gpu/dra-gpu:0.1.0"


def test_a_dockerfile_change_reaches_the_image(builder: ModuleType, tmp_path: Path) -> None:
    for rel in ("Dockerfile", ".dockerignore", "pyproject.toml"):
        shutil.copy(REPO / rel, tmp_path / rel)
    text = (tmp_path / "Dockerfile").read_text()
    assert "USER 65532:65532\n" in text
    text = text.replace("USER 65532:65532\n", "USER 1000:1000\nENV EXTRA=yes\n")
    (tmp_path / "Dockerfile").write_text(text)
    config = builder.load_recipe(tmp_path).config
    assert config["User"] == "1000:1000"
    assert _env(config)["EXTRA"] == "yes"


def test_parser_rules(oci: ModuleType) -> None:
    text = """# syntax=docker/dockerfile:1
ARG BASE=img:1
FROM ${BASE} AS one
ENV A=1 \\
# a comment inside a continuation
    B="two words" C='$A'
ENV A=2 D=$A E=${B}
LABEL "k"="v w"
CMD ["base"]
FROM one
ENTRYPOINT ["x"]
WORKDIR /w
WORKDIR sub
RUN echo $A \\
    && true
"""
    df = oci.parse_dockerfile(text, {"PATH": "/bin"})
    first, second = df.stages
    assert first.base == "img:1"
    assert first.name == "one"
    # Every pair of one ENV sees the environment from before it.
    assert first.env == {
        "PATH": "/bin",
        "A": "2",
        "B": "two words",
        "C": "$A",
        "D": "1",
        "E": "two words",
    }
    assert first.labels == {"k": "v w"}
    assert second.env == first.env
    assert second.labels == first.labels
    assert second.entrypoint == ["x"]
    assert second.cmd is None
    assert second.workdir == "/w/sub"
    run = second.steps[-1]
    assert (run.keyword, run.value, run.workdir) == ("RUN", "echo $A     && true", "/w/sub")


@pytest.mark.parametrize(
    "line",
    [
        "HEALTHCHECK NONE",
        "ADD a b",
        "EXPOSE 80",
        "ENTRYPOINT dra-gpu",
        "CMD --help",
        "ENV A 1",
        "ENV A=${B:-x}",
        "USER $NOPE",
        "COPY --chown=1 a b",
        "COPY *.py /x/",
        'RUN ["true"]',
    ],
)
def test_parser_refuses_what_it_does_not_know(oci: ModuleType, line: str) -> None:
    with pytest.raises(oci.DockerfileError, match="line 2"):
        oci.parse_dockerfile(f"FROM x\n{line}\n", {"PATH": "/bin"})


def test_our_dockerignore(oci: ModuleType) -> None:
    ignore = oci.DockerIgnore((REPO / ".dockerignore").read_text())
    for kept in ("pyproject.toml", "README.md", "operator", "operator/dra_gpu/cli.py"):
        assert not ignore.excluded(kept), kept
    for gone in ("Dockerfile", "tests/unit/x.py", ".venv", "operator/dra_gpu/__pycache__/a.pyc"):
        assert ignore.excluded(gone), gone


def test_copy_from_context(oci: ModuleType, tmp_path: Path) -> None:
    ctx, root = tmp_path / "ctx", tmp_path / "root"
    (ctx / "operator/pkg/__pycache__").mkdir(parents=True)
    (ctx / "operator/pkg/a.py").write_text("a")
    (ctx / "operator/pkg/__pycache__/a.pyc").write_text("x")
    (ctx / "README.md").write_text("r")
    root.mkdir()
    ignore = oci.DockerIgnore("*\n!operator\n!README.md\n**/__pycache__\n")
    oci.copy_from_context(ctx, oci.Copy(("operator",), "./operator", None), root, "/src", ignore)
    oci.copy_from_context(ctx, oci.Copy(("README.md",), "./", None), root, "/src", ignore)
    assert (root / "src/operator/pkg/a.py").read_text() == "a"
    assert not (root / "src/operator/pkg/__pycache__").exists()
    assert (root / "src/README.md").read_text() == "r"
    copies = [oci.Copy(("operator",), "x", None), oci.Copy(("README.md",), "./", None)]
    assert oci.copy_source_files(ctx, copies, ignore) == ["README.md", "operator/pkg/a.py"]


def _tree(root: Path) -> None:
    (root / "bin").mkdir(parents=True)
    (root / "bin/tool").write_text("#!/bin/sh\n")
    os.chmod(root / "bin/tool", 0o755)
    os.link(root / "bin/tool", root / "bin/tool2")
    (root / "bin/sh").symlink_to("tool")
    (root / "etc").mkdir()
    (root / "etc/a").write_text("a")
    (root / "dev/x").mkdir(parents=True)


def test_layers_and_archive(oci: ModuleType, tmp_path: Path) -> None:
    root = tmp_path / "root"
    _tree(root)
    os.utime(root / "etc/a", (EPOCH + 999, EPOCH + 999))
    one = oci.write_layer(tmp_path / "one.tar.gz", root, epoch=EPOCH, hollow=("dev",))
    two = oci.write_layer(tmp_path / "two.tar.gz", root, epoch=EPOCH, hollow=("dev",))
    assert (one.digest, one.diff_id) == (two.digest, two.diff_id)
    assert (tmp_path / "one.tar.gz").read_bytes() == (tmp_path / "two.tar.gz").read_bytes()
    assert oci.Layer.load(tmp_path / "one.tar.gz") == one
    with tarfile.open(tmp_path / "one.tar.gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members) == ["bin", "bin/sh", "bin/tool", "bin/tool2", "dev", "etc", "etc/a"]
    assert members["bin/tool2"].islnk()
    assert members["bin/tool2"].linkname == "bin/tool"
    assert members["bin/sh"].issym()
    assert members["bin/sh"].linkname == "tool"
    assert members["bin/tool"].mode == 0o755
    assert members["etc/a"].mtime == EPOCH
    assert members["etc/a"].uname == ""

    sub = oci.write_layer(tmp_path / "sub.tar.gz", root, epoch=EPOCH, include=["etc/a"])
    config = {"Env": ["PATH=/bin"], "Cmd": ["sh"]}
    out = tmp_path / "image.tar"
    oci.write_oci_archive(
        out, name="example.test/img:2", layers=[one, sub], config=config, epoch=EPOCH
    )
    image = oci.read_oci_archive(out)  # checks every digest, size and diff_id
    assert image["name"] == "example.test/img:2"
    assert image["ref_name"] == "2"
    assert image["config"]["config"] == config
    assert image["config"]["rootfs"]["diff_ids"] == [one.diff_id, sub.diff_id]
    assert image["layers"][1] == ["etc", "etc/a"]
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert {"oci-layout", "index.json", f"blobs/sha256/{one.digest[7:]}"} <= set(names)


def test_overlay_whiteouts(oci: ModuleType, tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    (upper / "opt/venv/gone-dir").mkdir(parents=True)
    os.mknod(upper / "opt/venv/removed", stat.S_IFCHR | 0o000, os.makedev(0, 0))
    os.setxattr(upper / "opt/venv/gone-dir", "trusted.overlay.opaque", b"y")
    (upper / "etc").mkdir()
    os.mknod(upper / "etc/null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    layer = oci.write_layer(
        tmp_path / "l.tar.gz", upper, epoch=EPOCH, include=["opt/venv"], overlay_upper=True
    )
    with tarfile.open(layer.path) as tar:
        names = tar.getnames()
    assert names == [
        "opt",
        "opt/venv",
        "opt/venv/gone-dir",
        "opt/venv/gone-dir/.wh..wh..opq",
        "opt/venv/.wh.removed",
    ]
