"""Host facilities: prerequisites, cgroups, network namespaces, shared memory, the accelerator."""
