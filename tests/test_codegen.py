"""slax/_codegen.py: the Python side of the kernel calling convention matches shaders/slax/kernel.slang."""

from __future__ import annotations

import re

from slax._codegen import GROUP_SIZE, ROW_THREADS
from slax._device import SHADER_DIR


def test_launch_constants_match_the_slang_convention():
    source = (SHADER_DIR / "slax" / "kernel.slang").read_text()
    constants = {
        name: eval(value, {})  # simple integer products such as 64 * 32768
        for name, value in re.findall(r"static const uint (\w+) = ([\d\s*]+);", source)
    }
    assert constants == {"SLAX_GROUP_SIZE": GROUP_SIZE, "SLAX_ROW_THREADS": ROW_THREADS}
