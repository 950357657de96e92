"""Real training jobs on this machine for ``hangwatch demo``, the tests and the benchmarks: the job
harness (monitor, agent and jobs as real processes), the demo's cases, other launchers, simulated
nodes in network namespaces, and the workloads. The daemons never import it."""
