"""Ask cuGetProcAddress_v2 every request of the runtime's fixture, through the interposer
(run as a script under ``LD_PRELOAD=libfgpu.so``, not collected).

    python procaddr_worker.py FIXTURE LIBFGPU

Prints one JSON object: {"answers": [[name, cudaVersion, flags, CUresult, what]]}, where
``what`` is the hooked symbol whose hook came back, "driver" for any other non-NULL pointer,
or None for NULL.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

fixture = json.loads(Path(sys.argv[1]).read_text())
fgpu = ctypes.CDLL(sys.argv[2])
cu = ctypes.CDLL("libcuda.so.1")  # under LD_PRELOAD: the interposer's shim

names_fn = fgpu.fgpu_interposer_hook_names
names_fn.restype = ctypes.POINTER(ctypes.c_char_p)
hooks: dict[int, str] = {}
table = names_fn()
i = 0
while table[i] is not None:
    name = table[i].decode()
    if name.startswith("cu"):
        hooks[ctypes.cast(getattr(fgpu, name), ctypes.c_void_p).value or 0] = name
    i += 1

gpa = cu.cuGetProcAddress_v2
gpa.restype = ctypes.c_int
gpa.argtypes = [
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_int,
    ctypes.c_uint64,
    ctypes.POINTER(ctypes.c_int),
]
cu.cuInit.argtypes = [ctypes.c_uint]
cu.cuInit(0)
answers = []
for name, version, flags, _symbol in fixture["procaddr"]:
    ptr = ctypes.c_void_p()
    status = ctypes.c_int(-1)
    rc = gpa(name.encode(), ctypes.byref(ptr), version, flags, ctypes.byref(status))
    p = ptr.value
    answers.append([name, version, flags, rc, None if not p else hooks.get(p, "driver")])
print(json.dumps({"answers": answers, "hooks": sorted(hooks.values())}))
