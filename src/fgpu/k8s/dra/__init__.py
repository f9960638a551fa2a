"""fgpu's Dynamic Resource Allocation driver (``gpu.fgpu.io``) and what the scheduler shares
with it.

- :mod:`~fgpu.k8s.dra.share`: names and the opaque configuration (the share) the scheduler
  writes into a claim's allocation and the driver reads; no gRPC, no client.
- :mod:`~fgpu.k8s.dra.slices`: the node's ResourceSlice (one device per GPU and per MIG
  instance) and its publication.
- :mod:`~fgpu.k8s.dra.cdi`: the CDI spec a prepared claim gets.
- :mod:`~fgpu.k8s.dra.driver`: the kubelet plugin (registration and the ``DRAPlugin``
  gRPC service over Unix sockets).

Only :mod:`~fgpu.k8s.dra.driver` imports ``grpc``.
"""
