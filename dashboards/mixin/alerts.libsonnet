// Alert rules: one per hang verdict, the agents' health and the monitor's own.
local lib = import 'lib.libsonnet';

{
  prometheusAlerts+:: {
    local h = lib.new($._config),
    local cfg = $._config,

    // One alert per verdict the monitor publishes as hangwatch_job_verdict{verdict=...} == 1, of the
    // verdict's severity and linking to its runbook section (both from the verdict catalogue).
    local jobAlert(name, verdict, wait, summary, description) = {
      alert: name,
      expr: 'max by (%s) (hangwatch_job_verdict%s) == 1' % [h.by(['job_id']), h.sel(['verdict="%s"' % verdict])],
      'for': wait,
      labels: { severity: h.verdict[verdict].severity },
      annotations: {
        summary: summary + h.inCluster,
        description: std.join('\n', description + ['Evidence and stacks: ' + h.diagnoseURL]),
        diagnose_url: h.diagnoseURL,
        runbook_url: h.runbook(h.verdict[verdict].runbook),
      },
    },
    local job = h.jobName,

    groups+: [
      {
        name: 'hangwatch-jobs',
        rules: [
          jobAlert('HangwatchDeadlock', 'deadlock', '30s',
                   'Training job %s is deadlocked' % job, [
                     'hangwatch sees job %s parked in a collective with no progress and nothing being sent%s.'
                     % [job, h.stalledFor(' for ')],
                     h.culprits('Culprits (live, not in the collective the others wait in):', 'No culprit named yet.'),
                   ]),
          jobAlert('HangwatchRankExited', 'rank_exited', '15s',
                   'A rank of training job %s ended early' % job, [
                     h.culprits('Ended first:', 'A rank ended first.'),
                     'The peers wait or failed because of it (their "Connection closed by peer" errors are consequences).',
                   ]),
          jobAlert('HangwatchRankStopped', 'rank_stopped', '1m',
                   'A rank of training job %s is stopped' % job, [
                     h.culprits('Stopped (kernel state T: SIGSTOP, job control or a tracer):', 'Some rank is stopped (kernel state T: SIGSTOP, job control or a tracer).'),
                     'The whole job waits on it.',
                   ]),
          jobAlert('HangwatchStraggler', 'straggler', '2m',
                   'Training job %s waits on a straggler' % job, [
                     'Some ranks of job %s wait in collectives for others: still busy (computing, writing a checkpoint, evaluating) longer than the usual step, or, while the job still steps, doing more work per step than the rest (the job runs at their pace).' % job,
                     h.culprits('Still busy:', 'No straggler named yet.'),
                   ]),
          jobAlert('HangwatchRendezvousHang', 'rendezvous_hang', '2m',
                   'Training job %s is stuck in rendezvous' % job, [
                     'The ranks of job %s are stuck initialising the process group%s: a rank or node never joined, a firewall or the wrong network interface blocks gloo, or the master port is taken.'
                     % [job, '{{ with %s | query }} of {{ . | first | value }} ranks{{ end }}' % h.jobQuery('max(hangwatch_job_world_size{SEL})')],
                   ]),
          jobAlert('HangwatchSlowCompute', 'slow_compute', '5m',
                   'Training job %s computes far slower than usual' % job, [
                     'Every rank of job %s is busy and none waits on another, but steps take far longer than the usual pace%s.'
                     % [job, h.stalledFor(' (no step for ', ')')],
                     'Often a dtype the CPU has no fast kernels for (bf16 without AMX/AVX512-BF16).',
                   ]),
          jobAlert('HangwatchStalled', 'stalled', '5m',
                   'Training job %s makes no progress' % job, [
                     'Job %s has made no progress%s and no more specific diagnosis fits (often: no stacks, because the agent cannot ptrace the ranks).'
                     % [job, h.stalledFor(' for ')],
                   ]),
          jobAlert('HangwatchSlowNetwork', 'slow_network', '5m',
                   'Training job %s runs slow on its network' % job, [
                     'Job %s still steps, at a third of its own best pace or less%s, its ranks waiting in collectives: a link between its nodes queues or loses packets (the evidence names the node pair, with round trips and retransmits).'
                     % [job, '{{ with %s | query }} (1/{{ . | first | value | printf "%%.1f" }} of it){{ end }}' % h.jobQuery('max(hangwatch_job_pace_ratio{SEL})')],
                     'Nothing is hung: the job burns its time waiting on the network.',
                   ]),
          {
            // Whatever the cause: a job at half its best pace or slower, for long (the pace, not a verdict),
            // while it still steps. A job that halted (deadlock, stalled, a rank ended, unknown...) has a
            // pace ratio that grows with the silence; its own alert says what is wrong, so this one is quiet.
            alert: 'HangwatchJobSlow',
            expr: 'max by (%s) (hangwatch_job_pace_ratio%s) >= %g unless on (%s) max by (%s) (hangwatch_job_verdict%s) == 1'
                  % [h.by(['job_id']), h.sel(), cfg.slowPaceRatio, h.by(['job_id']), h.by(['job_id']),
                     h.sel(['verdict=~"%s"' % std.join('|', [v.name for v in cfg.verdicts if v.halts])])],
            'for': cfg.slowPaceFor,
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Training job %s runs at 1/{{ $value | printf "%%.1f" }} of its usual pace' % job + h.inCluster,
              description: std.join('\n', [
                'Each step of job %s takes {{ $value | printf "%%.1f" }} times as long as at its best settled pace of the last hour, for %s now.' % [job, cfg.slowPaceFor],
                'The verdict names a cause when one is visible (slow_network, straggler, slow_compute); otherwise its summary says what was checked.',
                'Evidence and stacks: ' + h.diagnoseURL,
              ]),
              diagnose_url: h.diagnoseURL,
              runbook_url: h.runbook('slow-network'),
            },
          },
          jobAlert('HangwatchJobUnknown', 'unknown', '5m',
                   'hangwatch cannot see training job %s' % job, [
                     'The agent on a node running job %s has stopped reporting, so the monitor gives no verdict from its old data.' % job,
                     'The node may be down, or only its agent: see the HangwatchAgentSilent alert for the node.',
                   ]),
        ],
      },
      {
        // Across jobs: the machines that keep breaking them (monitor/engine/incidents.py).
        name: 'hangwatch-nodes',
        rules: [
          {
            alert: 'HangwatchNodeCulpritInManyJobs',
            expr: 'max by (%s) (hangwatch_node_culprit_jobs%s) >= %d' % [h.by(['node']), h.sel(), cfg.suspectNodeJobs],
            'for': '1m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'Node {{ $labels.node }} was the culprit in {{ $value }} training jobs: a drain candidate' + h.inCluster,
              description: std.join('\n', [
                'hangwatch named a rank on node {{ $labels.node }} as the culprit of an incident (a deadlock, a straggler, a rank that ended or stopped...) in {{ $value }} distinct jobs within its suspect window (HANGWATCH_SUSPECT_WINDOW_S, 7 days by default).',
                'One bad job explains one incident; several jobs failing on the same host point at the host: a flaky NIC, a GPU falling off the bus, a slow disk. `hangwatch nodes` lists the jobs; check the host, drain it if it keeps failing.',
              ]),
              runbook_url: h.runbook('suspect-node'),
            },
          },
        ],
      },
      {
        name: 'hangwatch-agents',
        rules: [
          {
            alert: 'HangwatchAgentSilent',
            // The monitor keeps a silent node's last report time for a day: the age keeps growing.
            expr: 'time() - max by (%s) (hangwatch_agent_last_report_timestamp_seconds%s) > %d'
                  % [h.by(['node']), h.sel(), cfg.agentSilentSeconds],
            'for': '1m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'hangwatch agent on {{ $labels.node }} stopped reporting' + h.inCluster,
              description: std.join('\n', [
                'The monitor last heard from the agent on node {{ $labels.node }} {{ $value | humanizeDuration }} ago.',
                'Jobs with ranks on that node are not diagnosed until it reports again.',
                'Check `systemctl status hangwatch-agent` (or the DaemonSet pod) on that node.',
              ]),
              runbook_url: h.runbook('agent-silent'),
            },
          },
          {
            alert: 'HangwatchAgentCollectorFailing',
            expr: 'min by (%s) (hangwatch_agent_collector_up%s) == 0' % [h.by(['node', 'collector']), h.sel()],
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'hangwatch agent on {{ $labels.node }}: collector {{ $labels.collector }} failing' + h.inCluster,
              description: std.join('\n', [
                'The {{ $labels.collector }} collector of the agent on node {{ $labels.node }} has failed in every report for 5 minutes (for stacks: py-spy missing or no ptrace permission).',
                'Verdicts for that node fall back to the remaining signals.',
              ]),
              runbook_url: h.runbook('collector-failing'),
            },
          },
        ],
      },
      {
        name: 'hangwatch-monitor',
        rules: [
          {
            alert: 'HangwatchMonitorDown',
            expr: 'max by (%s) (up%s) == 0' % [h.by(['instance']), h.sel()],
            'for': '2m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'hangwatch monitor {{ $labels.instance }} is down' + h.inCluster,
              description: std.join('\n', [
                'Prometheus cannot scrape the hangwatch monitor at {{ $labels.instance }}: no training job is watched for hangs until it is back.',
                'Agents keep what changes meanwhile and deliver it when it returns.',
              ]),
              runbook_url: h.runbook('monitor-down'),
            },
          },
          {
            alert: 'HangwatchMonitorAbsent',
            expr: 'absent(up%s)' % h.sel(),
            'for': '5m',
            labels: { severity: 'critical' },
            annotations: {
              summary: 'Prometheus scrapes no hangwatch monitor ({{ $labels.job }})',
              description: std.join('\n', [
                'No target matches %s: the monitor is not deployed, or its scrape configuration (ServiceMonitor, static target) is gone.' % h.sel(),
                'No training job is watched for hangs.',
              ]),
              runbook_url: h.runbook('monitor-down'),
            },
          },
          {
            alert: 'HangwatchMonitorStorageFailing',
            expr: 'max by (%s) (hangwatch_monitor_store_up%s) == 0' % [h.by(['instance']), h.sel()],
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'hangwatch monitor {{ $labels.instance }} cannot write its database' + h.inCluster,
              description: std.join('\n', [
                'The monitor at {{ $labels.instance }} holds verdict history in memory because its database takes no writes (full or read-only disk, a lock held by another process).',
                'It keeps diagnosing; the history is written once the disk recovers, and lost if the monitor restarts first.',
              ]),
              runbook_url: h.runbook('storage-failing'),
            },
          },
          {
            alert: 'HangwatchReportsUnauthorized',
            expr: 'sum by (%s) (rate(hangwatch_monitor_requests_unauthorized_total%s[5m])) > 0'
                  % [h.by(['instance']), h.sel(['kind="ingest"'])],
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: "hangwatch monitor {{ $labels.instance }} refuses agents' tokens" + h.inCluster,
              description: std.join('\n', [
                'Reports reach the monitor at {{ $labels.instance }} without a token it accepts: agents with a missing or outdated token file, and their nodes unwatched (or someone probing the monitor).',
              ]),
              runbook_url: h.runbook('refused-requests'),
            },
          },
          // Reports refused for the monitor's own limits: the jobs in them go unwatched, and only
          // these alerts say so. A lone refusal (one junk report) leaves the 2-minute window before
          // the 5-minute `for:` is out and never fires; agents retry every few seconds, so a real one lasts.
          {
            alert: 'HangwatchReportsRefusedAtCapacity',
            expr: 'sum by (%s) (increase(hangwatch_reports_rejected_total%s[2m])) > 0'
                  % [h.by(['instance', 'reason']), h.sel(['reason=~"too_many_jobs|too_many_nodes|too_many_ranks|node_jobs"'])],
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: "hangwatch monitor {{ $labels.instance }} is full: agents' reports refused ({{ $labels.reason }})" + h.inCluster,
              description: std.join('\n', [
                'The monitor at {{ $labels.instance }} has refused agents\' reports with HTTP 429 for 5 minutes ({{ $value | humanize }} in the last 2 minutes): '
                + '{{ if eq $labels.reason "node_jobs" }}a node reports more jobs than HANGWATCH_MAX_JOBS_PER_NODE allows'
                + '{{ else if eq $labels.reason "too_many_jobs" }}it already follows %s, the most HANGWATCH_MAX_JOBS allows'
                  % ('{{ with %s | query }}{{ . | first | value }} {{ end }}jobs' % h.instanceQuery('count(hangwatch_job_world_size{SEL})'))
                + '{{ else if eq $labels.reason "too_many_ranks" }}it already follows %s, the most HANGWATCH_MAX_RANKS allows'
                  % ('{{ with %s | query }}{{ . | first | value }} {{ end }}ranks' % h.instanceQuery('sum(hangwatch_monitor_ranks{SEL})'))
                + '{{ else }}it already follows %s, the most HANGWATCH_MAX_NODES allows{{ end }}.'
                  % ('{{ with %s | query }}{{ . | first | value }} {{ end }}nodes'
                     % h.instanceQuery('count(hangwatch_agent_last_report_timestamp_seconds{SEL})')),
                'The jobs in those reports are not watched: a hang in them pages nobody.',
                'Raise the limit or shard the jobs over more monitors (docs/scaling.md); ended jobs leave after HANGWATCH_JOB_RETENTION_S.',
              ]),
              runbook_url: h.runbook('reports-refused'),
            },
          },
          {
            alert: 'HangwatchReportsRefusedWorldSize',
            expr: 'sum by (%s) (increase(hangwatch_reports_rejected_total%s[2m])) > 0'
                  % [h.by(['instance', 'reason']), h.sel(['reason="world_size"'])],
            'for': '5m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'hangwatch monitor {{ $labels.instance }} refuses reports of ranks past its world size limit' + h.inCluster,
              description: std.join('\n', [
                "The monitor at {{ $labels.instance }} has refused reports with HTTP 422 for 5 minutes ({{ $value | humanize }} in the last 2 minutes): their ranks claim a world size above HANGWATCH_MAX_WORLD_SIZE.",
                'A real job that large is not watched: raise HANGWATCH_MAX_WORLD_SIZE on this monitor. No real job that large: a broken or hostile sender; find it by its address (--log-level debug).',
              ]),
              runbook_url: h.runbook('reports-refused'),
            },
          },
          {
            // The share of reports shed, so that a busy monitor's brief burst (agents coming back
            // together after a restart) stays quiet and a monitor past its capacity does not.
            local shed = 'sum by (%s) (rate(hangwatch_monitor_reports_shed_total%s[5m]))' % [h.by(['instance']), h.sel()],
            local accepted = 'sum by (%s) (rate(hangwatch_reports_total%s[5m]))' % [h.by(['instance']), h.sel()],
            alert: 'HangwatchReportsShed',
            expr: '%s\n/ (%s + %s)\n> %g' % [shed, shed, accepted, cfg.reportsShedShare],
            'for': '10m',
            labels: { severity: 'warning' },
            annotations: {
              summary: 'hangwatch monitor {{ $labels.instance }} sheds reports: past its capacity' + h.inCluster,
              description: std.join('\n', [
                "The monitor at {{ $labels.instance }} refused {{ $value | humanizePercentage }} of agents' reports with HTTP 503 over the last 5 minutes, for 10 minutes now: its event loop runs late, it has more ranks than it can diagnose.",
                'Every node still gets a report in every few seconds, so verdicts come late rather than never; more load leaves jobs unwatched.',
                'Shard the jobs over more monitors (docs/scaling.md) or give this one a faster core.',
              ]),
              runbook_url: h.runbook('reports-shed'),
            },
          },
        ],
      },
    ],
  },
}
