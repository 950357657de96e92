"""The engine's settings, declared beside the passes that use them (hangwatch_common/settings.py makes
each one's flag, variable and ``--help`` entry); the monitor's ``Settings`` (monitor/web/settings.py)
inherits them, as these inherit the limits on what it takes in (monitor/ingest/limits.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from hangwatch_common.settings import setting
from monitor.diagnosis.model import CPU_LEVEL_WINDOW_S
from monitor.ingest.limits import Limits
from monitor.ingest.silent_budget import MAX_SILENT_BYTES

# Suspect nodes (monitor/engine/incidents.py) are counted over this window by default.
SUSPECT_WINDOW_S = 7 * 86400.0
# Shorter than this, a rank's CPU level is a handful of readings (monitor/diagnosis/slow_rank.py).
MIN_STRAGGLER_WINDOW_S = 6.0


@dataclass(frozen=True)
class EngineSettings(Limits):
    # A restart replays the newest snapshots of each node.
    snapshot_interval_s: float = setting(60.0, help="seconds between stored full reports (snapshots) of a node, and "
                                         "between those asked of delta agents", positive=True)
    # Counted by monitor/engine/incidents.py; at most the verdict retention.
    suspect_window_s: float = setting(SUSPECT_WINDOW_S, help="seconds over which a node's incidents make it a suspect, "
                                      "for /metrics and the drain-candidate alert", positive=True)
    # Past this, reads cost the same at any scale.
    fresh_read_ranks: int = setting(512, help="a read (/diagnose, /metrics) diagnoses again the jobs that changed "
                                    "since the last pass while they hold at most this many ranks in all; past that it "
                                    "answers from the background pass (at most one tick old)", at_least=0)
    job_retention_s: float = setting(600.0, help="seconds a job whose ranks all ended, or that no agent mentions any "
                                     "more, stays shown", positive=True)
    tick_interval_s: float = setting(1.0, help="seconds between background diagnosis passes, which record verdict "
                                     "changes; 0: none (tests drive them by hand)", at_least=0)
    # Longer is steadier, shorter names it sooner (monitor/diagnosis/slow_rank.py).
    straggler_window_s: float = setting(CPU_LEVEL_WINDOW_S, help="seconds of CPU readings that name the rank setting "
                                        f"a stepping job's pace (at least {MIN_STRAGGLER_WINDOW_S:g})")
    # monitor/diagnosis/stability.py
    confirm_alarms: bool = setting(True, help="publish an alarm only once its raw verdicts have lasted; off: every "
                                   "single reading is published (for tests of one reading, not for paging)")
    # monitor/ingest/silent_budget.py: junk sent once under new node names cannot hold the memory for the job retention.
    max_silent_bytes: int = setting(MAX_SILENT_BYTES, help="what jobs and nodes no agent mentioned for the "
                                    "job-room-silent time keep (their reports, estimated), all together: past it the "
                                    "densest is forgotten first", at_least=1024)
