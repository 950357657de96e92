"""Opt-in actions on verdicts: config (the rules file), policy (when, pure), execute (commands,
webhooks), orders (signals the agents send), engine (the whole inside the monitor)."""
