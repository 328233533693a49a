"""OCI image archives without a daemon or a registry, and the Dockerfile subset they follow.

Standard library only; used by hack/build_images.py (which runs the builds) and by
tests/unit/image/test_recipe.py. Three parts:

- ``parse_dockerfile``: reads the instructions our Dockerfile uses (FROM, ARG, ENV, LABEL, USER,
  WORKDIR, ENTRYPOINT, CMD, COPY, RUN) with Docker's quoting, line continuation and variable
  rules, so the image built here takes its configuration (Env, User, Entrypoint, Cmd, Labels,
  WorkingDir) and its build steps from the Dockerfile itself. Anything else is refused with
  the line number: extend the parser when the Dockerfile needs more.
- ``DockerIgnore``: the ``.dockerignore`` rules (last match wins, a match on a parent counts).
- ``write_layer`` / ``write_oci_archive``: deterministic gzip'd layer tars (sorted entries,
  mtimes clamped to a fixed epoch, no user names) with their digest and diff_id, and the OCI
  image layout packed as one tar (``oci-layout``, ``index.json`` carrying the
  ``io.containerd.image.name`` annotation, blobs by sha256) for ``ctr images import``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"

# ---------------------------------------------------------------------------------------------
# Dockerfile


class DockerfileError(ValueError):
    """The Dockerfile uses something this builder does not understand (message names the line)."""


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]
    dest: str
    from_stage: str | None

    def __str__(self) -> str:
        flag = [f"--from={self.from_stage}"] if self.from_stage else []
        return " ".join([*flag, *self.sources, self.dest])


@dataclass(frozen=True)
class Step:
    """One instruction with a build effect, with the environment and directory it runs in."""

    lineno: int
    keyword: str  # RUN, COPY or WORKDIR
    value: str | Copy
    env: Mapping[str, str]
    workdir: str


@dataclass
class Stage:
    index: int
    base: str
    name: str | None
    env: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    steps: list[Step] = field(default_factory=list)
    cmd_set_here: bool = False


@dataclass
class Dockerfile:
    args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, ref: str) -> Stage:
        for stage in self.stages:
            if ref in (stage.name, str(stage.index)):
                return stage
        raise DockerfileError(f"no stage named {ref!r}")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _expand_var(s: str, i: int, env: Mapping[str, str], lineno: int) -> tuple[str, int]:
    """``s[i] == '$'``: returns the value and the index after the reference."""
    if s.startswith("${", i):
        end = s.find("}", i + 2)
        name = s[i + 2 : end] if end >= 0 else ""
        if not _NAME.fullmatch(name):
            raise DockerfileError(
                f"line {lineno}: only plain ${{NAME}} references are supported, got {s[i:]!r}"
            )
        nxt = end + 1
    else:
        m = _NAME.match(s, i + 1)
        if not m:
            return "$", i + 1
        name, nxt = m.group(), m.end()
    if name not in env:
        # Docker would substitute an empty string; here that is almost surely a base image
        # variable the builder forgot to define, so it is an error.
        raise DockerfileError(f"line {lineno}: ${name} is not defined (no earlier ARG/ENV)")
    return env[name], nxt


def _words(s: str, env: Mapping[str, str] | None, lineno: int) -> list[str]:
    """Splits like Docker's shell-word rules: quotes, backslash escapes, $VAR expansion."""
    words: list[str] = []
    cur: list[str] = []
    in_word = False
    i = 0
    while i < len(s):
        c = s[i]
        if c.isspace():
            if in_word:
                words.append("".join(cur))
                cur, in_word = [], False
            i += 1
            continue
        in_word = True
        if c == "\\":
            if i + 1 >= len(s):
                raise DockerfileError(f"line {lineno}: trailing backslash")
            cur.append(s[i + 1])
            i += 2
        elif c == "'":
            end = s.find("'", i + 1)
            if end < 0:
                raise DockerfileError(f"line {lineno}: unterminated single quote")
            cur.append(s[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while True:
                if i >= len(s):
                    raise DockerfileError(f"line {lineno}: unterminated double quote")
                c = s[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\" and i + 1 < len(s) and s[i + 1] in '"\\$':
                    cur.append(s[i + 1])
                    i += 2
                elif c == "$" and env is not None:
                    value, i = _expand_var(s, i, env, lineno)
                    cur.append(value)
                else:
                    cur.append(c)
                    i += 1
        elif c == "$" and env is not None:
            value, i = _expand_var(s, i, env, lineno)
            cur.append(value)
        else:
            cur.append(c)
            i += 1
    if in_word:
        words.append("".join(cur))
    return words


def _pairs(rest: str, env: Mapping[str, str], lineno: int, keyword: str) -> list[tuple[str, str]]:
    pairs = []
    for word in _words(rest, env, lineno):
        key, eq, value = word.partition("=")
        if not eq or not key:
            raise DockerfileError(
                f"line {lineno}: {keyword} takes key=value pairs (the legacy `{keyword} key value`"
                f" form is not supported), got {word!r}"
            )
        pairs.append((key, value))
    if not pairs:
        raise DockerfileError(f"line {lineno}: {keyword} without arguments")
    return pairs


def _exec_form(rest: str, lineno: int, keyword: str) -> list[str]:
    try:
        value = json.loads(rest)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DockerfileError(
            f"line {lineno}: {keyword} must use the exec (JSON array) form; the shell form is"
            f" not supported, got {rest!r}"
        )
    return value


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Instructions with their first line number: comments dropped, continuations joined."""
    buf: str | None = None
    start = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        m = re.match(r"#\s*escape\s*=\s*(\S*)", stripped)
        if m and buf is None and m.group(1) != "\\":
            raise DockerfileError(f"line {lineno}: only the default escape character is supported")
        if not stripped or stripped.startswith("#"):
            continue  # also inside a continuation, as Docker does
        if buf is None:
            buf, start = "", lineno
        body = line.rstrip()
        if body.endswith("\\"):
            buf += body[:-1]
            continue
        yield start, buf + line
        buf = None
    if buf is not None:
        raise DockerfileError(f"line {start}: the last instruction ends with a continuation")


def parse_dockerfile(
    text: str,
    base_env: Mapping[str, str],
    build_args: Mapping[str, str] | None = None,
) -> Dockerfile:
    """Parses ``text``. ``base_env`` is the environment of the base images the builder puts in
    place of the ``FROM`` images (a stage ``FROM`` an earlier stage inherits that stage)."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for lineno, line in _logical_lines(text):
        m = re.match(r"(\S+)\s*(.*)", line.strip(), re.S)
        assert m
        keyword, rest = m.group(1).upper(), m.group(2).strip()
        stage = stages[-1] if stages else None
        if keyword == "ARG":
            if stage is not None:
                raise DockerfileError(f"line {lineno}: ARG inside a stage is not supported")
            for word in _words(rest, args, lineno):
                key, eq, value = word.partition("=")
                if not _NAME.fullmatch(key):
                    raise DockerfileError(f"line {lineno}: bad ARG {word!r}")
                args[key] = (build_args or {}).get(key, value if eq else "")
            continue
        if keyword == "FROM":
            words = _words(rest, args, lineno)
            if words and words[0].startswith("--"):
                raise DockerfileError(f"line {lineno}: FROM flags are not supported: {words[0]}")
            if len(words) == 3 and words[1].lower() == "as":
                base, name = words[0], words[2]
            elif len(words) == 1:
                base, name = words[0], None
            else:
                raise DockerfileError(f"line {lineno}: FROM <image> [AS <name>], got {rest!r}")
            parent = next((s for s in stages if s.name == base), None)
            new = Stage(index=len(stages), base=base, name=name, env=dict(base_env))
            if parent is not None:
                new.env = dict(parent.env)
                new.labels = dict(parent.labels)
                new.user, new.workdir = parent.user, parent.workdir
                new.entrypoint, new.cmd = parent.entrypoint, parent.cmd
            stages.append(new)
            continue
        if stage is None:
            raise DockerfileError(f"line {lineno}: {keyword} before the first FROM")
        workdir = stage.workdir or "/"
        if keyword == "ENV":
            # Every pair of one ENV sees the environment from before the instruction.
            stage.env.update(_pairs(rest, stage.env, lineno, "ENV"))
        elif keyword == "LABEL":
            stage.labels.update(_pairs(rest, stage.env, lineno, "LABEL"))
        elif keyword == "USER":
            words = _words(rest, stage.env, lineno)
            if len(words) != 1:
                raise DockerfileError(f"line {lineno}: USER takes one word, got {rest!r}")
            stage.user = words[0]
        elif keyword == "WORKDIR":
            words = _words(rest, stage.env, lineno)
            if len(words) != 1:
                raise DockerfileError(f"line {lineno}: WORKDIR takes one path, got {rest!r}")
            stage.workdir = os.path.normpath(os.path.join(workdir, words[0]))
            stage.steps.append(Step(lineno, "WORKDIR", stage.workdir, dict(stage.env), workdir))
        elif keyword == "ENTRYPOINT":
            stage.entrypoint = _exec_form(rest, lineno, keyword)
            if not stage.cmd_set_here:
                stage.cmd = None  # an ENTRYPOINT resets the CMD inherited from the base
        elif keyword == "CMD":
            stage.cmd = _exec_form(rest, lineno, keyword)
            stage.cmd_set_here = True
        elif keyword == "RUN":
            if rest.startswith("["):
                raise DockerfileError(f"line {lineno}: RUN in exec form is not supported")
            if rest.startswith("--"):
                raise DockerfileError(f"line {lineno}: RUN flags are not supported")
            stage.steps.append(Step(lineno, "RUN", rest, dict(stage.env), workdir))
        elif keyword == "COPY":
            words = _words(rest, stage.env, lineno)
            from_stage = None
            while words and words[0].startswith("--"):
                flag = words.pop(0)
                if not flag.startswith("--from="):
                    raise DockerfileError(f"line {lineno}: COPY {flag} is not supported")
                from_stage = flag.removeprefix("--from=")
            if len(words) < 2:
                raise DockerfileError(f"line {lineno}: COPY <src>... <dest>, got {rest!r}")
            for src in words[:-1]:
                if any(ch in src for ch in "*?["):
                    raise DockerfileError(f"line {lineno}: COPY wildcards are not supported")
            copy = Copy(tuple(words[:-1]), words[-1], from_stage)
            stage.steps.append(Step(lineno, "COPY", copy, dict(stage.env), workdir))
        else:
            raise DockerfileError(
                f"line {lineno}: {keyword} is not supported by hack/oci_image.py"
                " (it understands FROM, ARG, ENV, LABEL, USER, WORKDIR, ENTRYPOINT, CMD, COPY, RUN)"
            )
    if not stages:
        raise DockerfileError("no FROM instruction")
    return Dockerfile(args=args, stages=stages)


def image_config(stage: Stage) -> dict[str, Any]:
    """The ``config`` object of the OCI image configuration for ``stage``."""
    config: dict[str, Any] = {
        "Env": [f"{k}={v}" for k, v in stage.env.items()],
        # Unset in the Dockerfile (and in its base image): the runtime's default, written out.
        "WorkingDir": stage.workdir or "/",
    }
    if stage.user is not None:
        config["User"] = stage.user
    if stage.entrypoint is not None:
        config["Entrypoint"] = stage.entrypoint
    if stage.cmd is not None:
        config["Cmd"] = stage.cmd
    if stage.labels:
        config["Labels"] = dict(stage.labels)
    return config


# ---------------------------------------------------------------------------------------------
# .dockerignore


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


class DockerIgnore:
    """``.dockerignore`` rules: the last matching pattern decides; a pattern that matches a
    parent directory matches everything under it; ``!`` re-includes."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
            self.rules.append((negate, _glob_regex(pattern)))

    def excluded(self, rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        result = False
        for negate, regex in self.rules:
            if any(regex.fullmatch(p) for p in prefixes):
                result = not negate
        return result


def copy_from_context(
    context: Path, copy: Copy, root: Path, workdir: str, ignore: DockerIgnore
) -> list[str]:
    """Carries out a ``COPY`` from the build context into the tree ``root``; returns the
    context paths copied. Directories copy their contents, as Docker does."""
    dest = copy.dest if copy.dest.startswith("/") else os.path.join(workdir, copy.dest)
    into_dir = copy.dest.endswith("/") or len(copy.sources) > 1
    copied: list[str] = []
    for src in copy.sources:
        rel = os.path.normpath(src)
        if rel.startswith("..") or os.path.isabs(rel):
            raise DockerfileError(f"COPY source {src!r} is outside the build context")
        path = context / rel
        if ignore.excluded(rel) or not path.exists():
            raise DockerfileError(f"COPY source {src!r} is not in the build context")
        if path.is_dir():
            target = root / dest.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames.sort()
                for name in [*dirnames, *sorted(filenames)]:
                    full = Path(dirpath) / name
                    crel = full.relative_to(context).as_posix()
                    if ignore.excluded(crel):
                        if name in dirnames:
                            dirnames.remove(name)
                        continue
                    out = target / full.relative_to(path)
                    if full.is_dir() and not full.is_symlink():
                        out.mkdir(exist_ok=True)
                        shutil.copystat(full, out)
                    else:
                        shutil.copy2(full, out, follow_symlinks=False)
                        copied.append(crel)
        else:
            target = root / dest.lstrip("/")
            if into_dir:
                target.mkdir(parents=True, exist_ok=True)
                target = target / path.name
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            copied.append(rel)
    return copied


def copy_source_files(context: Path, copies: Iterable[Copy], ignore: DockerIgnore) -> list[str]:
    """The context files that these ``COPY`` instructions take (``.dockerignore`` applied)."""
    files: set[str] = set()
    for copy in copies:
        for src in copy.sources:
            rel = os.path.normpath(src)
            path = context / rel
            if ignore.excluded(rel) or not path.exists():
                continue
            if not path.is_dir():
                files.add(rel)
                continue
            for dirpath, dirnames, filenames in os.walk(path):
                base = Path(dirpath).relative_to(context).as_posix()
                dirnames[:] = [d for d in dirnames if not ignore.excluded(f"{base}/{d}")]
                files.update(f"{base}/{n}" for n in filenames if not ignore.excluded(f"{base}/{n}"))
    return sorted(files)


# ---------------------------------------------------------------------------------------------
# Layers and archives


class _HashingWriter:
    """A write-only stream that hashes and counts what passes through to ``out``."""

    def __init__(self, out: BinaryIO | gzip.GzipFile) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()


@dataclass(frozen=True)
class Layer:
    path: Path
    digest: str  # sha256 of the gzip'd blob
    diff_id: str  # sha256 of the uncompressed tar
    size: int
    created_by: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "diff_id": self.diff_id,
            "size": self.size,
            "created_by": self.created_by,
        }

    @classmethod
    def load(cls, path: Path) -> Layer:
        meta = json.loads(path.with_suffix("").with_suffix(".json").read_text())
        return cls(path, meta["digest"], meta["diff_id"], meta["size"], meta["created_by"])


def _walk(root: Path, rel: str, hollow: frozenset[str]) -> Iterator[str]:
    """``rel`` and everything under it, depth first, names sorted."""
    yield rel
    full = root / rel
    if rel in hollow or full.is_symlink() or not full.is_dir():
        return
    for name in sorted(os.listdir(full)):
        yield from _walk(root, f"{rel}/{name}" if rel else name, hollow)


def write_layer(
    out: Path,
    root: Path,
    *,
    epoch: int,
    include: Sequence[str] | None = None,
    hollow: Iterable[str] = (),
    overlay_upper: bool = False,
    created_by: str = "",
    compresslevel: int = 6,
) -> Layer:
    """Packs the tree ``root`` as a gzip'd layer tar at ``out`` (and ``out`` .json beside it).

    ``include``: only these subtrees (their parent directories are written too). ``hollow``:
    directories written without their contents (``dev``, ``proc``, ...). ``overlay_upper``:
    ``root`` is an overlayfs upper directory, whose whiteouts (0:0 character devices) and
    opaque directories become OCI whiteouts. Other device nodes, FIFOs and sockets are left out
    (the runtime provides ``/dev``). Entries are sorted, owned by numeric ids without names,
    their mtimes clamped to ``epoch``, and the gzip header carries no name or time, so the same
    tree gives the same bytes.
    """
    rels: list[str] = []
    for sub in include if include is not None else [""]:
        sub = sub.strip("/")
        parts = sub.split("/") if sub else []
        for n in range(1, len(parts)):
            parent = "/".join(parts[:n])
            if parent not in rels:
                rels.append(parent)
        if (root / sub).exists() or (root / sub).is_symlink():
            rels.extend(_walk(root, sub, frozenset(hollow)))
    tmp = out.with_name(out.name + ".tmp")
    hardlinks: dict[tuple[int, int], str] = {}
    with open(tmp, "wb") as f:
        blob = _HashingWriter(f)
        gz = gzip.GzipFile(
            filename="", mode="wb", fileobj=blob, mtime=0, compresslevel=compresslevel
        )
        plain = _HashingWriter(gz)
        # A stream ("w|") only ever writes to its file object.
        stream = cast(BinaryIO, plain)
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for rel in rels:
                if not rel:
                    continue
                full = root / rel
                st = os.lstat(full)
                info = tarfile.TarInfo(rel)
                info.mode = stat.S_IMODE(st.st_mode)
                info.uid, info.gid = st.st_uid, st.st_gid
                info.uname = info.gname = ""
                info.mtime = min(int(st.st_mtime), epoch)
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                    if overlay_upper and _opaque(full):
                        tar.addfile(_whiteout(f"{rel}/.wh..wh..opq", epoch))
                elif stat.S_ISLNK(st.st_mode):
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(full)
                    tar.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    if st.st_nlink > 1 and key in hardlinks:
                        info.type = tarfile.LNKTYPE
                        info.linkname = hardlinks[key]
                        tar.addfile(info)
                        continue
                    hardlinks[key] = rel
                    info.size = st.st_size
                    with open(full, "rb") as content:
                        tar.addfile(info, content)
                elif overlay_upper and stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    head, _, name = rel.rpartition("/")
                    tar.addfile(_whiteout(f"{head}/.wh.{name}" if head else f".wh.{name}", epoch))
        gz.close()
        f.flush()
        os.fsync(f.fileno())
    layer = Layer(
        out, f"sha256:{blob.sha.hexdigest()}", f"sha256:{plain.sha.hexdigest()}", blob.size,
        created_by,
    )  # fmt: skip
    tmp.rename(out)
    out.with_suffix("").with_suffix(".json").write_text(json.dumps(layer.to_json(), indent=1))
    return layer


def _opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _whiteout(name: str, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.uname, info.gname = 0o644, epoch, "", ""
    return info


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _created(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_oci_archive(
    out: Path,
    *,
    name: str,
    layers: Sequence[Layer],
    config: Mapping[str, Any],
    epoch: int,
    architecture: str = "amd64",
) -> dict[str, Any]:
    """Writes the OCI image layout for one image as a tar at ``out``; returns its index.json.

    ``name`` is the full reference (``ghcr.io/dra-gpu/dra-gpu:0.1.0``): ``ctr images import``
    names the image after the ``io.containerd.image.name`` annotation; the
    ``org.opencontainers.image.ref.name`` annotation carries the tag, as ``docker save`` does.
    """
    created = _created(epoch)
    image_config = {
        "created": created,
        "architecture": architecture,
        "os": "linux",
        "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [
            {"created": created, "created_by": layer.created_by or "layer"} for layer in layers
        ],
    }
    config_blob = _canonical(image_config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {
            "mediaType": MEDIA_CONFIG,
            "digest": _sha(config_blob),
            "size": len(config_blob),
        },
        "layers": [
            {"mediaType": MEDIA_LAYER_GZIP, "digest": layer.digest, "size": layer.size}
            for layer in layers
        ],
    }
    manifest_blob = _canonical(manifest)
    tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": _sha(manifest_blob),
                "size": len(manifest_blob),
                "platform": {"architecture": architecture, "os": "linux"},
                "annotations": {ANNOTATION_CONTAINERD_NAME: name, ANNOTATION_REF_NAME: tag},
            }
        ],
    }
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_dir_info("blobs", epoch))
        tar.addfile(_dir_info("blobs/sha256", epoch))
        written = set()
        for blob in (config_blob, manifest_blob):
            _add_bytes(tar, f"blobs/sha256/{_sha(blob).removeprefix('sha256:')}", blob, epoch)
        for layer in layers:
            if layer.digest in written:
                continue
            written.add(layer.digest)
            info = _file_info(f"blobs/sha256/{layer.digest.removeprefix('sha256:')}", epoch)
            info.size = layer.size
            with open(layer.path, "rb") as f:
                tar.addfile(info, f)
        _add_bytes(tar, "oci-layout", _canonical({"imageLayoutVersion": "1.0.0"}), epoch)
        _add_bytes(tar, "index.json", _canonical(index), epoch)
    tmp.rename(out)
    return index


def _sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _file_info(name: str, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.uname, info.gname = 0o644, epoch, "", ""
    return info


def _dir_info(name: str, epoch: int) -> tarfile.TarInfo:
    info = _file_info(name, epoch)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, epoch: int) -> None:
    info = _file_info(name, epoch)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def read_oci_archive(path: Path) -> dict[str, Any]:
    """Reads an archive back and checks it (digests, sizes, diff_ids); returns
    ``{"name", "config", "manifest", "layers": [[member names]...]}``. For tests and checks."""
    with tarfile.open(path) as tar:

        def member(name: str) -> bytes:
            f = tar.extractfile(name)
            if f is None:
                raise ValueError(f"{path}: {name} is not a file")
            return f.read()

        def blob(digest: str) -> bytes:
            data = member(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            if _sha(data) != digest:
                raise ValueError(f"{path}: blob {digest} does not match its content")
            return data

        layout = json.loads(member("oci-layout"))
        if layout != {"imageLayoutVersion": "1.0.0"}:
            raise ValueError(f"{path}: bad oci-layout {layout}")
        index = json.loads(member("index.json"))
        (desc,) = index["manifests"]
        manifest_blob = blob(desc["digest"])
        if len(manifest_blob) != desc["size"]:
            raise ValueError(f"{path}: manifest size mismatch")
        manifest = json.loads(manifest_blob)
        config = json.loads(blob(manifest["config"]["digest"]))
        members = []
        for layer_desc, diff_id in zip(
            manifest["layers"], config["rootfs"]["diff_ids"], strict=True
        ):
            data = blob(layer_desc["digest"])
            if len(data) != layer_desc["size"]:
                raise ValueError(f"{path}: layer {layer_desc['digest']} size mismatch")
            plain = gzip.decompress(data)
            if _sha(plain) != diff_id:
                raise ValueError(f"{path}: diff_id {diff_id} does not match the layer's tar")
            with tarfile.open(fileobj=io.BytesIO(plain)) as layer_tar:
                members.append(layer_tar.getnames())
        return {
            "name": desc["annotations"][ANNOTATION_CONTAINERD_NAME],
            "ref_name": desc["annotations"][ANNOTATION_REF_NAME],
            "config": config,
            "manifest": manifest,
            "layers": members,
        }


def tree_digest(root: Path, files: Iterable[str]) -> str:
    """sha256 over the names, executable bits and contents of ``files`` (relative to root)."""
    sha = hashlib.sha256()
    for rel in sorted(files):
        path = root / rel
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            sha.update(f"{rel}\0{st.st_mode & 0o111:o}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                sha.update(os.readlink(path).encode())
            else:
                sha.update(path.read_bytes())
            sha.update(b"\0")
    return sha.hexdigest()
