"""Verdicts people can page on: an alarm is published only once its evidence has lasted.

``diagnose`` judges one moment. A moment can lie: a rank pausing between two checkpoint
writes, a report that arrived a little late. ``settle`` sits between the raw verdict and
what /diagnose, the page, the metrics and the history show:

- An alarm (deadlock, stalled, straggler, slow compute, rendezvous hang) is published once
  the raw verdicts have named it for ``confirm_s`` (per verdict, see ``CONFIRM_S``) over at
  least two evaluations. Until then the published verdict stays what it was, with a summary
  that says what is being checked.
- Ended, stopped and finished ranks are facts with their own confirmation upstream (exit
  records, a stop seen twice): they are published at once; so is an alarm built on such a
  fact (``Diagnosis.final``: a launcher that exited with its error).
- Once raised, an alarm is refined at once (stalled -> deadlock as stacks arrive), turns into
  another alarm (deadlock -> straggler) only once that is confirmed as a new alarm is, falls back
  to a bare stall only after ``CLEAR_S`` of such readings, and is cleared at once when the job
  progresses again (not by lines the alarm was raised against: ``Diagnosis.progress_discounted_after``);
  a raw "healthy" without progress must last ``CLEAR_S`` first, so a single odd sample cannot silence a real alarm either.
- A raw "unknown" (an agent silent, the monitor just restarted) holds a raised alarm, unless that
  alarm was raised by reports replayed after an outage (``from_replay``): that is the outage's
  history, and until the agents' live reports arrive the present is unknown.

Pure: the caller keeps one ``Settled`` per job and passes it back in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from monitor.diagnosis.model import Diagnosis
# How long each alarm must persist in the raw verdicts before it is published (the verdict
# catalogue's confirm_s): a second, so two agent reports (1 s apart by default) agree. Every alarm
# already needs seconds of silence before its first raw reading; this guards against the one odd
# reading, not the slow step.
from monitor.diagnosis.verdict_catalogue import ALARMS as ALARMS, BY_NAME, CONFIRM_S as CONFIRM_S
# An alarm without new progress clears only after raw non-alarm verdicts for this long.
CLEAR_S = 2.0


@dataclass(frozen=True)
class Settled:
    """What is published for one job, and the raw alarm waiting to be confirmed."""

    # The verdict in force: the last raw diagnosis that was let through.
    basis: Diagnosis
    # What is shown now: ``basis``, or it with the picture of a raw reading being checked.
    shown: Diagnosis
    # The raw alarm under confirmation: its verdict, first seen at, evaluations seen.
    pending: str | None = None
    pending_since: float | None = None
    pending_count: int = 0
    # When the raw verdicts first stopped naming the raised alarm (None: they still do).
    clearing_since: float | None = None
    # When the alarm in force was raised.
    alarm_since: float | None = None
    # Judged last from reports replayed after an outage (the past), not from live ones.
    from_replay: bool = False


def _through(raw: Diagnosis, alarm_since: float | None = None) -> Settled:
    return Settled(raw, raw, alarm_since=alarm_since)


def settle(
    previous: Settled | None,
    raw: Diagnosis,
    now: float,
    last_progress_at: float | None,
    confirm_s: dict[str, float] = CONFIRM_S,
    live: bool = True,
) -> Settled:
    """What to publish now, given what was published and this evaluation's raw verdict.
    ``live``: ``raw`` judges the present (not a report replayed after an outage)."""
    settled = _settle(previous, raw, now, last_progress_at, confirm_s, live)
    # Judged from replayed reports until a live reading other than "unknown" judges the present.
    from_replay = not live or (previous is not None and previous.from_replay and raw.verdict == "unknown")
    return settled if settled.from_replay == from_replay else replace(settled, from_replay=from_replay)


def _settle(previous: Settled | None, raw: Diagnosis, now: float, last_progress_at: float | None,
            confirm_s: dict[str, float], live: bool) -> Settled:
    if live and previous is not None and previous.from_replay and raw.verdict != "unknown" and not _same_trouble(
            previous.basis.verdict, raw.verdict):
        # The first live reading after an outage, of another trouble than the replay's alarm: judged
        # afresh, the present shown as not known until it is confirmed (never the past's alarm).
        previous = _through(Diagnosis("unknown", (), None, "judging the agents' live reports after an outage"))
    held = previous.basis if previous is not None else None
    if raw.verdict == "unknown" and held is not None and held.verdict in ALARMS:
        assert previous is not None
        if previous.from_replay:
            # An alarm of the outage's past (the history has it): the present is not known yet. Kept
            # as the basis, so the live reports confirm it, or clear it, as they would a raised one.
            return replace(previous, shown=raw)
        # The monitor cannot see now (an agent silent, a restart): no news does not clear an alarm.
        shown = replace(held, summary=f"{held.summary} (cannot check now: {raw.summary})")
        return replace(previous, shown=shown)
    if raw.verdict not in ALARMS:
        if held is None or held.verdict not in ALARMS or raw.verdict != "healthy":
            return _through(raw)
        assert previous is not None
        # Progress clears an alarm at once, unless the alarm was raised against lines that kept
        # coming (diagnosis.held discounted them): those say nothing new, and CLEAR_S must pass.
        progressed = held.progress_discounted_after is None and last_progress_at is not None and (
            previous.alarm_since is not None and last_progress_at > previous.alarm_since)
        clearing_since = previous.clearing_since if previous.clearing_since is not None else now
        if progressed or now - clearing_since >= CLEAR_S:
            return _through(raw)
        shown = replace(held, summary=f"{held.summary} (checking a healthy reading without new progress)")
        return replace(previous, shown=shown, clearing_since=clearing_since)
    if raw.final:
        return _through(raw, now)
    if held is not None and held.verdict in ALARMS:
        assert previous is not None
        if raw.verdict == "stalled" and held.culprit_ranks and held.verdict != "stalled":
            # A raised alarm that names its culprits does not fall back to a bare stall at one
            # reading: that is the stacks going stale for a moment (a line read as progress, a
            # restart's refresh), not news. It must last CLEAR_S, as a clearing does.
            vague_since = previous.clearing_since if previous.clearing_since is not None else now
            if now - vague_since < CLEAR_S:
                shown = replace(held, summary=f"{held.summary} (checking a reading that names no culprit)")
                return replace(previous, shown=shown, clearing_since=vague_since)
        alarm_since = previous.alarm_since if previous.alarm_since is not None else now
        if raw.verdict in (held.verdict, "stalled") or held.verdict == "stalled":
            # The same alarm (its newest reading describes it best), or a stall seen sharper.
            return _through(raw, alarm_since)
        # Another alarm in place of a raised one is confirmed as a new alarm would be: one
        # reading from a half-refreshed picture (the first present report after a restart,
        # stacks not yet read) would otherwise swap a deadlock for a straggler and back.
        confirmed = _confirming(previous, raw, now, confirm_s)
        if isinstance(confirmed, Settled):
            return replace(confirmed, alarm_since=alarm_since)
        since, count = confirmed
        shown = replace(held, summary=f"{held.summary} (checking a reading of {_words(raw.verdict)}: {raw.summary})")
        return replace(previous, shown=shown, pending=raw.verdict, pending_since=since, pending_count=count)
    confirmed = _confirming(previous, raw, now, confirm_s)
    if isinstance(confirmed, Settled):
        return confirmed
    since, count = confirmed
    basis = held if held is not None else Diagnosis("healthy", (), None, "first look at this job")
    shown = replace(
        raw,
        verdict=basis.verdict,
        culprit_ranks=basis.culprit_ranks,
        summary=f"checking that a possible {_words(raw.verdict)} lasts before raising it: {raw.summary}",
        hints=(),
    )
    return Settled(basis, shown, pending=raw.verdict, pending_since=since, pending_count=count)


def _confirming(previous: Settled | None, raw: Diagnosis, now: float,
                confirm_s: dict[str, float]) -> Settled | tuple[float, int]:
    """``raw`` published (a Settled) once confirmed; else when its confirmation began and how
    many readings it has. A reading of the same trouble continues a confirmation: the same
    verdict, or a stall turning into a deadlock as the stacks arrive (the same trouble seen
    more sharply) and back. Another verdict starts it again: a straggler reading then a slow
    compute one (a half-refreshed picture read two ways) confirm neither."""
    pending = previous.pending if previous is not None else None
    if (pending is not None and previous is not None and previous.pending_since is not None
            and (pending == raw.verdict or "stalled" in (pending, raw.verdict))):
        since, count = previous.pending_since, previous.pending_count + 1
    else:
        since, count = now, 1
    if count >= 2 and now - since >= confirm_s.get(raw.verdict, 0.0):
        return _through(raw, now)
    return since, count


def _same_trouble(alarm: str, reading: str) -> bool:
    """A reading that goes on ``alarm``: the same verdict, or a stall seen sharper or vaguer."""
    return alarm in ALARMS and (reading in (alarm, "stalled") or alarm == "stalled")


def _words(alarm: str) -> str:
    return BY_NAME[alarm].label
