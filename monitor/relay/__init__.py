"""The relay: the first level of ingest for one giant job (docs/scaling.md, "Relays").

A monitor owns a job whole, so one job's reports all land on one process; at 10,000 ranks that is
1,250 HTTP posts a second, and serving them is most of the monitor's work (the posts, not the
job's size). A relay stands between a share of the nodes and the monitor: it takes their posts,
checks and decodes each report as the monitor would (token, node binding, size, schema), and
forwards what it accepted as one batch every ``flush_s`` over one connection. Each agent waits
for its own report's answer from the monitor (accepted, refused, orders, send-full), so agents
cannot tell a relay from the monitor, and nothing is taken that the monitor would not take.
"""
