"""The agent's side of libfgpu, the CUDA driver API interposer (DESIGN.md section 7).

- :mod:`fgpu.agent.interposer.segment`: one workload's shared-memory segment (caps, gate,
  counters), mapped by the agent and by every process of the workload.
- :mod:`fgpu.agent.interposer.preload`: where segments live, and the environment that loads
  the interposer (and, on simulated GPUs, the fake driver) into a workload.

The C library itself is in ``native/interposer``; how it works and what it cannot do is in
``docs/governor.md``.
"""
