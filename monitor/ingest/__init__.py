"""Reports in: the wire format, its limits and order, and the live per-node, per-job and per-rank records they build."""
