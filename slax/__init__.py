"""slax: differentiable Slang kernels as JAX functions."""

# slax._device first: it notes the exit handlers SlangPy registers as it is imported.
from slax import _device as _device
from slax import nn, parallel, testing
from slax._config import Config, DeviceKind, config, set_device_kind
from slax._device import describe_device
from slax._errors import DeviceUnavailableError, SlangCompileError
from slax._function import SlangFunction
from slax._kernel import SlangKernel
from slax._launch import launch_route
from slax._module import SlangModule, load_module, load_module_from_source
from slax._tensors import grid
from slax.parallel import data_parallel

__all__ = [
    "Config",
    "DeviceKind",
    "nn",
    "parallel",
    "testing",
    "DeviceUnavailableError",
    "SlangCompileError",
    "SlangFunction",
    "SlangKernel",
    "config",
    "SlangModule",
    "data_parallel",
    "describe_device",
    "grid",
    "launch_route",
    "load_module",
    "load_module_from_source",
    "set_device_kind",
]
