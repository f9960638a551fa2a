"""fgpu: fractional GPU sharing.

Layers (see ``../shared/DESIGN.md``): :mod:`fgpu.model` (units and domain types),
:mod:`fgpu.sched` (cluster state and placement core), :mod:`fgpu.plugins` (placement
policies registered by name) and :mod:`fgpu.sim` (trace simulators and reports).
"""

__version__ = "0.1.0"
