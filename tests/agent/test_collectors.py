"""The collector registry (agent/collectors.py): registration, defaults, each run timed and contained;
the stack plan a tick shares (agent/tick.py); the agent's collector list in the report."""

from __future__ import annotations

import pytest

from agent.collectors import Health, NotDue, Registry
from agent.discovery import RankIdentity, RankProcess
from agent.report import RankSignals, rank_report
from agent.runner import Agent, Config, default_registry, enabled_collectors
from agent.tick import Tick, Tracked


class Fake:
    """A collector that records each tick it saw, then does what it was told."""

    def __init__(self, seen: list, name: str, outcome: str | BaseException | None = None):
        self.seen, self.name, self.outcome = seen, name, outcome

    def collect(self, tick: object) -> str | None:
        self.seen.append((self.name, tick))
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def registry_of(seen: list, **outcomes: str | BaseException | None) -> Registry:
    registry = Registry()
    for name, outcome in outcomes.items():
        registry.register(name, lambda _agent, name=name, outcome=outcome: Fake(seen, name, outcome))
    return registry


def test_collectors_run_in_registration_order_each_given_the_tick() -> None:
    seen: list = []
    collectors = registry_of(seen, first=None, second=None, third=None).build(agent=None)
    assert collectors.names == ["first", "second", "third"]
    health = collectors.run("the tick")
    assert seen == [("first", "the tick"), ("second", "the tick"), ("third", "the tick")]
    assert [e["name"] for e in health.report()] == ["first", "second", "third"]
    assert all(e["ok"] and e["error"] is None for e in health.report())


def test_a_name_is_registered_once() -> None:
    registry = registry_of([], procstat=None)
    with pytest.raises(ValueError, match="procstat"):
        registry.register("procstat", lambda _agent: Fake([], "procstat"))


def test_a_collector_off_by_default_is_built_only_when_turned_on() -> None:
    built: list[str] = []
    registry = Registry()
    registry.register("cheap", lambda _agent: built.append("cheap") or Fake([], "cheap"))
    registry.register("costly", lambda _agent: built.append("costly") or Fake([], "costly"), default=False)
    assert registry.defaults() == {"cheap": True, "costly": False}
    assert registry.build(agent=None).names == ["cheap"]
    assert built == ["cheap"]  # a collector turned off is never built
    assert registry.build(agent=None, enabled={"costly": True}).names == ["cheap", "costly"]
    assert registry.build(agent=None, enabled={"cheap": False}).names == []
    # A name this registry does not hold (the settings name every collector they can turn off).
    assert registry.build(agent=None, enabled={"stacks": False}).names == ["cheap"]


def test_a_failing_collector_is_a_health_entry_and_the_others_still_run() -> None:
    seen: list = []
    collectors = registry_of(
        seen, before=None, broken=RuntimeError("no /proc"), partial="pid 7: Permission denied",
        wordy=OSError("x" * 5000), after=None,
    ).build(agent=None)
    health = {e["name"]: e for e in collectors.run(tick=None).report()}
    assert [name for name, _ in seen] == ["before", "broken", "partial", "wordy", "after"]
    assert health["broken"] == {"name": "broken", "ok": False, "error": "RuntimeError: no /proc",
                                "duration_s": health["broken"]["duration_s"]}
    assert health["partial"]["ok"] is False and health["partial"]["error"] == "pid 7: Permission denied"
    assert len(health["wordy"]["error"]) == 2048  # the monitor's longest line
    assert health["before"]["ok"] and health["after"]["ok"]


def test_a_collector_not_due_leaves_no_entry() -> None:
    health = registry_of([], every_tick=None, every_5s=NotDue()).build(agent=None).run(tick=None)
    assert [e["name"] for e in health.report()] == ["every_tick"]


def test_each_run_is_timed_and_a_name_run_again_keeps_its_place() -> None:
    times = iter([10.0, 10.25, 20.0, 20.5, 30.0, 31.0])
    health = Health(clock=lambda: next(times))
    health.run("stacks", lambda: None)
    health.run("logs", lambda: "a problem")
    health.run("stacks", lambda: None)  # --once dumps every rank after the ticks
    assert [(e["name"], e["duration_s"]) for e in health.report()] == [("stacks", 1.0), ("logs", 0.5)]


def test_the_agent_reports_the_host_first_then_each_enabled_collector() -> None:
    seen: list = []
    registry = registry_of(seen, first=None, broken=ValueError("bad"), last=None)
    agent = Agent(Config(stacks=False, nccl_ras=False, flight_recorder=False, jobs=frozenset({"none"})),
                  registry=registry)
    try:
        report = agent.tick()
    finally:
        agent.close()
    names = [c["name"] for c in report["collectors"]]
    assert names[:4] == ["host", "first", "broken", "last"]
    assert set(names[4:]) <= {"gpus"}  # why there are no GPU metrics, on a node without NVML
    assert report["collectors"][2]["error"] == "ValueError: bad"
    tick = seen[0][1]
    assert isinstance(tick, Tick) and tick.tracked is agent.tracked and all(s[1] is tick for s in seen)


def test_the_default_registry_in_tick_order_and_what_the_settings_turn_off() -> None:
    registry = default_registry()
    assert list(registry.defaults()) == [
        "discovery", "procstat", "sched", "exits", "procio", "logs", "blocked_io", "sockets", "errorfiles",
        "launchers", "orphans", "gpus", "interfaces", "stacks", "nccl_ras", "flight_recorder",
    ]
    assert set(enabled_collectors(Config())) <= set(registry.defaults())


def rank(pid: int, job: str, *, low_cpu_since: float | None = None, worked: bool = False) -> Tracked:
    proc = RankProcess(pid, 1, 100, RankIdentity(job, pid, 8, pid, "torchrun"), "python train.py")
    return Tracked(proc, 0.0, 0.0, low_cpu_since=low_cpu_since, worked=worked)


def test_the_stack_plan_wants_the_stuck_the_parked_and_python_dumps_of_a_parked_ranks_peers() -> None:
    now = 100.0
    ranks = [
        rank(1, "a", low_cpu_since=90.0),  # idle from the start, no log: stuck
        rank(2, "b", low_cpu_since=90.0, worked=True),  # idle after work: parked
        rank(3, "b"),  # at work beside a parked rank
        rank(4, "c"),  # at work, nothing parked in its job
    ]
    tick = Tick(now, {t.proc.pid: t for t in ranks}, progress_of=lambda pid: None)
    assert tick.plan.stuck == {1, 2}
    assert tick.plan.dump == {1, 2, 3}
    assert tick.plan.python_only == {3}


def test_an_ended_ranks_signals_on_the_wire() -> None:
    proc = RankProcess(7, 1, 100, RankIdentity("job", 0, 2, 0, "torchrun", "env:RANK"), "python train.py",
                       {"MASTER_PORT": "29500"})
    out = rank_report(proc, RankSignals(alive=False, exit={"code": 1, "signal": None}, started_at=5.0,
                                        write_rate=3.0, log_errors=[f"e{i}" for i in range(60)]))
    assert out["state"] == "X" and out["exit"] == {"code": 1, "signal": None}
    assert out["write_bytes_per_s"] is None  # no rate for a rank that is gone
    assert out["log_errors"] == [f"e{i}" for i in range(10, 60)]
    assert out["env"] == {"MASTER_PORT": "29500"} and out["gpus"] == [] and out["sockets"] == []
