"""The governor: time-slices each GPU among the workloads placed on it (DESIGN.md section 7).

Modules:

- :mod:`fgpu.agent.governor.plan`: the pure planner (:func:`~fgpu.agent.governor.plan.plan`)
  and its value types.
- :mod:`fgpu.agent.governor.virtual`: runs the planner on a virtual clock (tests, docs).
"""
