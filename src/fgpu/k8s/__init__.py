"""Kubernetes adapters (issue #7): the fgpu scheduler as a secondary scheduler, the
admission webhook, the node agent, and the API's wire shapes (annotations, labels, the
``Queue`` custom resource).

The decision core is :class:`fgpu.sched.decide.Scheduler`, the same one ``fgpu serve`` and
the simulators run; this package only turns cluster objects into its inputs and its actions
into API calls. ``kubernetes`` (the official client) is imported only here, lazily.
"""
