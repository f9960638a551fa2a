"""fgpu: fractional GPU sharing.

Layers, bottom up (the README's picture; ``tests/unit/test_layers.py`` checks them):
:mod:`fgpu.model` and :mod:`fgpu.wire`; :mod:`fgpu.sched` and :mod:`fgpu.plugins` (the
placement and decision cores), :mod:`fgpu.store`, :mod:`fgpu.agent`, :mod:`fgpu.mig`;
:mod:`fgpu.rules` (request rules shared by the service and Kubernetes); :mod:`fgpu.server`
(the service), :mod:`fgpu.k8s` (Kubernetes), :mod:`fgpu.sim` (trace simulators),
:mod:`fgpu.client` (the typed HTTP client); :mod:`fgpu.cli` (the command line) on top.
"""

__version__ = "0.1.0"
