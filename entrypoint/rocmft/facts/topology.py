"""Where the GPUs sit: NUMA binding and network choices for multi-GPU and multi-node launches.

This module is the public face of two halves, each in its own module:

* :mod:`rocmft.facts.numa`: the host's NUMA nodes and CPU lists, each GPU's node by PCI address, and the binding
  plan (whether ``torchrun --numa-binding=node`` binds each worker to its GPU's node, ROCMFT_NUMA_BIND).
* :mod:`rocmft.facts.netenv`: the network environment of a multi-node run (the default route's interface, the
  ACTIVE InfiniBand/RoCE ports, HPE Slingshot NICs, RCCL's external network plugin, and the NCCL_*/GLOO_*/FI_*
  variables handed to the workers).

Everything there only reads Linux sysfs/procfs files below a ``root`` folder (``/`` on a real host, a recorded
layout under ``tests/data/sysfs/`` in tests) and returns a decision with a one-line reason for the log. Nothing
is changed: the binding itself is done by torchrun (``--numa-binding=node``, :mod:`torch.numa.binding`), and
the network variables are handed to the launcher, which adds them to the workers' environment. The sources of
each rule are named in the module that holds it.
"""

from __future__ import annotations

from rocmft.facts.netenv import (
    DEFAULT_NET_PLUGIN,
    INTERNAL_NETS,
    NET_PLUGIN_PREFIX,
    NET_PLUGIN_VERSIONS,
    OLD_NET_PLUGIN_VERSIONS,
    SLINGSHOT_SETTINGS,
    NetPlugin,
    NetworkEnvironment,
    SlingshotFabric,
    default_route_interface,
    infiniband_hcas,
    net_names,
    net_plugin,
    network_environment,
    slingshot_fabric,
)
from rocmft.facts.numa import (
    NUMA_BIND_SETTINGS,
    NUMA_BIND_VAR,
    BindingPlan,
    binding_plan,
    format_ranges,
    gpu_numa_node,
    numa_nodes,
    parse_ranges,
    pci_address,
)

__all__ = [
    "DEFAULT_NET_PLUGIN",
    "INTERNAL_NETS",
    "NET_PLUGIN_PREFIX",
    "NET_PLUGIN_VERSIONS",
    "NUMA_BIND_SETTINGS",
    "NUMA_BIND_VAR",
    "OLD_NET_PLUGIN_VERSIONS",
    "SLINGSHOT_SETTINGS",
    "BindingPlan",
    "NetPlugin",
    "NetworkEnvironment",
    "SlingshotFabric",
    "binding_plan",
    "default_route_interface",
    "format_ranges",
    "gpu_numa_node",
    "infiniband_hcas",
    "net_names",
    "net_plugin",
    "network_environment",
    "numa_nodes",
    "parse_ranges",
    "pci_address",
    "slingshot_fabric",
]
