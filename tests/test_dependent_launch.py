"""Programmatic dependent launches of the direct kernel: when the plan asks for
them, and the driver structures they are launched with (no GPU needed)."""

import ctypes

import pytest

from cupy_dcp.direct import dependent_launch, lines_setting, pdl_setting
from cupy_dcp.kernels._launch import (_PROGRAMMATIC_STREAM_SERIALIZATION, _LaunchAttribute,
                                      _LaunchConfig)

OWN = ["0000:19:00", "0000:3b:00"]  # every rank on a GPU of its own


def test_every_rank_on_its_own_hopper():
    assert dependent_launch(OWN, (9, 0), 12030)
    assert dependent_launch(OWN, (10, 0), 13000, enabled=True)


@pytest.mark.parametrize("addresses, capability, driver, enabled", [
    (["0000:19:00", "0000:19:00"], (9, 0), 13000, True),  # two ranks share a GPU
    (OWN + ["0000:19:00"], (9, 0), 13000, True),
    (OWN, (8, 0), 13000, True),  # no griddepcontrol before Hopper
    (OWN, (9, 0), 12020, True),  # graphs capture the dependency from CUDA 12.3 on
    (OWN, (9, 0), 13000, False),  # CUPY_DCP_PDL=0
])
def test_ordinary_launches_elsewhere(addresses, capability, driver, enabled):
    assert not dependent_launch(addresses, capability, driver, enabled)


def test_the_setting():
    assert pdl_setting({}) and pdl_setting({"CUPY_DCP_PDL": "1"})
    assert not pdl_setting({"CUPY_DCP_PDL": "0"})
    with pytest.raises(ValueError, match="CUPY_DCP_PDL"):
        pdl_setting({"CUPY_DCP_PDL": "yes"})


def test_the_lines_setting():
    assert lines_setting({}) and lines_setting({"CUPY_DCP_LINES": "1"})
    assert not lines_setting({"CUPY_DCP_LINES": "0"})
    with pytest.raises(ValueError, match=r"^CUPY_DCP_LINES must be 0 or 1 \(got 'off'\)$"):
        lines_setting({"CUPY_DCP_LINES": "off"})


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


class _FakeDriver:
    """Records the launches a prepared driver launch makes (no GPU)."""

    def __init__(self):
        self.calls = []

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.calls.append(("plain", function, (gx, gy, gz, bx, by, bz), shared, stream, params))
        return 0

    def cuLaunchKernelEx(self, config, function, params, extra):
        c = config._obj  # ctypes.byref
        attribute = _LaunchAttribute.from_address(c.attrs)
        self.calls.append(("ex", function, (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX,
                                            c.blockDimY, c.blockDimZ), c.sharedMemBytes,
                           c.hStream, params, c.numAttrs, attribute.id, attribute.allowed))
        return 0


def _driver_kernel(monkeypatch, dependent, function):
    """A SpecializedKernel of the driver launcher with no cubin, and the stand-in
    driver its launches go to."""
    from cupy_dcp.kernels import _launch

    fake = _FakeDriver()
    monkeypatch.setattr(_launch, "_libcuda", lambda: fake)
    kernel = _launch.SpecializedKernel.__new__(_launch.SpecializedKernel)
    kernel.dependent, kernel.kind = dependent, "driver"
    kernel._function_in_current_context = lambda lib: function
    return kernel, fake


def _check_launch(call, dependent, function, grid, block, stream, flat):
    """One recorded launch: its entry point, dimensions, stream and parameter block."""
    assert call[0] == ("ex" if dependent else "plain")
    dims = (tuple(grid) + (1, 1))[:3] + (tuple(block) + (1, 1))[:3]
    assert call[1:5] == (function, dims, 0, stream)
    pointers = (ctypes.c_uint64 * len(flat)).from_address(call[5])
    assert [ctypes.c_int64.from_address(p).value for p in pointers] == flat
    if dependent:
        assert call[6:] == (1, _PROGRAMMATIC_STREAM_SERIALIZATION, 1)


@pytest.mark.parametrize("dependent", [False, True])
def test_a_prepared_driver_launch_passes_its_parameters(monkeypatch, dependent):
    kernel, fake = _driver_kernel(monkeypatch, dependent, 1234)
    flat = [7, -1, 2**40, 0]
    launch = kernel.prepare((5,), (32, 8), flat)  # ints flatten to themselves
    launch(99)
    launch(77)
    assert len(fake.calls) == 2
    for call, stream in zip(fake.calls, (99, 77)):
        _check_launch(call, dependent, 1234, (5,), (32, 8), stream, flat)


@pytest.mark.parametrize("dependent", [False, True])
def test_an_unprepared_driver_launch_passes_its_parameters(monkeypatch, dependent):
    kernel, fake = _driver_kernel(monkeypatch, dependent, 55)
    kernel._driver_setup(3)
    launches = (((4,), (32, 2), 11, [1, 2, 3]), ((9, 2), (32,), 12, [-5, 0, 7]))
    for grid, block, stream, flat in launches:
        kernel.launch_flat(grid, block, stream, flat)
        _check_launch(fake.calls[-1], dependent, 55, grid, block, stream, flat)
    assert len(fake.calls) == 2
