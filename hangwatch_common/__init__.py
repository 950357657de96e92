"""What the agent, the monitor and the CLI share: the version, sd_notify, watched secret files,
command-line helpers and text made safe for a terminal. Imports nothing else of hangwatch's."""
