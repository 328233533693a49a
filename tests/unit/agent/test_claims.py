"""Which devices of a claim the agent may prepare: ours, from this node's pool, or an error."""

import re
import uuid
from typing import Any

import pytest

from dra_gpu.agent.claims import (
    ADMIN_ACCESS_ENV,
    AllocatedDevice,
    ClaimError,
    ClaimRef,
    admin_access_env,
    allocated_devices,
    check_identity,
    check_request,
    stale_reason,
)
from dra_gpu.resource.bodies import ClaimUID

REF = ClaimRef("ns", "c", ClaimUID("u1"))


def claim(results: list[dict[str, Any]] | None) -> dict[str, object]:
    status = {} if results is None else {"allocation": {"devices": {"results": results}}}
    return {"metadata": {"uid": "u1"}, "status": status}


def test_only_our_drivers_results_are_taken_with_base_request_names() -> None:
    body = claim(
        [
            {
                "driver": "gpu.example.com",
                "pool": "node-01",
                "device": "gpu-0",
                "request": "g/large",
            },
            {"driver": "nic.example.com", "pool": "node-01", "device": "nic-0", "request": "n"},
        ]
    )
    devices = allocated_devices(body, REF, "gpu.example.com", "node-01")
    assert devices == [AllocatedDevice("g/large", "node-01", "gpu-0")]
    assert devices[0].base_request == "g"


def test_an_admin_access_result_is_prepared_as_a_monitoring_view() -> None:
    result: dict[str, Any] = {"driver": "d", "pool": "node-01", "device": "gpu-0", "request": "m"}
    body = claim([{**result, "adminAccess": True}, {**result, "device": "gpu-1"}])
    admin, plain = allocated_devices(body, REF, "d", "node-01")
    assert (admin.admin_access, plain.admin_access) == (True, False)
    assert admin_access_env(admin) == {ADMIN_ACCESS_ENV: "true"}
    assert admin_access_env(plain) == {}


def test_a_device_from_another_nodes_pool_is_refused() -> None:
    body = claim([{"driver": "d", "pool": "node-02", "device": "gpu-0", "request": "g"}])
    with pytest.raises(ClaimError, match=r"devices node-02/gpu-0 are not in pool node-01"):
        allocated_devices(body, REF, "d", "node-01")


def test_an_unallocated_claim_is_refused() -> None:
    with pytest.raises(ClaimError, match="ResourceClaim ns/c is not allocated"):
        allocated_devices(claim(None), REF, "d", "node-01")


def test_a_replaced_claim_is_refused() -> None:
    with pytest.raises(ClaimError, match="has UID u2, not u1: it was deleted and re-created"):
        check_identity({"metadata": {"uid": "u2"}}, REF)


def test_a_request_without_namespace_or_uid_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(ClaimError, match=r"the request lacks namespace, uid$"):
        check_request(ClaimRef("", "c", ClaimUID("")))


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        (ClaimRef("a/b", "c", ClaimUID("u")), "namespace is not a DNS label"),
        (ClaimRef("ns", "../../api/v1/secrets", ClaimUID("u")), "name is not a DNS subdomain"),
        (ClaimRef("ns", "c", ClaimUID("../x")), "uid is not a Kubernetes UID"),
        (ClaimRef("", "C", ClaimUID("u")), "the request lacks namespace; name is not a DNS"),
        (ClaimRef("ns", "a" * 254, ClaimUID("u")), "name is longer than 253 characters"),
    ],
)
def test_names_that_the_api_server_never_gives_are_refused_before_any_use(
    ref: ClaimRef, problem: str
) -> None:
    with pytest.raises(ClaimError, match=re.escape(problem)):
        check_request(ref)


def test_real_names_pass() -> None:
    check_request(ClaimRef("t-1a2b3c", "w0-3-gpu-ztl46.x", ClaimUID(str(uuid.uuid4()))))


def allocated(uid: str, *devices: tuple[str, str, str]) -> dict[str, object]:
    results = [{"driver": d, "pool": p, "device": n, "request": "gpu"} for d, p, n in devices]
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": results}}}}


MINE = ("gpu.example.com", "node-01", "gpu-0")


@pytest.mark.parametrize(
    ("claim", "reason"),
    [
        (allocated("u1", MINE), None),
        (allocated("u1", MINE, ("other.example.com", "node-01", "x")), None),
        (None, "it no longer exists"),
        (allocated("u2", MINE), "it was deleted and re-created"),
        ({"metadata": {"uid": "u1"}, "status": {}}, "it is no longer allocated"),
        (
            allocated("u1", ("gpu.example.com", "node-01", "gpu-1")),
            "it is now allocated other devices of node node-01 than were prepared",
        ),
    ],
)
def test_a_record_is_stale_once_its_claim_no_longer_holds_what_was_prepared(
    claim: dict[str, object] | None, reason: str | None
) -> None:
    prepared = [("node-01", "gpu-0")]
    assert stale_reason(claim, "u1", prepared, "gpu.example.com", "node-01") == reason


def test_a_record_from_another_nodes_pool_is_stale_here() -> None:
    theirs = allocated("u1", ("gpu.example.com", "node-02", "gpu-0"))
    assert stale_reason(theirs, "u1", [("node-02", "gpu-0")], "gpu.example.com", "node-01") == (
        "it is now allocated other devices of node node-01 than were prepared"
    )
