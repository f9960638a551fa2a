"""``import fgpu.sdk`` in any workload's Python, without fgpu installed there.

fgpu's launcher puts the folder above this one first on each workload's ``PYTHONPATH``
(:data:`fgpu.sdk.PYTHONPATH_DIR`). This package stands for fgpu: its modules are looked up
in the real package, four folders up, and it runs the real package's ``__init__``. The SDK
needs only the standard library; other fgpu modules need fgpu's dependencies, as ever.
"""

import os as _os

_REAL = _os.path.dirname(
    _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
)
__path__ = [_REAL]
__file__ = _os.path.join(_REAL, "__init__.py")
with open(__file__, encoding="utf-8") as _init:
    exec(compile(_init.read(), __file__, "exec"))
