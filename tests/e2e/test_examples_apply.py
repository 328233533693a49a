"""crds-examples/ holds Kubernetes objects only: a new user's ``kubectl apply -f crds-examples/``
goes through (simulated profiles, which are agent configuration, live in charts/dra-gpu/profiles/).

Server-side dry run: the API server validates and admits every object, and nothing is created.
"""

from __future__ import annotations

import yaml

from tests.e2e.helpers import EXAMPLES, Kubectl


def _objects() -> list[str]:
    """``kind/name`` of every object in the folder, as kubectl would apply them."""
    objects = []
    for path in sorted(EXAMPLES.iterdir()):
        assert path.suffix in (".yaml", ".yml", ".json"), f"{path.name} is not a manifest"
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                assert doc.get("apiVersion"), f"{path.name}: apiVersion not set"
                assert doc.get("kind"), f"{path.name}: kind not set"
                objects.append(f"{doc['kind']}/{doc['metadata']['name']}")
    return objects


async def test_the_whole_examples_folder_applies_as_a_new_user_applies_it(
    kubectl: Kubectl,
) -> None:
    out = await kubectl("apply", "--dry-run=server", "-f", str(EXAMPLES))
    lines = [line for line in out.splitlines() if line.strip()]
    assert all(line.endswith("(server dry run)") for line in lines), out
    assert len(lines) == len(_objects()), out
