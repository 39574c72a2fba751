"""slax: differentiable Slang kernels as JAX functions."""

from slax import nn, testing
from slax._config import config
from slax._device import DeviceKind, set_device_kind
from slax._errors import DeviceUnavailableError, SlangCompileError
from slax._kernel import SlangKernel
from slax._module import (
    SlangFunction,
    SlangModule,
    load_module,
    load_module_from_source,
)

__all__ = [
    "DeviceKind",
    "nn",
    "testing",
    "DeviceUnavailableError",
    "SlangCompileError",
    "SlangFunction",
    "SlangKernel",
    "config",
    "SlangModule",
    "load_module",
    "load_module_from_source",
    "set_device_kind",
]
