"""The library and the machine: gpuipc's version, the CUDA driver, devices,
buffer kinds, the topology between GPUs and the GPUIPC_* settings. The C
calls live in _gpuipc_library.c."""
from . import _gpuipc as _c
from ._common import _kind


def version():
    """The library's version, "MAJOR.MINOR.PATCH"."""
    return _c.version()


def driver_status():
    """(code, driver_version, reason): code 0 when a CUDA driver and device
    are usable, else the reason's code; never raises."""
    return _c.driver_status()


def device_count():
    return _c.device_count()


def devices():
    """A dict per visible CUDA device (name, uuid, memory, capabilities)."""
    return [_c.device_info(i) for i in range(_c.device_count())]


def device_by_uuid(uuid):
    """The local ordinal of the GPU with this 16-byte UUID."""
    return _c.device_by_uuid(bytes(uuid))


def kind_available(kind):
    """(True, "") when buffers of ``kind`` can be made here, else (False, why)."""
    rc, why = _c.kind_available(_kind(kind))
    return rc == 0, why


def topology():
    """{(src, dst): p2p dict} for every pair of visible GPUs."""
    n = _c.device_count()
    return {(a, b): _c.topo_p2p(a, b) for a in range(n) for b in range(n)}


def config():
    """The GPUIPC_* settings in force."""
    return _c.config()

