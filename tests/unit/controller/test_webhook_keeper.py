"""The keeper of the self-issued webhook certificates, against a scripted API server on loopback
(``tests.support.api_servers``) that keeps Secrets and ValidatingWebhookConfigurations as the
real one would: 404 for what is not there, 409 for a name taken or a stale resourceVersion,
the webhooks list merged by name. The leader creates and renews the Secret and sets the
caBundle; a standby only reads, and every replica copies the Secret into its files."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import json
import logging
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_gpu import kube
from dra_gpu.config import ControllerSettings
from dra_gpu.controller.admission import certificates, keeper
from dra_gpu.controller.admission.keeper import CertificateKeeper
from dra_gpu.testing import eventually
from tests.support.api_servers import scripted_api, status

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
SETTINGS = ControllerSettings(
    namespace="dra-gpu",
    webhook_secret="webhook-tls",
    webhook_service="webhook",
    webhook_configuration="dra-gpu",
)
NAMES = certificates.service_names("webhook", "dra-gpu")
SECRETS = "/api/v1/namespaces/dra-gpu/secrets"
SECRET = f"{SECRETS}/webhook-tls"
VWC = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/dra-gpu"
WRITES = ("POST", "PUT", "PATCH", "DELETE")


@dataclasses.dataclass
class FakeApi:
    """Objects by path; what was asked, in order; scripted surprises."""

    objects: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = dataclasses.field(default_factory=list)
    version: int = 100
    before_create: Callable[[], None] | None = None
    """Runs once when the next create arrives (another replica, a moment earlier)."""
    before_replace: Callable[[], None] | None = None
    """Likewise for the next update."""
    failing: int = 0
    """Answer this many of the next requests 500."""
    forbidden: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """Requests (method, path) answered 403, as RBAC would."""

    def calls(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, _ in self.requests]

    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.calls() if m in WRITES]

    def store(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = json.loads(json.dumps(obj))
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        obj["metadata"].setdefault("uid", f"uid-{self.version}")  # set once, at create
        self.objects[path] = obj
        return obj

    def put_secret(self, stored: certificates.Stored) -> None:
        data = {
            key: base64.b64encode(getattr(stored, field)).decode()
            for field, key in keeper.SECRET_KEYS.items()
        }
        self.store(
            SECRET,
            {"metadata": {"name": "webhook-tls"}, "type": "kubernetes.io/tls", "data": data},
        )

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if self.failing:
            self.failing -= 1
            return 500, status(500, "InternalError")
        if (method, path) in self.forbidden:
            return 403, status(403, "Forbidden")
        if method == "GET":
            if path not in self.objects:
                return 404, status(404, "NotFound")
            return 200, self.objects[path]
        if method == "POST":
            if self.before_create is not None:
                run, self.before_create = self.before_create, None
                run()
            target = f"{path}/{body['metadata']['name']}"
            if target in self.objects:
                return 409, status(409, "AlreadyExists")
            return 201, self.store(target, body)
        if path not in self.objects:
            return 404, status(404, "NotFound")
        current = self.objects[path]
        if method == "PUT":
            if self.before_replace is not None:
                run, self.before_replace = self.before_replace, None
                run()
                current = self.objects[path]
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return 409, status(409, "Conflict")
            return 200, self.store(path, body)
        if method == "PATCH":  # strategic merge of a VWC's webhooks, by name
            merged = json.loads(json.dumps(current))
            by_name = {w["name"]: w for w in merged.get("webhooks", [])}
            for change in body["webhooks"]:
                webhook = by_name[change["name"]]
                webhook.setdefault("clientConfig", {}).update(change["clientConfig"])
            return 200, self.store(path, merged)
        return 405, status(405, "MethodNotAllowed")


def configuration(*names: str) -> dict[str, Any]:
    webhooks = [
        {"name": n, "clientConfig": {"service": {"name": "webhook"}}, "rules": [{"n": n}]}
        for n in names
    ]
    return {"metadata": {"name": "dra-gpu"}, "webhooks": webhooks}


def secret_stored(fake: FakeApi) -> certificates.Stored:
    data = fake.objects[SECRET]["data"]
    return certificates.Stored(
        **{f: base64.b64decode(data[k]) for f, k in keeper.SECRET_KEYS.items()}
    )


def files(cert_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(cert_dir.iterdir())}


def inodes(cert_dir: Path) -> dict[str, int]:
    """Every file's inode: a file replaced (``os.replace``) gets a new one."""
    return {p.name: p.stat().st_ino for p in cert_dir.iterdir()}


def copied(stored: certificates.Stored) -> dict[str, bytes]:
    return {"ca.crt": stored.bundle, "tls.crt": stored.cert, "tls.key": stored.key}


def make_keeper(api: kube.Kube, cert_dir: Path, leading: list[bool], **options: Any) -> Any:
    return CertificateKeeper(api, SETTINGS, lambda: leading[0], cert_dir, lambda: NOW, **options)


async def test_the_leader_creates_the_secret_and_sets_every_ca_bundle(tmp_path: Path) -> None:
    fake = FakeApi()
    fake.store(VWC, configuration("claims.dra-gpu", "classes.dra-gpu"))
    async with scripted_api(fake) as api:
        keeping = make_keeper(api, tmp_path, [True])
        await keeping.run_once()
        assert fake.calls() == [
            ("GET", SECRET),
            ("GET", VWC),  # its owner: the configuration's deletion deletes the Secret
            ("POST", SECRETS),
            ("GET", VWC),
            ("PATCH", VWC),
        ]
        secret = fake.objects[SECRET]
        assert secret["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "name": "dra-gpu",
                "uid": fake.objects[VWC]["metadata"]["uid"],
            }
        ]
        assert secret["type"] == "kubernetes.io/tls"
        assert sorted(secret["data"]) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
        stored = secret_stored(fake)
        assert certificates.issued_by(stored.cert, stored.bundle)
        assert not certificates.renewal_due(stored.cert, NOW, NAMES)
        encoded = base64.b64encode(stored.bundle).decode()
        for webhook in fake.objects[VWC]["webhooks"]:
            assert webhook["clientConfig"] == {"service": {"name": "webhook"}, "caBundle": encoded}
            assert webhook["rules"] == [{"n": webhook["name"]}]  # the rest left as it was
        # The files: the serving pair and the bundle, never the CA's key.
        assert files(tmp_path) == copied(stored)
        assert stat.S_IMODE((tmp_path / "tls.key").stat().st_mode) == 0o600
        assert keeping.ready.is_set()
        assert await keeping.wait_ready(0)

        # Nothing due, nothing stale: the next pass only reads.
        fake.requests.clear()
        await keeping.run_once()
        assert fake.calls() == [("GET", SECRET), ("GET", VWC)]


async def test_a_standby_only_reads_and_copies_the_secret(tmp_path: Path) -> None:
    fake = FakeApi()
    fake.store(VWC, configuration("claims.dra-gpu"))
    async with scripted_api(fake) as api:
        keeping = make_keeper(api, tmp_path, [False])
        await keeping.run_once()  # no Secret yet: nothing to copy, nothing created
        assert fake.calls() == [("GET", SECRET)]
        assert files(tmp_path) == {}
        assert not await keeping.wait_ready(0.01)

        stored = certificates.renew(None, NAMES, NOW)
        fake.put_secret(stored)
        await keeping.run_once()
        assert files(tmp_path) == copied(stored)
        assert keeping.ready.is_set()
        # Even with a due certificate and a stale caBundle, a standby writes nothing.
        later = make_keeper(api, tmp_path, [False])
        later.clock = lambda: NOW + datetime.timedelta(days=300)
        await later.run_once()
    assert fake.writes() == []
    assert "caBundle" not in fake.objects[VWC]["webhooks"][0]["clientConfig"]


async def test_the_files_are_rewritten_only_when_the_secret_changes(tmp_path: Path) -> None:
    fake = FakeApi()
    first = certificates.renew(None, NAMES, NOW)
    fake.put_secret(first)
    async with scripted_api(fake) as api:
        keeping = make_keeper(api, tmp_path, [False])
        await keeping.run_once()
        before = inodes(tmp_path)
        await keeping.run_once()
        assert inodes(tmp_path) == before  # untouched

        second = certificates.renew(first, NAMES, NOW + datetime.timedelta(days=250))
        assert second.bundle == first.bundle
        assert second.cert != first.cert
        fake.put_secret(second)
        await keeping.run_once()
        assert files(tmp_path) == copied(second)
        after = inodes(tmp_path)
        assert after["ca.crt"] == before["ca.crt"]  # the same bundle: not written again
        assert after["tls.crt"] != before["tls.crt"]
        assert sorted(after) == ["ca.crt", "tls.crt", "tls.key"]  # no temporary files left


async def test_a_secret_whose_pair_does_not_match_is_not_copied(tmp_path: Path) -> None:
    fake = FakeApi()
    good = certificates.renew(None, NAMES, NOW)
    fake.put_secret(dataclasses.replace(good, key=good.ca_key))
    async with scripted_api(fake) as api:
        keeping = make_keeper(api, tmp_path, [False])
        await keeping.run_once()
    assert files(tmp_path) == {}
    assert not keeping.ready.is_set()


async def test_a_create_that_lost_the_race_reads_the_winners_secret(tmp_path: Path) -> None:
    fake = FakeApi()
    fake.store(VWC, configuration("claims.dra-gpu"))
    theirs = certificates.renew(None, NAMES, NOW)
    fake.before_create = lambda: fake.put_secret(theirs)
    async with scripted_api(fake) as api:
        await make_keeper(api, tmp_path, [True]).run_once()
    assert fake.calls() == [
        ("GET", SECRET),
        ("GET", VWC),
        ("POST", SECRETS),  # 409: another replica created it a moment before
        ("GET", SECRET),
        ("GET", VWC),
        ("PATCH", VWC),
    ]
    assert secret_stored(fake) == theirs  # theirs is good: kept, not replaced
    assert files(tmp_path) == copied(theirs)
    bundle = fake.objects[VWC]["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(bundle) == theirs.bundle


async def test_the_leader_renews_a_due_certificate_with_the_version_it_read(
    tmp_path: Path,
) -> None:
    fake = FakeApi()
    old = certificates.renew(None, NAMES, NOW)
    fake.put_secret(old)
    fake.objects[SECRET]["metadata"]["labels"] = {"app": "dra-gpu"}
    later = NOW + datetime.timedelta(days=250)
    # Someone else touches the Secret between our read and our update: 409, read, again.
    fake.before_replace = lambda: fake.put_secret(old)
    async with scripted_api(fake) as api:
        keeping = make_keeper(api, tmp_path, [True])
        keeping.clock = lambda: later
        await keeping.run_once()
    puts = [body for method, _, body in fake.requests if method == "PUT"]
    assert [m for m, _ in fake.calls()] == ["GET", "PUT", "GET", "PUT", "GET"]  # VWC: none
    assert puts[0]["metadata"]["resourceVersion"] == "101"
    assert puts[1]["metadata"]["resourceVersion"] == "102"
    renewed = secret_stored(fake)
    assert renewed.bundle == old.bundle
    assert renewed.ca_key == old.ca_key
    assert not certificates.renewal_due(renewed.cert, later, NAMES)
    assert files(tmp_path) == copied(renewed)


async def test_a_missing_configuration_is_logged_once_and_looked_for_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeApi()
    async with scripted_api(fake) as api:
        keeping = make_keeper(api, tmp_path, [True])
        with caplog.at_level(logging.WARNING, logger=keeper.__name__):
            await keeping.run_once()
            await keeping.run_once()
        fake.store(VWC, configuration("claims.dra-gpu"))
        await keeping.run_once()
    missing = [r for r in caplog.records if "no ValidatingWebhookConfiguration" in r.message]
    assert len(missing) == 1
    assert fake.calls().count(("GET", VWC)) == 4  # the first also for the Secret's owner
    assert "ownerReferences" not in fake.objects[SECRET]["metadata"]  # none to own it then
    assert ("PATCH", VWC) in fake.calls()
    assert keeping.ready.is_set()  # the files do not wait for the configuration


async def test_a_configuration_the_leader_may_not_patch_fails_the_pass_after_the_files(
    tmp_path: Path,
) -> None:
    fake = FakeApi(forbidden={("PATCH", VWC)})
    fake.store(VWC, configuration("claims.dra-gpu"))
    async with scripted_api(fake) as api:
        keeping = make_keeper(api, tmp_path, [True])
        with pytest.raises(kube.ApiError) as refused:
            await keeping.run_once()
    assert refused.value.status == 403
    assert files(tmp_path) == copied(secret_stored(fake))  # served all the same
    assert keeping.ready.is_set()


async def test_run_forever_retries_failures_and_follows_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keeper, "BACKOFF_SECONDS", (0.01,))
    fake = FakeApi(failing=3)
    async with scripted_api(fake) as api:
        keeping = make_keeper(api, tmp_path, [False], period=0.02)
        task = asyncio.create_task(keeping.run_forever())
        try:
            await eventually(lambda: len(fake.requests) > 4, timeout=10, what="retries")
            assert not keeping.ready.is_set()
            first = certificates.renew(None, NAMES, NOW)
            fake.put_secret(first)
            assert await keeping.wait_ready(10)
            assert files(tmp_path) == copied(first)
            second = certificates.renew(None, NAMES, NOW)
            fake.put_secret(second)
            await eventually(lambda: files(tmp_path) == copied(second), timeout=10)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert fake.writes() == []


async def test_a_new_leader_acts_without_waiting_out_the_period(tmp_path: Path) -> None:
    fake = FakeApi()
    leading = [False]
    changed = asyncio.Event()
    async with scripted_api(fake) as api:
        keeping = make_keeper(api, tmp_path, leading, leader_changed=changed, period=600)
        task = asyncio.create_task(keeping.run_forever())
        try:
            await eventually(lambda: fake.calls() == [("GET", SECRET)], timeout=10)
            leading[0] = True
            changed.set()
            assert await keeping.wait_ready(5)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert ("POST", SECRETS) in fake.calls()
