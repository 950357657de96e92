"""hangwatch node agent: finds the training ranks on this node, samples them, reports to the monitor."""
