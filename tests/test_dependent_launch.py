"""Programmatic dependent launches of the direct kernel: when the plan asks for
them, and the driver structures they are launched with (no GPU needed)."""

import ctypes

import pytest

from cupy_dcp import _settings
from cupy_dcp.direct import dependent_launch

OWN = ["0000:19:00", "0000:3b:00"]  # every rank on a GPU of its own


def test_every_rank_on_its_own_hopper():
    assert dependent_launch(OWN, (9, 0), 12030)
    assert dependent_launch(OWN, (10, 0), 13000, enabled=True)


@pytest.mark.parametrize("addresses, capability, driver, enabled", [
    (["0000:19:00", "0000:19:00"], (9, 0), 13000, True),  # two ranks share a GPU
    (OWN + ["0000:19:00"], (9, 0), 13000, True),
    (OWN, (8, 0), 13000, True),  # no griddepcontrol before Hopper
    (OWN, (9, 0), 12020, True),  # graphs capture the dependency from CUDA 12.3 on
    (OWN, (9, 0), 13000, False),  # pdl=False
])
def test_ordinary_launches_elsewhere(addresses, capability, driver, enabled):
    assert not dependent_launch(addresses, capability, driver, enabled)


def test_the_setting():
    # unset or 1: dependent launches where the GPUs support them (None); 0: never
    assert _settings.pdl(None, {}) is None and _settings.pdl(None, {"CUPY_DCP_PDL": "1"}) is None
    assert _settings.pdl(None, {"CUPY_DCP_PDL": "0"}) is False
    with pytest.raises(ValueError, match="CUPY_DCP_PDL"):
        _settings.pdl(None, {"CUPY_DCP_PDL": "yes"})


def test_the_lines_setting():
    every = ("tiles", "words", "lines")
    assert _settings.protocols(None, {}) == every
    assert _settings.protocols(None, {"CUPY_DCP_LINES": "1"}) == every
    assert "lines" not in _settings.protocols(None, {"CUPY_DCP_LINES": "0"})
    with pytest.raises(ValueError, match=r"^CUPY_DCP_LINES must be 0 or 1 \(got 'off'\)$"):
        _settings.protocols(None, {"CUPY_DCP_LINES": "off"})


def _config_bytes(config):
    """The bytes of a ``CUlaunchConfig`` as the driver reads them."""
    return ctypes.string_at(ctypes.addressof(config), ctypes.sizeof(config))


def test_driver_structures_match_cuda_h():
    # CUlaunchConfig: seven unsigned ints, then the stream, the attributes, their count
    from cuda.bindings import driver

    from cupy_dcp.kernels import _launch

    assert ctypes.sizeof(_launch._LaunchConfig) == 56
    assert ctypes.sizeof(_launch._LaunchAttribute) == 72
    kernel = _launch.SpecializedKernel.__new__(_launch.SpecializedKernel)
    kernel.dependent = True
    launch = _launch._DriverLaunch(kernel, 2, [3, 4], (5, 1, 1, 32, 8, 1))
    launch._config.hStream = 0x1234
    raw = _config_bytes(launch._config)
    assert [int.from_bytes(raw[4 * i:4 * i + 4], "little") for i in range(7)] == [
        5, 1, 1, 32, 8, 1, 0]
    assert int.from_bytes(raw[48:52], "little") == 1  # numAttrs
    # CUlaunchAttribute: an enum, padding to 8, a 64-byte union whose first member is
    # programmaticStreamSerializationAllowed
    attribute = ctypes.string_at(int.from_bytes(raw[40:48], "little"), 72)
    assert attribute[:4] == (6).to_bytes(4, "little") and attribute[8:12] == (1).to_bytes(4, "little")
    assert int(driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) == 6
    # the same bytes as cuda.bindings' own structures of the same values (the pointers
    # to the attributes aside)
    theirs = driver.CUlaunchConfig()
    (theirs.gridDimX, theirs.gridDimY, theirs.gridDimZ, theirs.blockDimX, theirs.blockDimY,
     theirs.blockDimZ) = (5, 1, 1, 32, 8, 1)
    theirs.hStream = 0x1234
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    theirs.attrs = [attr]
    theirs.numAttrs = 1
    their_raw = ctypes.string_at(theirs.getPtr(), 56)
    assert raw[:40] == their_raw[:40] and raw[48:52] == their_raw[48:52]
    their_attribute = ctypes.string_at(int.from_bytes(their_raw[40:48], "little"), 12)
    assert attribute[:4] + attribute[8:12] == their_attribute[:4] + their_attribute[8:12]
    kernel.dependent = False
    plain = _config_bytes(_launch._DriverLaunch(kernel, 1)._config)
    assert int.from_bytes(plain[48:52], "little") == 0  # no attribute: an ordinary launch


class _FakeDriver:
    """Records the launches a driver launch makes (no GPU): the driver's
    ``cuLaunchKernelEx`` as the ctypes entry calls it, with four addresses."""

    def __init__(self, result=0):
        self.calls = []
        self.result = result

    def __call__(self, config, function, params, extra):
        from cupy_dcp.kernels._launch import _LaunchAttribute, _LaunchConfig

        # every argument as the entry declares none: a void pointer, or None
        assert all(isinstance(a, ctypes.c_void_p) for a in (config, function, params))
        assert extra is None
        config, function, params = config.value, function.value, params.value
        c = _LaunchConfig.from_address(config)
        attributes = [(a.id, ctypes.c_int32.from_buffer_copy(a.value).value)
                      for a in (_LaunchAttribute * c.numAttrs).from_address(c.attrs or 0)] \
            if c.numAttrs else []
        self.calls.append(("ex", function, (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX,
                                            c.blockDimY, c.blockDimZ), c.sharedMemBytes,
                           c.hStream or 0, params, extra or 0, attributes))
        return self.result


def _driver_kernel(monkeypatch, dependent, function):
    """A SpecializedKernel of the driver launcher with no cubin, and the stand-in
    driver its launches go to."""
    from cupy_dcp.kernels import _launch

    fake = _FakeDriver()
    monkeypatch.setattr(_launch, "_launch_entry", lambda: fake)
    kernel = _launch.SpecializedKernel.__new__(_launch.SpecializedKernel)
    kernel.dependent, kernel.launcher = dependent, "driver"
    kernel._function_in_current_context = lambda: function
    return kernel, fake


def _check_launch(call, dependent, function, grid, block, stream, flat):
    """One recorded launch: its entry point, dimensions, stream and parameter block."""
    assert call[0] == "ex"
    dims = (tuple(grid) + (1, 1))[:3] + (tuple(block) + (1, 1))[:3]
    assert call[1:5] == (function, dims, 0, stream)
    pointers = (ctypes.c_uint64 * len(flat)).from_address(call[5])
    assert [ctypes.c_int64.from_address(p).value for p in pointers] == flat
    assert call[6] == 0  # no extra
    assert call[7] == ([(6, 1)] if dependent else [])


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


def test_a_failed_driver_launch_raises(monkeypatch):
    from cuda.bindings import driver

    kernel, fake = _driver_kernel(monkeypatch, True, 1)
    fake.result = int(driver.CUresult.CUDA_ERROR_INVALID_VALUE)
    monkeypatch.setattr(driver, "cuGetErrorString",
                        lambda err: (driver.CUresult.CUDA_SUCCESS, b"invalid argument"))
    with pytest.raises(RuntimeError, match=r"^cuLaunchKernelEx failed: invalid argument "
                                           r"\(CUresult 1\)$"):
        kernel.prepare((1,), (32,), [0])(5)
