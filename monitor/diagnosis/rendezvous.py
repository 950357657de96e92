"""Rules for jobs that never formed their process group: a rank or node missing, the
network between nodes blocked, gloo on the wrong interface, or a launch that failed."""

from __future__ import annotations

from dataclasses import replace

from hangwatch_common.name_lists import nodes_text, numbers_text
from monitor.diagnosis.context import Context, cpu_text, ranks_text, where
from monitor.diagnosis.errors import hints_for_errors
from monitor.diagnosis.model import Diagnosis, LauncherView, RankView, Socket
from monitor.diagnosis.stacks import top_python_frame

# Rendezvous normally takes a second or two; longer than this is a hang.
RENDEZVOUS_GRACE_S = 10.0
# Every node the job expects has its launcher up and none is seen in rendezvous code: the launchers
# are starting their workers, slowly on a loaded machine (each imports torch first). A hang only
# past this long. A launcher whose stack is in rendezvous code keeps the short grace.
STARTING_GRACE_S = 60.0
# A SYN that got no answer for this long is being dropped, not just slow.
SYN_STUCK_S = 3.0
_VIRTUAL_NIC_PREFIXES = ("docker", "br-", "virbr", "veth", "tailscale", "zt", "cni", "flannel", "dummy", "vboxnet")

FIREWALL_HINT = (
    "Gloo connects between every pair of ranks in both directions on ephemeral ports, not only "
    "to MASTER_PORT: open {node}'s firewall to {source} (e.g. `iptables -I INPUT -s {source} -j "
    "ACCEPT`), or set GLOO_PORT_RANGE on every node and open just that range."
)
IFNAME_HINT = (
    "Set GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME for NCCL) on every node to the NIC that joins the "
    "nodes (the one holding the address MASTER_ADDR is reached through; see `ip -br addr`)."
)


def _is_loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"


def _parse_nodes(nnodes: str | None) -> int | None:
    if not nnodes:
        return None
    head = nnodes.split(":", 1)[0]
    return int(head) if head.isdecimal() else None


def _stuck_syns(sockets: tuple[Socket, ...], now: float) -> list[Socket]:
    return [s for s in sockets if s.state == "SYN_SENT" and (s.since is None or now - s.since >= SYN_STUCK_S)]


def _network_findings(ctx: Context, ranks: list[RankView], launchers: list[LauncherView]):
    """Evidence, hints and culprit ranks from stuck connections and interface settings."""
    evidence: list[str] = []
    hints: list[str] = []
    culprits: set[int] = set()
    owners = [(f"rank {r.rank}", r.node, r.sockets) for r in ranks]
    owners += [(f"launcher pid {lv.pid}", lv.node, lv.sockets) for lv in launchers]
    for who, node, sockets in owners:
        for sock in _stuck_syns(sockets, ctx.now):
            source = sock.local.rsplit(":", 1)[0].strip("[]")
            dest_node = ctx.node_of_address(sock.remote_host)
            age = f" for {ctx.now - sock.since:.0f}s" if sock.since is not None else ""
            line = f"{who} on {node} ({source}) cannot connect to {sock.remote}: SYN-SENT{age}"
            if dest_node is not None and dest_node != node:
                line += f"; {sock.remote_host} is {dest_node}, which does not answer"
                culprits.update(a.rank.rank for a in ctx.live() if a.rank.node == dest_node)
                hint = FIREWALL_HINT.format(node=dest_node, source=source)
            elif _is_loopback(sock.remote_host) or dest_node is None:
                line += f"; no node owns {sock.remote_host}: a peer advertised an address others cannot reach"
                hint = IFNAME_HINT
            else:
                hint = IFNAME_HINT
            evidence.append(line)
            if hint not in hints:
                hints.append(hint)
    evidence_if, hints_if, culprits_if = interface_findings(ctx, ranks)
    return evidence + evidence_if, hints + [h for h in hints_if if h not in hints], culprits | culprits_if


def interface_findings(ctx: Context, ranks: list[RankView]):
    evidence: list[str] = []
    culprits: set[int] = set()
    hints: list[str] = []
    multi_node = len({r.node for r in ranks}) > 1 or len(ctx.job.launchers) > 1
    for r in ranks:
        facts = ctx.job.hosts.get(r.node)
        if facts is None or not facts.interfaces:
            continue
        ifname = r.env_value("GLOO_SOCKET_IFNAME")
        by_name = {i.name: i for i in facts.interfaces}
        if ifname:
            chosen = by_name.get(ifname)
            if chosen is None:
                evidence.append(f"rank {r.rank} on {r.node}: GLOO_SOCKET_IFNAME={ifname}, an interface {r.node} does not have")
                culprits.add(r.rank)
            elif multi_node and (all(_is_loopback(a) for a in chosen.addresses) or not chosen.addresses):
                evidence.append(f"rank {r.rank} on {r.node}: GLOO_SOCKET_IFNAME={ifname} is loopback-only: "
                                "peers on other nodes cannot reach it")
                culprits.add(r.rank)
            elif multi_node and ifname.startswith(_VIRTUAL_NIC_PREFIXES):
                evidence.append(f"rank {r.rank} on {r.node}: GLOO_SOCKET_IFNAME={ifname} is a virtual interface "
                                f"({', '.join(chosen.addresses)})")
                culprits.add(r.rank)
        elif multi_node:
            nics = [i.name for i in facts.interfaces if i.up and any(not _is_loopback(a) for a in i.addresses)]
            if len(nics) > 1:
                evidence.append(f"{r.node} has {len(nics)} interfaces ({', '.join(nics)}) and rank {r.rank} does not "
                                "set GLOO_SOCKET_IFNAME: gloo may pick the wrong one")
    if evidence:
        hints.append(IFNAME_HINT)
    return evidence, hints, culprits


def _orphan_evidence(ctx: Context, ports: set[int]) -> list[str]:
    lines = []
    for o in ctx.job.orphans:
        held = sorted(ports & set(o.listening_ports))
        if held:
            lines.append(f"pid {o.pid} on {o.node} holds port {', '.join(map(str, held))} and has no parent "
                         f"(PPID 1, left over from an earlier run): {o.cmdline[:200]}")
        else:
            lines.append(f"left-over process pid {o.pid} on {o.node} (PPID 1): {o.cmdline[:200]}")
    return lines


def _master_ports(ctx: Context) -> set[int]:
    ports = {lv.master_port for lv in ctx.job.launchers if lv.master_port}
    for a in ctx.activities.values():
        port = a.rank.env_value("MASTER_PORT")
        if port and port.isdecimal():
            ports.add(int(port))
    if ":" in ctx.job.job_id and ctx.job.job_id.rsplit(":", 1)[1].isdecimal():
        ports.add(int(ctx.job.job_id.rsplit(":", 1)[1]))
    return ports


def rendezvous(ctx: Context) -> Diagnosis | None:
    """Ranks stuck initialising the process group."""
    waiting = [
        a for a in ctx.live()
        if a.kind == "rendezvous" and ctx.now - a.rank.first_seen_at >= RENDEZVOUS_GRACE_S
    ]
    if not waiting:
        return None
    missing = ctx.missing_ranks()
    present = sorted(ctx.activities)
    evidence = [f"{len(present)} of world size {ctx.job.world_size} ranks seen: {ranks_text(present)}"]
    evidence += [
        f"rank {a.rank.rank} on {a.rank.node} in {where(a)} for {ctx.now - a.rank.first_seen_at:.0f}s, {cpu_text(a)}"
        for a in waiting
    ]
    net_evidence, net_hints, net_culprits = _network_findings(
        ctx, [a.rank for a in ctx.live()], list(ctx.job.launchers)
    )
    evidence += net_evidence + _orphan_evidence(ctx, _master_ports(ctx))
    if missing:
        summary = (f"process group never formed: world size {ctx.job.world_size} not reached, "
                   f"waiting for {ranks_text(missing)}")
        culprits = missing
    elif net_culprits:
        nodes = sorted({a.rank.node for a in ctx.live() if a.rank.rank in net_culprits})
        summary = (f"process group never formed: every rank is present but connections to "
                   f"{nodes_text(nodes) or ranks_text(net_culprits)} do not get through")
        culprits = sorted(net_culprits)
    else:
        summary = "process group never formed: every rank is present but initialisation does not complete"
        culprits = []
    hints = net_hints + [
        "Check that every node started its launcher with the same --nnodes/--nproc-per-node, "
        "MASTER_ADDR and MASTER_PORT, and that every node can reach MASTER_ADDR:MASTER_PORT.",
    ]
    if not net_hints:
        hints.append(FIREWALL_HINT.format(node="each node", source="the other nodes"))
    since = min(a.rank.first_seen_at for a in waiting)
    return ctx.diagnosis("rendezvous_hang", culprits, since, summary, evidence, hints)


def _in_rendezvous(launcher: LauncherView) -> bool:
    """The launcher's stack is in torch's rendezvous code (waiting for peers or for the store)."""
    if launcher.stack is None:
        return False
    return any("rendezvous" in f.name.lower() or "rendezvous" in f.file.lower() for f in launcher.stack.frames)


def launcher_waiting(ctx: Context) -> Diagnosis | None:
    """torchrun up on some nodes, no workers yet: the nodes' rendezvous is not complete."""
    if ctx.activities:
        return None  # workers ran: this is not the first rendezvous
    launchers = [lv for lv in ctx.job.launchers if lv.alive]
    expected = max((n for n in (_parse_nodes(lv.nnodes) for lv in launchers) if n), default=None)
    all_joined = expected is not None and len({lv.node_rank for lv in launchers}) >= expected
    grace = STARTING_GRACE_S if all_joined and not any(_in_rendezvous(lv) for lv in launchers) else RENDEZVOUS_GRACE_S
    stuck = [lv for lv in launchers if lv.worker_count == 0 and ctx.now - lv.first_seen_at >= grace]
    if not stuck or len(stuck) != len(launchers):
        return None
    seen = sorted({lv.node_rank for lv in launchers if lv.node_rank is not None})
    evidence = []
    for lv in stuck:
        top = top_python_frame(lv.stack)
        evidence.append(
            f"torchrun pid {lv.pid} on {lv.node} (node rank {lv.node_rank}) has started no workers for "
            f"{ctx.now - lv.first_seen_at:.0f}s" + (f", in {top.where()}" if top else "")
        )
    # Node ranks are only known when every launcher states one (static rendezvous).
    known = all(lv.node_rank is not None for lv in launchers)
    missing_nodes = [k for k in range(expected or 0) if k not in seen] if known else []
    culprits: list[int] = []
    nproc = next((int(lv.nproc_per_node) for lv in launchers if (lv.nproc_per_node or "").isdecimal()), None)
    if missing_nodes and nproc:
        culprits = [k * nproc + i for k in missing_nodes for i in range(nproc)]
    idle_nodes = sorted(ctx.job.nodes_reporting - {lv.node for lv in launchers})
    if idle_nodes:
        evidence.append(f"agents on {nodes_text(idle_nodes)} report no launcher of this job")
    net_evidence, net_hints, _ = _network_findings(ctx, [], launchers)
    evidence += net_evidence + _orphan_evidence(ctx, _master_ports(ctx))
    if missing_nodes:
        summary = (f"rendezvous incomplete: {len(seen)} of {expected} nodes joined; node rank(s) "
                   f"{numbers_text(missing_nodes)} never did")
    elif expected and len(launchers) < expected:
        summary = f"rendezvous incomplete: {len(launchers)} of {expected} nodes joined"
    else:
        summary = "rendezvous incomplete: launchers wait and no workers start"
    hints = net_hints + [
        "Start torchrun on the missing node(s) with the same --nnodes, --master-addr and --master-port "
        "(and a distinct --node-rank), and check they can reach MASTER_ADDR:MASTER_PORT.",
    ]
    since = min(lv.first_seen_at for lv in stuck)
    return ctx.diagnosis("rendezvous_hang", culprits, since, summary, evidence, hints)


def launch_failed(ctx: Context) -> Diagnosis | None:
    """A launcher ended with an error before any rank appeared (port in use, bad arguments)."""
    if ctx.activities:
        return None
    failed = [lv for lv in ctx.job.launchers if not lv.alive and (lv.log_errors or (lv.exit and lv.exit.failed))]
    if not failed:
        return None
    errors = [e for lv in failed for e in lv.log_errors[-3:]]
    evidence = [f"torchrun pid {lv.pid} on {lv.node} ended before starting workers"
                + (f": {lv.log_errors[-1]}" if lv.log_errors else "") for lv in failed]
    evidence += _orphan_evidence(ctx, _master_ports(ctx))
    hints = hints_for_errors(errors) or ["Read the launcher's output on that node: it failed before any worker started."]
    since = min((lv.exit.at for lv in failed if lv.exit), default=None)
    summary = "launch failed before the process group formed"
    if errors:
        summary += f": {errors[-1][:160]}"
    # The launcher has exited: the failure is done, not a reading that may pass.
    return replace(ctx.diagnosis("rendezvous_hang", (), since, summary, evidence, hints), final=True)
