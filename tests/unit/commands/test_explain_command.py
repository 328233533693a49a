"""``dra-gpu explain`` and ``dra-gpu status`` by kubectl's habits, without a cluster: the flags,
the tables, the JSON (its keys pinned: documented and stable), the exit code, and the readings
over an API answered in memory (the tutorial's bodies from crds-examples/), paged as the API
server pages a list."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from dra_gpu import cli, kube
from dra_gpu.controller import command, explain, output, snapshot, status
from dra_gpu.exits import ExitCode

EXAMPLES = Path(__file__).resolve().parents[3] / "crds-examples"
Body = dict[str, Any]


# ---- the tutorial's bodies -------------------------------------------------------------------


def device_class() -> Body:
    return cast(Body, yaml.safe_load((EXAMPLES / "deviceclass.yaml").read_text()))


def node_slice() -> Body:
    """node-01 with gpu-0 (24Gi) and gpu-1 (8Gi)."""
    return cast(Body, yaml.safe_load((EXAMPLES / "resourceslice.yaml").read_text()))


def claim(name: str, namespace: str = "default", *, allocated: str | None = None) -> Body:
    template = next(yaml.safe_load_all((EXAMPLES / "recomendador.yaml").read_text()))
    body: Body = {
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
        "spec": copy.deepcopy(template["spec"]["spec"]),
    }
    if allocated:
        result = {"request": "gpu", "driver": "gpu.example.com", "pool": "node-01"}
        body["status"] = {"allocation": {"devices": {"results": [{**result, "device": allocated}]}}}
    return body


def pod(name: str, claim_name: str, namespace: str = "default", **labels: str) -> Body:
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}", "labels": labels},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}]},
        "status": {"phase": "Pending"},
    }


NODE = {
    "metadata": {"name": "node-01"},
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}


class FakeApi:
    """Answers ``get`` from lists by path, a page of ``limit`` at a time; records the queries."""

    def __init__(self, lists: Mapping[str, list[Body]]) -> None:
        self.lists = lists
        self.queries: list[tuple[str, dict[str, Any]]] = []
        self.namespace: str | None = None

    async def get(self, path: str, **query: Any) -> Body:
        self.queries.append((path, query))
        items = list(self.lists.get(path, []))
        if query.get("labelSelector"):
            key, _, value = query["labelSelector"].partition("=")
            items = [i for i in items if i["metadata"].get("labels", {}).get(key) == value]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or len(items) or 1)
        page = items[start : start + limit]
        more = str(start + limit) if start + limit < len(items) else ""
        return {"items": page, "metadata": {"continue": more} if more else {}}


def cluster(*claims: Body, pods: tuple[Body, ...] = (), slices: tuple[Body, ...] = ()) -> FakeApi:
    by_ns: dict[str, list[Body]] = {}
    for p in pods:
        by_ns.setdefault(p["metadata"]["namespace"], []).append(p)
    lists = {
        snapshot.PATHS["DeviceClass"]: [device_class()],
        snapshot.PATHS["ResourceClaim"]: list(claims),
        snapshot.PATHS["ResourceSlice"]: list(slices),
        snapshot.PATHS["Node"]: [NODE],
        "/api/v1/pods": list(pods),
        **{f"/api/v1/namespaces/{ns}/pods": found for ns, found in by_ns.items()},
    }
    return FakeApi(lists)


def api_of(fake: FakeApi) -> kube.Kube:
    return cast(kube.Kube, fake)


# ---- the flags -------------------------------------------------------------------------------


def test_explain_takes_kubectls_flags() -> None:
    args = cli.build_parser().parse_args(
        ["explain", "-A", "-l", "app=x", "--context", "prod", "-o", "json"]
    )
    assert (args.target, args.all_namespaces, args.selector) == (None, True, "app=x")
    assert (args.context, args.output, args.namespace) == ("prod", "json", None)


def test_the_plugin_names_itself_kubectl_dra_gpu_in_its_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.kubectl_main(["explain", "-o", "xml"])
    assert raised.value.code == ExitCode.USAGE
    assert capsys.readouterr().err.startswith("kubectl dra-gpu explain: argument -o/--output")


def test_the_plugin_is_a_console_script_of_the_same_code() -> None:
    pyproject = (EXAMPLES.parent / "pyproject.toml").read_text()
    assert 'kubectl-dra_gpu = "dra_gpu.cli:kubectl_main"' in pyproject


@pytest.mark.parametrize(
    ("query", "says"),
    [
        (command.Query("pod/x", all_namespaces=True), "across all namespaces"),
        (command.Query("pod/x", selector="a=b"), "with a selector"),
        (command.Query("deployment/x"), "expected pod/NAME or resourceclaim/NAME"),
        (command.Query("pod/"), "expected pod/NAME"),
    ],
)
def test_a_target_kubectl_would_refuse_is_a_usage_error(query: command.Query, says: str) -> None:
    with pytest.raises(command.BadTarget, match=says):
        query.checked()


def test_kubectls_short_names_are_targets() -> None:
    assert command.Query("po/x").checked() == ("pod", "x")
    assert command.Query("resourceclaims/y").checked() == ("resourceclaim", "y")


def test_the_krew_manifest_installs_the_plugin_binary() -> None:
    manifest = yaml.safe_load((EXAMPLES.parent / "plugins" / "dra-gpu.yaml").read_text())
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert (manifest["kind"], manifest["metadata"]["name"]) == ("Plugin", "dra-gpu")
    assert manifest["spec"]["version"] == f"v{__import__('dra_gpu').__version__}"
    assert len(manifest["spec"]["shortDescription"]) <= 50  # krew's index rule
    for platform in manifest["spec"]["platforms"]:
        assert platform["bin"] == "kubectl-dra_gpu"
        assert platform["selector"]["matchLabels"]["os"] in ("linux", "darwin")


# ---- the JSON: explain.to_dict ---------------------------------------------------------------


async def test_the_json_keys_are_pinned() -> None:
    fake = cluster(claim("a"), pods=(pod("p", "a"),), slices=(node_slice(),))
    rows = await command.explain_waiting(api_of(fake), "default", None, detail=True)
    (item,) = command.document(rows)["explanations"]
    assert list(item) == ["claim", "reason", "missing", "message", "pieces", "requests", "pods"]
    assert list(item["pieces"][0]) == ["name", "satisfied", "reason"]
    (request,) = item["requests"]
    assert list(request) == [
        "request",
        "deviceClass",
        "reason",
        "satisfied",
        "message",
        "pieces",
        "devices",
        "notes",
        "nodes",
        "subrequests",
    ]
    assert list(request["devices"][0]) == ["driver", "pool", "device", "node", "verdict", "text"]
    assert (item["claim"], item["reason"], item["missing"]) == ("default/a", "Satisfiable", False)
    assert item["pods"] == ["default/p"]
    assert [d["verdict"] for d in request["devices"]] == ["fits", "mismatch"]
    # Plain values: JSON and YAML both read it back unchanged.
    text = output.dump(command.document(rows), "json")
    assert json.loads(text) == yaml.safe_load(output.dump(command.document(rows), "yaml"))


# ---- the table and the exit code -------------------------------------------------------------


async def test_all_namespaces_lists_every_waiting_claim_with_its_missing_piece() -> None:
    fake = cluster(
        claim("waits", "team-a"),
        claim("held", "team-b", allocated="gpu-0"),
        claim("unused", "team-b"),
        pods=(pod("p1", "waits", "team-a"), pod("p2", "held", "team-b")),
    )
    rows = await command.explain_waiting(api_of(fake), None, None, detail=False)
    text = command.render_list(rows, "", all_namespaces=True)
    assert text.splitlines() == [
        "NAMESPACE   CLAIM    POD      MISSING   REASON",
        "team-a      waits    p1       devices   NoDevicesPublished",
        "team-b      unused   <none>   devices   NoDevicesPublished",
    ]
    answer = command.Answer(text, rows)
    assert not answer.satisfied  # cli: ExitCode.NOT_SATISFIED
    assert ("/api/v1/pods", {"limit": snapshot.PAGE_SIZE, "labelSelector": None}) in fake.queries


async def test_a_namespace_lists_its_own_claims_only_and_wide_adds_the_message() -> None:
    fake = cluster(
        claim("mine"), claim("theirs", "other"), pods=(pod("p", "mine"),), slices=(node_slice(),)
    )
    rows = await command.explain_waiting(api_of(fake), "default", None, detail=False)
    (line,) = command.render_list(rows, "wide", all_namespaces=False).splitlines()[1:]
    assert line.split()[:4] == ["mine", "p", "<none>", "Satisfiable"]
    assert "no missing piece found" in line
    assert command.Answer("", rows).satisfied  # cli: ExitCode.OK


async def test_a_selector_explains_the_claims_of_the_pods_it_selects() -> None:
    fake = cluster(
        claim("a", allocated="gpu-0"),
        claim("b"),
        pods=(pod("pa", "a", app="web"), pod("pb", "b", app="batch")),
    )
    rows = await command.explain_waiting(api_of(fake), "default", "app=web", detail=False)
    assert [(r.name, r.explanation.reason) for r in rows] == [("a", explain.Reason.ALLOCATED)]


async def test_lists_are_read_page_by_page() -> None:
    claims = [claim(f"c{i}") for i in range(7)]
    fake = FakeApi({"/x": claims})
    original = snapshot.PAGE_SIZE
    snapshot.PAGE_SIZE = 3
    try:
        found = await snapshot.list_items(api_of(fake), "/x")
    finally:
        snapshot.PAGE_SIZE = original
    assert [c["metadata"]["name"] for c in found] == [f"c{i}" for i in range(7)]
    assert [q.get("continue") for _, q in fake.queries] == [None, "3", "6"]


async def test_a_target_prints_its_pieces_and_wide_its_devices() -> None:
    fake = cluster(claim("a"), pods=(pod("p", "a"),), slices=(node_slice(),))
    rows = await command.explain_one(api_of(fake), "pod", "p", "default")
    assert isinstance(rows, tuple)
    text = command.render_target(rows, "wide")
    assert text.startswith("ResourceClaim default/a:\nclass    OK   ")
    assert "  fits         node-01/gpu-0" in text
    assert "  mismatch     node-01/gpu-1 has memory 8Gi, needs >= 24Gi" in text


async def test_a_missing_target_is_named() -> None:
    with pytest.raises(command.ExplainError, match="pod default/nope not found"):
        await command.explain_one(api_of(cluster()), "pod", "nope", "default")


def test_table_pads_like_kubectl_get() -> None:
    assert output.table(["a", "bb"], [["xyz", ""], ["1", "2"]]) == (
        "A     BB\nxyz   <none>\n1     2\n"
    )


# ---- status ----------------------------------------------------------------------------------


async def test_status_counts_per_node_as_the_metrics_do() -> None:
    shared = node_slice()
    shared["metadata"]["name"] = "node-02"
    shared["spec"].update(nodeName="node-02", pool={"name": "node-02", "generation": 1})
    shared["spec"]["devices"] = [
        {
            "name": "gpu-0",
            "allowMultipleAllocations": True,
            "capacity": {"memory": {"value": "80Gi"}},
        }
    ]
    share = claim("s")
    result = {"request": "gpu", "driver": "gpu.example.com", "pool": "node-02", "device": "gpu-0"}
    share["status"] = {
        "allocation": {
            "devices": {
                "results": [{**result, "shareID": "1", "consumedCapacity": {"memory": "16Gi"}}]
            }
        }
    }
    fake = cluster(claim("x", allocated="gpu-0"), share, slices=(node_slice(), shared))
    view = await snapshot.load_view(api_of(fake), ("ResourceSlice", "ResourceClaim"))
    counted = status.count(view, "gpu.example.com")
    assert status.render(counted, "").splitlines() == [
        "NODE      DEVICES   ALLOCATED   FREE   MEMORY   MEMORY-ALLOCATED   PARTITIONS   SHARES",
        "node-01   2         1           1      32Gi     24Gi               0            0",
        "node-02   1         1           1      80Gi     16Gi               0            1",
    ]
    (node_02,) = status.document(counted)["nodes"][1:]
    assert node_02["sharedDevices"] == [
        {
            "device": "gpu-0",
            "shares": 1,
            "memoryBytes": {"published": 80 << 30, "used": 16 << 30, "free": 64 << 30},
        }
    ]
    assert status.count(view, "other.example.com").nodes == ()


async def test_status_leaves_out_a_pool_still_being_written_and_says_so() -> None:
    partial = node_slice()
    partial["spec"]["pool"]["resourceSliceCount"] = 2
    view = await snapshot.load_view(api_of(cluster(slices=(partial,))), ("ResourceSlice",))
    counted = status.count(view, "gpu.example.com")
    assert counted.nodes == ()
    assert counted.notes == (
        "pool node-01 of gpu.example.com is incomplete: 1 of 2 slices at generation 1: not counted",
    )
