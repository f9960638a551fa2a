"""Node agent: GPU backends, the process launcher and its restart-safe wrapper.

Modules (import from them directly; this package imports nothing so that the launch
wrapper :mod:`fgpu.agent.runner` starts fast):

- :mod:`fgpu.agent.backend`: the :class:`~fgpu.agent.backend.GpuBackend` protocol, its
  value types, :class:`~fgpu.agent.backend.SimulatedBackend` and
  :func:`~fgpu.agent.backend.detect_backend`.
- :mod:`fgpu.agent.nvml`: :class:`~fgpu.agent.nvml.NvmlBackend` (nvidia-ml-py, imported
  lazily) and the NVML name -> catalog name rule.
- :mod:`fgpu.agent.launcher`: :class:`~fgpu.agent.launcher.Launcher`, launch specs, process
  handles and states.
- :mod:`fgpu.agent.runner`: the wrapper every workload runs under; it records the exit code in
  a file so that the code survives an agent restart.
- :mod:`fgpu.agent.governor`: time-slicing of each GPU (compute modes ``strict``/``fair``,
  priority ``pause``/``compress``) by holding workloads at kernel launch (interposer) or
  freezing and thawing them; the pure planner, the launch gate, the freeze mechanisms, the
  hint socket and the :class:`~fgpu.agent.governor.runtime.Governor`.
- :mod:`fgpu.agent.interposer`: the agent's side of libfgpu, the CUDA driver API interposer
  (each workload's segment: memory caps, launch gate, counters; the preload environment).
- :mod:`fgpu.agent.fakegpu`: simulated GPUs whose workloads run against the fake CUDA driver
  (a stand-in for tests and demos).
- :mod:`fgpu.agent.memguard`: stops a workload that holds more GPU memory than its quota.
- :mod:`fgpu.agent.limits`: :func:`~fgpu.agent.limits.launch_env`, the framework and MPS
  limits put into a workload's environment before launch.
- :mod:`fgpu.agent.events`: the events these record for ``fgpu describe``.

The agent imports :mod:`fgpu.model` and the standard library (plus psutil), never
:mod:`fgpu.server`.
"""
