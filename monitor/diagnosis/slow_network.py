"""Communication slowness: a job that still steps, at a fraction of its own pace, its ranks waiting in
collectives (C4D's fourth class, beside deadlock, stall and straggler).

A degraded cable or switch port does not stop a job: every step takes longer, every rank waits in
its all_reduce while the bytes crawl. Two readings name it:

- the pace (``JobView.pace``): a third of the job's own best settled pace or less, while most ranks'
  latest stacks wait in a collective and no rank works or is starved more than the others (those are
  stragglers, judged before this rule);
- between two slow steps, ranks parked in a collective whose bytes still move ("sending"): the same
  trouble seen before the step ends (diagnosis.stall hands it here).

The evidence names what is slow from the ranks' own sockets (the kernel's tcp_info, agent/tcp_info.py):
a connection whose round-trip time stands far above the lowest of its last minutes is queueing on the
way, and retransmits are loss. Connections are grouped by the pair of nodes they join.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from monitor.diagnosis.activity import Activity
from monitor.diagnosis.context import Context
from monitor.diagnosis.model import Diagnosis, PaceView
from monitor.diagnosis.stacks import wait_point

# Most live ranks must wait in a collective: this share of their latest stacks (taken since the job
# turned slow), or of their sampled stacks over the last minutes.
WAITING_SHARE = 0.5
# A connection queues when its smoothed RTT is this many times its lowest and this much above it.
QUEUEING_FACTOR = 4.0
QUEUEING_MIN_MS = 2.0
# Retransmitting: at least this many segments a second.
RETRANS_PER_S = 0.5
# A send queue worth naming beside the RTT.
SEND_QUEUE_BYTES = 256 * 1024
# A healthy job this much slower than its best says so (pace ratio and what was checked).
PACE_NOTE_RATIO = 1.5
LINKS_SHOWN = 4


@dataclass(frozen=True)
class LinkHealth:
    """The connections between two nodes (the same node twice: over loopback), as their sockets show."""

    nodes: tuple[str, str]
    connections: int
    rtt_ms: float | None  # the highest smoothed RTT among them
    min_rtt_ms: float | None  # the lowest RTT any of them saw in the kernel's window
    retrans_per_s: float
    send_queue_bytes: int

    @property
    def queueing(self) -> bool:
        if self.rtt_ms is None or self.min_rtt_ms is None:
            return False
        return self.rtt_ms >= QUEUEING_FACTOR * self.min_rtt_ms and self.rtt_ms - self.min_rtt_ms >= QUEUEING_MIN_MS

    @property
    def slow(self) -> bool:
        return self.queueing or self.retrans_per_s >= RETRANS_PER_S

    @property
    def badness(self) -> tuple[float, float]:
        inflation = (self.rtt_ms or 0.0) / max(self.min_rtt_ms or 0.0, 0.001)
        return (self.retrans_per_s, inflation) if not self.queueing else (inflation, self.retrans_per_s)

    def where(self) -> str:
        a, b = self.nodes
        return f"{a} (loopback)" if a == b else f"{a} <-> {b}"

    def text(self) -> str:
        parts = []
        if self.rtt_ms is not None:
            low = f" against {self.min_rtt_ms:.2f} ms at its lowest" if self.min_rtt_ms is not None else ""
            parts.append(f"round trip {self.rtt_ms:.1f} ms{low}")
        parts.append(f"{self.retrans_per_s:.1f} retransmits/s")
        if self.send_queue_bytes >= SEND_QUEUE_BYTES:
            parts.append(f"{self.send_queue_bytes / 1e6:.1f} MB waiting to be sent")
        count = f"{self.connections} connection{'s' if self.connections != 1 else ''}"
        return f"{self.where()} ({count}): {', '.join(parts)}"


def links(ctx: Context) -> list[LinkHealth]:
    """The live ranks' established connections whose tcp_info was read, grouped by node pair."""
    grouped: dict[tuple[str, str], list] = {}
    for a in ctx.live():
        for s in a.rank.sockets:
            if s.state != "ESTABLISHED" or (s.rtt_ms is None and s.retrans_per_s is None):
                continue
            peer = ctx.node_of_address(s.remote_host) or s.remote_host
            pair = (min(a.rank.node, peer), max(a.rank.node, peer))
            grouped.setdefault(pair, []).append(s)
    out = []
    for pair, sockets in grouped.items():
        rtts = [s.rtt_ms for s in sockets if s.rtt_ms is not None]
        lows = [s.min_rtt_ms for s in sockets if s.min_rtt_ms is not None]
        out.append(LinkHealth(
            nodes=pair,
            connections=len(sockets),
            rtt_ms=max(rtts) if rtts else None,
            min_rtt_ms=min(lows) if lows else None,
            retrans_per_s=sum(s.retrans_per_s or 0.0 for s in sockets),
            send_queue_bytes=max((s.send_queue_bytes or 0 for s in sockets), default=0),
        ))
    return out


def slow_links(ctx: Context) -> list[LinkHealth]:
    """The links that queue or lose packets, worst first; links between nodes before loopback."""
    return sorted((link for link in links(ctx) if link.slow),
                  key=lambda link: (link.nodes[0] != link.nodes[1], link.badness), reverse=True)


def pace_text(pace: PaceView) -> str:
    return (f"progress every {pace.now_s:.2f}s against {pace.baseline_s:.2f}s at its best: "
            f"1/{pace.ratio:.1f} of its pace")


def waiting_in_collectives(ctx: Context, since: float | None) -> bool:
    """Most live ranks wait in a collective: by their latest stack taken since ``since``, or by the share
    of their sampled stacks that did."""
    live = ctx.live()
    if not live:
        return False
    fresh = [a for a in live if a.rank.stack is not None and (since is None or a.rank.stack.taken_at >= since)]
    parked = [a for a in fresh if wait_point(a.rank.stack, a.rank.cpu_percent) is not None]
    if len(parked) >= WAITING_SHARE * len(live):
        return True
    shares = [a.rank.collective_wait_share for a in live if a.rank.collective_wait_share is not None]
    return bool(shares) and sum(shares) / len(shares) >= WAITING_SHARE and len(shares) >= WAITING_SHARE * len(live)


def slow_network(ctx: Context) -> Diagnosis | None:
    """``slow_network`` for a job that steps at a third of its own best pace or less while its ranks wait
    in collectives; None otherwise. Stragglers (one rank working or starved more) are judged before."""
    pace = ctx.job.pace
    if pace is None or pace.slow_since is None:
        return None
    if any(at >= pace.slow_since - pace.now_s for at, _ in ctx.job.phase_marks):
        return None  # an evaluation or a checkpoint inside the slow stretch: its own pace
    if not waiting_in_collectives(ctx, pace.slow_since - pace.now_s):
        return None
    return _diagnosis(ctx, pace.slow_since, [pace_text(pace)])


def slow_communication(ctx: Context, since: float | None, evidence: list[str]) -> Diagnosis:
    """Ranks parked in a collective whose bytes still move, past the job's usual step time: the network
    carries the step slowly (not a deadlock, not a stall)."""
    pace = ctx.job.pace
    lines = [pace_text(pace)] if pace is not None else []
    return _diagnosis(ctx, since, lines + evidence, sending=True)


def _diagnosis(ctx: Context, since: float | None, evidence: list[str], sending: bool = False) -> Diagnosis:
    found = slow_links(ctx)
    seen = links(ctx)
    where = _where(found)
    doing = ("ranks wait in collectives while their bytes still move" if sending
             else "its ranks wait in collectives")
    pace = ctx.job.pace
    head = f"the job runs at 1/{pace.ratio:.1f} of its pace" if pace is not None and pace.ratio > 1 else (
        "steps take far longer than usual")
    summary = f"{head}; {doing}: " + (f"the link {where} is slow" if where else "slow communication")
    lines = list(evidence)
    lines += [f"slow link {link.text()}" for link in found[:LINKS_SHOWN]]
    healthy = [link for link in seen if not link.slow and link.nodes[0] != link.nodes[1]]
    lines += [f"link {link.text()}: no queueing or loss" for link in healthy[:2]]
    if not seen:
        lines.append("no socket of the job's ranks gave tcp_info (an agent without it, or traffic that is "
                     "not TCP: NCCL over InfiniBand or RoCE; see its RAS and the port counters)")
    elif not found:
        lines.append("the ranks' TCP connections show no queueing or loss: the slowness is past them "
                     "(a busy peer, a congested fabric whose drops do not reach these sockets)")
    lines += _waits(ctx.live())
    hints = [
        f"Check the link{'s' if len(found) > 1 else ''} named above: the NICs' error and drop counters "
        "(`ip -s link`, `ethtool -S`), the switch port, a negotiated speed (`ethtool IFACE`), and "
        "`ss -ti` on the ranks' connections.",
        "If the job should use a faster network, point it there (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, "
        "NCCL_IB_HCA).",
        "The job still steps: nothing is hung, it burns its time waiting on the network.",
    ]
    return ctx.diagnosis("slow_network", (), since, summary, lines, hints)


def _where(found: list[LinkHealth]) -> str:
    """The node pair, or the one node every slow link between nodes touches."""
    between = [link for link in found if link.nodes[0] != link.nodes[1]]
    if not between:
        return found[0].where() if found else ""
    if len(between) == 1:
        return between[0].where()
    common = set(between[0].nodes).intersection(*(set(link.nodes) for link in between[1:]))
    if len(common) == 1:
        return f"of {next(iter(common))} (to {len(between)} peers)"
    return ", ".join(link.where() for link in between[:LINKS_SHOWN])


def _waits(live: Iterable[Activity]) -> list[str]:
    shares = [a.rank.collective_wait_share for a in live if a.rank.collective_wait_share is not None]
    if not shares:
        return []
    return [f"ranks wait in collectives in {sum(shares) / len(shares):.0%} of their stack samples"]


def slower_than_usual(ctx: Context) -> str | None:
    """For a healthy job well below its best pace: by how much, and what was checked."""
    pace = ctx.job.pace
    if pace is None or pace.ratio < PACE_NOTE_RATIO:
        return None
    waiting = ("most ranks wait in collectives (slow_network from a third of the pace)"
               if waiting_in_collectives(ctx, None) else "the ranks are not mostly waiting in collectives")
    return (f"slower than usual ({pace_text(pace)}); no rank stands out by CPU, run-queue wait or "
            f"throttling; {waiting}")

