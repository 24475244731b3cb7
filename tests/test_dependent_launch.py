"""Programmatic dependent launches of the direct kernel: when the plan asks for
them, and the driver structures they are launched with (no GPU needed)."""

import ctypes

import pytest

from cupy_dcp.direct import dependent_launch
from cupy_dcp.kernels._launch import (_PROGRAMMATIC_STREAM_SERIALIZATION, _LaunchAttribute,
                                      _LaunchConfig)

OWN = ["0000:19:00", "0000:3b:00"]  # every rank on a GPU of its own


def test_every_rank_on_its_own_hopper():
    assert dependent_launch(OWN, (9, 0), 12030, env={})
    assert dependent_launch(OWN, (10, 0), 13000, env={"CUPY_DCP_PDL": "1"})


@pytest.mark.parametrize("addresses, capability, driver, env", [
    (["0000:19:00", "0000:19:00"], (9, 0), 13000, {}),  # two ranks share a GPU
    (OWN + ["0000:19:00"], (9, 0), 13000, {}),
    (OWN, (8, 0), 13000, {}),  # no griddepcontrol before Hopper
    (OWN, (9, 0), 12020, {}),  # graphs capture the dependency from CUDA 12.3 on
    (OWN, (9, 0), 13000, {"CUPY_DCP_PDL": "0"}),
])
def test_ordinary_launches_elsewhere(addresses, capability, driver, env):
    assert not dependent_launch(addresses, capability, driver, env=env)


def test_a_bad_setting_is_refused():
    with pytest.raises(ValueError, match="CUPY_DCP_PDL"):
        dependent_launch(OWN, (9, 0), 13000, env={"CUPY_DCP_PDL": "yes"})


def test_driver_structures_match_cuda_h():
    # CUlaunchAttribute: an enum, padding to 8, a 64-byte union
    assert ctypes.sizeof(_LaunchAttribute) == 72
    assert _LaunchAttribute.allowed.offset == 8
    # CUlaunchConfig: seven unsigned ints, then the stream, the attributes, their count
    assert ctypes.sizeof(_LaunchConfig) == 56
    assert (_LaunchConfig.hStream.offset, _LaunchConfig.attrs.offset,
            _LaunchConfig.numAttrs.offset) == (32, 40, 48)
    assert _PROGRAMMATIC_STREAM_SERIALIZATION == 6
    attribute = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION, allowed=1)
    raw = bytes(attribute)
    assert raw[:4] == (6).to_bytes(4, "little") and raw[8:12] == (1).to_bytes(4, "little")
