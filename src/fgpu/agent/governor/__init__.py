"""The governor: time-slices each GPU among the workloads placed on it (DESIGN.md section 7).

Modules:

- :mod:`fgpu.agent.governor.plan`: the pure planner (:func:`~fgpu.agent.governor.plan.plan`)
  and its value types.
- :mod:`fgpu.agent.governor.virtual`: runs the planner on a virtual clock (tests, docs).
- :mod:`fgpu.agent.governor.freezer`: freeze/thaw mechanisms (cgroup v2, SIGSTOP/SIGCONT).
- :mod:`fgpu.agent.governor.activity`: the socket that receives :mod:`fgpu.sdk` hints.
- :mod:`fgpu.agent.governor.runtime`: :class:`~fgpu.agent.governor.runtime.Governor`, the
  executor the service drives (``update``, ``before_signal``, ``snapshot``, ``close``).
"""
