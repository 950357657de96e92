"""Turn the monitor's tracked state into the diagnosis's immutable ``JobView``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from monitor.diagnosis import HostFacts, Interface, JobView, LauncherView, OrphanView, RankView, Socket
from monitor.diagnosis.gpu_clocks import SLOWDOWN_REASONS
from monitor.diagnosis.model import CPU_LEVEL_WINDOW_S, BlockedIo
from monitor.ingest.job_track import JobTrack
from monitor.engine.nccl_views import job_nccl
from monitor.ingest.tracks import LauncherTrack, NodeTrack, RankTrack, SocketKey, is_fresh
from monitor.ingest.wire import BlockedIoReport, GpuReport, HostReport, SocketReport

T = TypeVar("T")


def rank_view(track: RankTrack) -> RankView:
    """The rank's view, kept on the track until ingest changes it (``RankTrack.revision``): a pass
    over a giant job rebuilds only the ranks that reported since the last one."""
    cached = track.view_cache
    if cached is not None and cached[0] == track.revision:
        return cached[1]
    view = _build_rank_view(track)
    track.view_cache = (track.revision, view)
    return view


def _part(track: RankTrack, name: str, key: object, build: Callable[[], T]) -> T:
    """A slow part of the view, rebuilt only when ``key`` (its source, or the source's revision)
    changes. The source itself is kept as the key, never its id(), which a new object may reuse."""
    hit = track.view_parts.get(name)
    if hit is not None and (hit[0] is key or hit[0] == key):
        return hit[1]  # type: ignore[return-value]
    value = build()
    track.view_parts[name] = (key, value)
    return value


def _build_rank_view(track: RankTrack) -> RankView:
    rr = track.latest
    gpu = [g.utilization_percent for g in rr.gpus if g.utilization_percent is not None]
    # Ingest replaces these containers when they change (never edits them in place).
    sockets_since, env, log_errors = track.sockets_since, track.env, track.log_errors
    reports = track.socket_reports  # replaced together with sockets_since
    return RankView(
        rank=track.rank,
        node=track.node,
        pid=track.pid,
        alive=track.alive,
        observed_at=track.observed_at,
        first_seen_at=track.first_seen_at,
        exit=track.exit,
        proc_state=track.proc_state,
        state_since=track.state_since,
        cpu_percent=rr.cpu_percent,
        cpu_level_percent=track.cpu.value,
        cpu_level_span_s=track.cpu.span_s or None,
        idle_since=track.idle_since,
        cpu_since=track.cpu_since,
        write_bytes_per_s=rr.write_bytes_per_s,
        moved_at=track.moved_at,
        step=rr.progress.step if rr.progress else None,
        progress_pattern=(rr.progress.pattern or None) if rr.progress else None,
        progress_times=_part(track, "progress", track.progress_revision, lambda: tuple(track.progress_times)),
        stack=track.stack,
        stack_error=rr.stack_error,
        log_phase=track.log_phase,
        log_errors=_part(track, "log_errors", log_errors, lambda: tuple(log_errors)),
        env=_part(track, "env", env, lambda: tuple(sorted(env.items()))),
        sockets=_part(track, "sockets", reports, lambda: sockets_view(sockets_since, reports)),
        error_file_message=track.error_file_message,
        compute_dtype=track.compute_dtype,
        compute_dtype_line=track.compute_dtype_line,
        gpu_utilization_percent=sum(gpu) / len(gpu) if gpu else None,
        **_part(track, "gpu_clocks", rr.gpus, lambda: gpu_clocks(rr.gpus)),
        # As of the rank's latest report (not the pass's time), so the view stays valid until it reports.
        collective_wait_share=track.wait_share(track.observed_at),
        flight_recorder=track.flight_recorder,
        held_stacks=track.held_stacks,
        held_since=held_since(track),
        step_time_s=_part(track, "step_time", track.progress_revision,
                          lambda: seconds_per_step(track.progress_points)),
        blocked_io=_part(track, "blocked_io", rr.blocked_io, lambda: blocked_io_view(rr.blocked_io)),
        progress_points=_part(track, "progress_points", track.progress_revision,
                              lambda: tuple(track.progress_points)),
        launcher=rr.launcher,
        identified_by=rr.identified_by,
        run_queue_wait_level_percent=track.run_queue_wait.value,
        cpu_throttled_level_percent=track.cpu_throttled.value,
        cgroup=track.cgroup,
    )


def gpu_clocks(gpus: Iterable[GpuReport]) -> dict[str, object]:
    """The rank's slowest GPU by its SM clock, and the slowing reasons any of its GPUs gives."""
    clocked = [g for g in gpus if g.sm_clock_mhz is not None]
    slowest = min(clocked, key=lambda g: g.sm_clock_mhz or 0, default=None)
    reasons = sorted({r for g in gpus for r in g.clock_event_reasons if r in SLOWDOWN_REASONS})
    return {
        "gpu_sm_clock_mhz": slowest.sm_clock_mhz if slowest is not None else None,
        "gpu_max_sm_clock_mhz": slowest.max_sm_clock_mhz if slowest is not None else None,
        "gpu_slowdown_reasons": tuple(reasons),
    }


def held_since(track: RankTrack) -> float | None:
    """Since when the rank has been held where its stacks show it: not before its main thread last
    used CPU (a light job's loop comes back to the same line at idle CPU; a parked thread uses none)."""
    if not track.held_stacks or track.held_since is None:
        return None
    moved = track.main_moved_at
    return track.held_since if moved is None else max(track.held_since, moved)


def blocked_io_view(report: BlockedIoReport | None) -> BlockedIo | None:
    return None if report is None else BlockedIo(report.syscall, report.path)


# Numbered steps used for the time per step, the newest first.
STEP_TIME_POINTS = 16


def seconds_per_step(points: Iterable[tuple[float, int]]) -> float | None:
    """The median time per step between consecutive sightings whose step rose: a job that logs every
    100th step still shows the time of one step (a line's interval over its steps)."""
    # The highest step per sighting: steps read in one go share a time.
    highest: dict[float, int] = {}
    for at, step in points:
        highest[at] = max(step, highest.get(at, step))
    recent = sorted(highest.items())[-STEP_TIME_POINTS:]
    rates = sorted((b_t - a_t) / (b_s - a_s) for (a_t, a_s), (b_t, b_s) in zip(recent, recent[1:]) if b_s > a_s)
    return rates[len(rates) // 2] if rates else None


def launcher_view(track: LauncherTrack) -> LauncherView:
    lr = track.latest
    return LauncherView(
        node=track.node,
        pid=track.pid,
        alive=track.alive,
        first_seen_at=track.first_seen_at,
        node_rank=lr.node_rank,
        nnodes=lr.nnodes,
        nproc_per_node=lr.nproc_per_node,
        master_addr=lr.master_addr,
        master_port=lr.master_port,
        worker_count=len(lr.worker_pids),
        stack=track.stack,
        sockets=sockets_view(track.sockets_since),
        log_errors=tuple(track.log_errors),
        exit=track.exit,
    )


def sockets_view(since: Mapping[SocketKey, float],
                 reports: Mapping[SocketKey, SocketReport] | None = None) -> tuple[Socket, ...]:
    return tuple(_socket(key, at, reports.get(key) if reports else None) for key, at in since.items())


def _socket(key: SocketKey, since: float, report: SocketReport | None) -> Socket:
    local, remote, state = key
    tcp = report.tcp if report is not None else None
    if tcp is None:
        return Socket(local, remote, state, since, send_queue_bytes=report.tx_queue if report is not None else None)
    return Socket(local, remote, state, since, rtt_ms=tcp.rtt_ms, min_rtt_ms=tcp.min_rtt_ms,
                  retrans_per_s=tcp.retrans_per_s, send_queue_bytes=report.tx_queue)


def host_facts(host: HostReport) -> HostFacts:
    interfaces = tuple(
        Interface(i.name, tuple(a.split("/", 1)[0] for a in i.addresses), i.up) for i in host.interfaces
    )
    return HostFacts(frozenset(host.cpu_flags), host.cpu_model, interfaces)


def node_facts(node: NodeTrack) -> HostFacts:
    """``host_facts`` of the node's host report, kept until the report's host part changes."""
    cached = node.facts_cache
    if cached is not None and cached[0] is node.host:
        return cached[1]
    facts = host_facts(node.host)
    node.facts_cache = (node.host, facts)
    return facts


def nodes_reporting(nodes: Mapping[str, NodeTrack], now: float) -> frozenset[str]:
    return frozenset(n.node for n in nodes.values() if is_fresh(n, now))


def silent_nodes(job: JobTrack, nodes: Mapping[str, NodeTrack], now: float) -> tuple[tuple[str, float], ...]:
    """The nodes holding live ranks (or launchers) of the job whose agents stopped reporting, with their
    last report."""
    holding = {t.node for t in job.ranks.values() if t.alive} | {t.node for t in job.launchers.values() if t.alive}
    return tuple((n, nodes[n].last_report_at) for n in sorted(holding) if n in nodes and not is_fresh(nodes[n], now))


def job_view(job: JobTrack, nodes: Mapping[str, NodeTrack], now: float,
             monitor_started_at: float | None = None, ranks: tuple[RankView, ...] | None = None,
             cpu_level_window_s: float = CPU_LEVEL_WINDOW_S) -> JobView:
    """The job as the diagnosis reads it; ``ranks``: its ranks' views already taken, in rank order."""
    if ranks is None:
        ranks = tuple(rank_view(job.ranks[r]) for r in sorted(job.ranks))
    launchers = tuple(launcher_view(job.launchers[k]) for k in sorted(job.launchers))
    job_nodes = [nodes[n] for n in sorted(job.nodes) if n in nodes]
    return JobView(
        job_id=job.job_id,
        world_size=job.world_size,
        now=now,
        first_seen_at=job.first_seen_at,
        ranks=ranks,
        job_progress_times=tuple(job.progress_times),
        job_step=job.job_step,
        known_wait_sites=frozenset(job.known_wait_sites),
        hosts={n.node: node_facts(n) for n in job_nodes},
        stacks_unavailable_reason=stacks_unavailable_reason(job_nodes),
        launchers=launchers,
        orphans=tuple(
            OrphanView(n.node, o.pid, o.cmdline, tuple(o.listening_ports)) for n in job_nodes for o in n.orphans
        ),
        nodes_reporting=nodes_reporting(nodes, now),
        phase_marks=tuple(job.phase_marks),
        nccl=job_nccl(job, job_nodes),
        silent_nodes=silent_nodes(job, nodes, now),
        replaying_nodes=tuple((n.node, n.last_report_at) for n in job_nodes if not n.live),
        monitor_started_at=monitor_started_at,
        cpu_level_window_s=cpu_level_window_s,
        working_since=job.working_since,
        longest_pause_s=job.longest_pause_s,
        pauses_by_site=tuple(job.pauses_by_site.items()),
        job_step_time_s=seconds_per_step(job.progress_points),
        pace=job.pace.view(now) if job.pace is not None else None,
    )


def stacks_unavailable_reason(nodes: list[NodeTrack]) -> str | None:
    """Why no stacks can be had, when every node of the job says so (an agent that says nothing proves nothing)."""
    reasons = [n.agent.py_spy for n in nodes]
    if not reasons or any(r is None or r == "ok" for r in reasons):
        return None
    distinct = sorted(set(r for r in reasons if r))
    return "; ".join(distinct) or None
