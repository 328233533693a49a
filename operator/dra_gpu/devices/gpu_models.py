"""NVIDIA GPU models with MIG: what NVML reports for each, as data, and lookups.

Pure data: no NVML, no I/O. ``devices.mig`` builds its partition tables from these models, the
simulated backend offers them by ``key`` (``mig: H200-141GB``), and the tests' fake pynvml answers
NVML's MIG calls from them.

Where the numbers come from. Every GPU instance profile records what NVML answers for it:
``nvmlDeviceGetGpuInstanceProfileInfo(device, enum)`` (the ``NVML_GPU_INSTANCE_PROFILE_*`` value
asked for) gives ``id``, ``sliceCount`` (compute slices), ``instanceCount`` and ``memorySizeMB``;
``nvmlDeviceGetGpuInstancePossiblePlacements`` gives the placements (first memory slice, memory
slices spanned); ``nvmlGpuInstanceGetComputeInstanceProfileInfo`` the compute instance profiles
of a GPU instance of that profile. The values are NVIDIA's go-nvml mock GPUs
(``pkg/nvml/mock/gpus`` at v0.13.4-1, the oracle ``hack/nvmlref``), except where that mock is
known to differ from NVML, where they are NVIDIA's MIG User Guide ("Supported MIG Profiles",
``nvidia-smi mig -lgip`` / ``-lgipp``):

- ``id``: NVML's own profile id (the guide's "ID" column: on an A100 40GB 19, 20, 15, 14, 9, 5, 0
  for 1g.5gb ... 7g.40gb); the mock answers the enum value instead.
- ``name``: as NVML spells it (``MIG 1g.18gb`` in the v2 info's ``name``). The mock's info has
  no name; go-nvlib's rule (``NewMigProfile(...).String()``) applied to the mock's memory gives
  the guide's names except for the H200's and B200's (``MOCK_ERRATA``).
- placements of the H100, H200 and B200: the mock spans compute slices, not memory slices, for
  ``3g`` (3 instead of 4), ``7g`` (7 instead of 8) and the two-slice ``1g`` profile (7 placements
  of 1 slice, for 4 instances, instead of 4 of 2), which NVML does not (``MOCK_ERRATA``).

``tests/unit/devices/test_nvml_oracle.py`` checks every model against the oracle's dump field by
field, and that each erratum is still what the mock answers, so a change on either side fails.
To regenerate after moving the pin: ``hack/build-nvmlref.sh``, then
``.venv/bin/python -m tests.unit.devices.nvmlref dump dgxh200`` prints a machine's answers.
Memory is NVML's (the mock's MiB), slightly less than a profile's name says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

# nvmlGpuInstanceProfile values (nvml.h NVML_GPU_INSTANCE_PROFILE_*): ABI, stable.
PROFILE_1_SLICE = 0
PROFILE_2_SLICE = 1
PROFILE_3_SLICE = 2
PROFILE_4_SLICE = 3
PROFILE_7_SLICE = 4
PROFILE_1_SLICE_REV1 = 7  # +me: with the media engines
PROFILE_2_SLICE_REV1 = 8  # +me
PROFILE_1_SLICE_REV2 = 9  # one compute slice, two memory slices
# nvmlComputeInstanceProfile values (NVML_COMPUTE_INSTANCE_PROFILE_*).
COMPUTE_1_SLICE = 0
COMPUTE_2_SLICE = 1
COMPUTE_3_SLICE = 2
COMPUTE_4_SLICE = 3
COMPUTE_7_SLICE = 4
COMPUTE_1_SLICE_REV1 = 7


class ComputeProfile(NamedTuple):
    """A compute instance profile a GPU instance offers (shared engines)."""

    enum: int
    slices: int
    instances: int


@dataclasses.dataclass(frozen=True)
class GiProfile:
    """One GPU instance profile of a model, as NVML reports it."""

    enum: int
    """The ``NVML_GPU_INSTANCE_PROFILE_*`` value nvmlDeviceGetGpuInstanceProfileInfo takes."""
    id: int
    """NVML's profile id (``info.id``): what placements, creation and listing take."""
    name: str
    """As NVIDIA spells it: ``3g.20gb``, ``1g.5gb+me``."""
    memory_mib: int
    compute_slices: int
    instance_count: int
    starts: tuple[int, ...]
    """First memory slice of each possible placement."""
    memory_slices: int
    """Memory slices a placement spans."""
    compute_profiles: tuple[ComputeProfile, ...]

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")

    @property
    def nominal_gib(self) -> int:
        """The memory the name says: ``1g.18gb`` -> 18."""
        return int(self.name.split(".")[1].split("gb")[0])


@dataclasses.dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU model and its GPU instance profiles."""

    key: str
    """What a simulated profile's ``mig:`` names: ``A100-40GB``."""
    mig_model: str
    """The model as the partitions' ``migModel`` attribute says it: ``A100-SXM4-40GB``."""
    machine: str
    """The oracle's machine of this model (``hack/nvmlref``)."""
    memory_mib: int
    """The whole GPU's memory as NVML reports it (nvmlDeviceGetMemoryInfo)."""
    memory_slices: int
    compute_slices: int
    profiles: tuple[GiProfile, ...]

    @property
    def nominal_gib(self) -> int:
        return int(self.key.rsplit("-", 1)[1].removesuffix("GB"))

    def by_enum(self, enum: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.enum == enum), None)

    def by_id(self, profile_id: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.id == profile_id), None)


def _computes(*entries: tuple[int, int, int]) -> tuple[ComputeProfile, ...]:
    return tuple(ComputeProfile(*e) for e in entries)


# Compute instance profiles per GPU instance size, as the mock lists them (the Ampere mocks also
# offer COMPUTE_1_SLICE_REV1 in every GPU instance).
_AMPERE_CI = {
    1: _computes((0, 1, 1), (7, 1, 1)),
    2: _computes((0, 1, 2), (1, 2, 1), (7, 1, 2)),
    3: _computes((0, 1, 3), (1, 2, 1), (2, 3, 1), (7, 1, 3)),
    4: _computes((0, 1, 4), (1, 2, 2), (3, 4, 1), (7, 1, 4)),
    7: _computes((0, 1, 7), (1, 2, 3), (2, 3, 2), (3, 4, 1), (4, 7, 1), (7, 1, 7)),
}
_A30_CI = {
    1: _computes((0, 1, 1)),
    2: _computes((0, 1, 2), (1, 2, 1)),
    4: _computes((0, 1, 4), (1, 2, 2), (3, 4, 1)),
}
_HOPPER_CI = {
    1: _computes((0, 1, 1)),
    2: _computes((0, 1, 2), (1, 2, 1)),
    3: _computes((0, 1, 3), (1, 2, 1), (2, 3, 1)),
    4: _computes((0, 1, 4), (1, 2, 2), (3, 4, 1)),
    7: _computes((0, 1, 7), (1, 2, 3), (2, 3, 2), (4, 7, 1)),
}
_ALL_7 = (0, 1, 2, 3, 4, 5, 6)


def _eight_slices(
    key: str,
    mig_model: str,
    machine: str,
    memory_mib: int,
    names: tuple[str, str, str, str, str, str, str],
    mib: tuple[int, int, int, int],
    computes: Mapping[int, tuple[ComputeProfile, ...]],
) -> GpuModel:
    """A GPU of 8 memory and 7 compute slices (A100, H100, H200, B200): the same geometry and
    NVML ids, ``names`` 1g, 1g+me, 1g of two memory slices, 2g, 3g, 4g, 7g, and ``mib`` the
    memory of one, two and four memory slices and of the whole-GPU profile."""
    one, two, four, seven = mib
    rows = (
        (PROFILE_1_SLICE, 19, names[0], one, 1, 7, _ALL_7, 1),
        (PROFILE_1_SLICE_REV1, 20, names[1], one, 1, 1, _ALL_7, 1),
        (PROFILE_1_SLICE_REV2, 15, names[2], two, 1, 4, (0, 2, 4, 6), 2),
        (PROFILE_2_SLICE, 14, names[3], two, 2, 3, (0, 2, 4), 2),
        (PROFILE_3_SLICE, 9, names[4], four, 3, 2, (0, 4), 4),
        (PROFILE_4_SLICE, 5, names[5], four, 4, 1, (0,), 4),
        (PROFILE_7_SLICE, 0, names[6], seven, 7, 1, (0,), 8),
    )
    profiles = tuple(
        GiProfile(enum, pid, name, size, c, n, starts, m, computes[c])
        for enum, pid, name, size, c, n, starts, m in rows
    )
    return GpuModel(key, mig_model, machine, memory_mib, 8, 7, profiles)


A100_40GB = _eight_slices(
    "A100-40GB",
    "A100-SXM4-40GB",
    "dgxa100",
    40960,
    ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    (4864, 9856, 19968, 40192),
    _AMPERE_CI,
)
A100_80GB = _eight_slices(
    "A100-80GB",
    "A100-SXM4-80GB",
    "a100-80gb",
    81920,
    ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    (9856, 19968, 40192, 80384),
    _AMPERE_CI,
)
H100_80GB = _eight_slices(
    "H100-80GB",
    "H100-SXM5-80GB",
    "dgxh100",
    81920,
    ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    (10240, 20480, 40960, 81920),
    _HOPPER_CI,
)
H200_141GB = _eight_slices(
    "H200-141GB",
    "H200-SXM5-141GB",
    "dgxh200",
    144384,
    ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    (18432, 35840, 72704, 144384),
    _HOPPER_CI,
)
B200_180GB = _eight_slices(
    "B200-180GB",
    "B200-SXM5-180GB",
    "dgxb200",
    184320,
    ("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
    (23552, 46080, 92160, 184320),
    _HOPPER_CI,
)
A30_24GB = GpuModel(
    "A30-24GB",
    "A30-PCIE-24GB",
    "a30",
    24576,
    4,
    4,
    (
        GiProfile(PROFILE_1_SLICE, 14, "1g.6gb", 5836, 1, 4, (0, 1, 2, 3), 1, _A30_CI[1]),
        GiProfile(PROFILE_1_SLICE_REV1, 21, "1g.6gb+me", 5836, 1, 1, (0, 1, 2, 3), 1, _A30_CI[1]),
        GiProfile(PROFILE_2_SLICE, 5, "2g.12gb", 11672, 2, 2, (0, 2), 2, _A30_CI[2]),
        GiProfile(PROFILE_2_SLICE_REV1, 6, "2g.12gb+me", 11672, 2, 1, (0, 2), 2, _A30_CI[2]),
        GiProfile(PROFILE_4_SLICE, 0, "4g.24gb", 23344, 4, 1, (0,), 4, _A30_CI[4]),
    ),
)

MODELS: Mapping[str, GpuModel] = {
    m.key: m for m in (A100_40GB, A100_80GB, A30_24GB, H100_80GB, H200_141GB, B200_180GB)
}
"""By ``key``."""


def by_mig_model(mig_model: str) -> GpuModel | None:
    return next((m for m in MODELS.values() if m.mig_model == mig_model), None)


class Erratum(NamedTuple):
    """What go-nvml's mock answers for one profile where NVML answers otherwise."""

    placements: tuple[tuple[int, int], ...] | None = None
    """The mock's (start, size) placements; None: the mock's are NVML's."""
    nvlib_name: str | None = None
    """go-nvlib's name from the mock's memory; None: it is NVIDIA's name."""


_HOPPER_PLACEMENTS = {
    PROFILE_1_SLICE_REV2: tuple((s, 1) for s in _ALL_7),
    PROFILE_3_SLICE: ((0, 3), (4, 3)),
    PROFILE_7_SLICE: ((0, 7),),
}
MOCK_ERRATA: Mapping[tuple[str, int], Erratum] = {
    **{("H100-80GB", e): Erratum(placements=p) for e, p in _HOPPER_PLACEMENTS.items()},
    ("H200-141GB", PROFILE_1_SLICE): Erratum(nvlib_name="1g.35gb"),
    ("H200-141GB", PROFILE_1_SLICE_REV1): Erratum(nvlib_name="1g.35gb+me"),
    ("H200-141GB", PROFILE_1_SLICE_REV2): Erratum(_HOPPER_PLACEMENTS[PROFILE_1_SLICE_REV2]),
    ("H200-141GB", PROFILE_3_SLICE): Erratum(_HOPPER_PLACEMENTS[PROFILE_3_SLICE], "3g.88gb"),
    ("H200-141GB", PROFILE_4_SLICE): Erratum(nvlib_name="4g.88gb"),
    ("H200-141GB", PROFILE_7_SLICE): Erratum(_HOPPER_PLACEMENTS[PROFILE_7_SLICE]),
    ("B200-180GB", PROFILE_1_SLICE): Erratum(nvlib_name="1g.45gb"),
    ("B200-180GB", PROFILE_1_SLICE_REV1): Erratum(nvlib_name="1g.45gb+me"),
    ("B200-180GB", PROFILE_1_SLICE_REV2): Erratum(_HOPPER_PLACEMENTS[PROFILE_1_SLICE_REV2]),
    ("B200-180GB", PROFILE_3_SLICE): Erratum(_HOPPER_PLACEMENTS[PROFILE_3_SLICE]),
    ("B200-180GB", PROFILE_7_SLICE): Erratum(_HOPPER_PLACEMENTS[PROFILE_7_SLICE]),
}
"""(model key, profile enum) -> what the mock answers there instead of NVML's answer."""
