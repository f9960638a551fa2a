"""Request rules and limits shared by the service (:mod:`fgpu.server`) and the Kubernetes
adapters (:mod:`fgpu.k8s`): a layer below both, above the model and the store's records.

- :mod:`fgpu.rules.requests`: from a submission (or a pod's annotations) to a validated
  :class:`fgpu.model.types.Request`, the queue settings, and the limits (priority, grace,
  command size);
- :mod:`fgpu.rules.errors`: the refusals, each naming the field and the reason, with the HTTP
  status an API answers them with.
"""
