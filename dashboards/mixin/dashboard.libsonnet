// The Grafana dashboard: jobs (verdicts, progress), ranks, agents and the monitor itself.
local lib = import 'lib.libsonnet';

local datasource = { type: 'prometheus', uid: '${datasource}' };

local target(expr, legend='', refId='A') = {
  datasource: datasource, refId: refId, expr: expr, legendFormat: legend, format: 'time_series', range: true,
};
local instant(expr, refId) = {
  datasource: datasource, refId: refId, expr: expr, legendFormat: '', format: 'table', instant: true, range: false,
};

// Value mappings as Grafana keeps them: one entry per value, coloured.
local mappings(entries) = [
  { type: 'value', options: { [std.toString(i)]: entries[i] { index: i } } }
  for i in std.range(0, std.length(entries) - 1)
];

local row(title, y) = {
  type: 'row', title: title, collapsed: false, gridPos: { x: 0, y: y, w: 24, h: 1 }, panels: [],
};
local panel(kind, title, description, targets, pos) = {
  type: kind, title: title, description: description, datasource: datasource, gridPos: pos, targets: targets,
};
local timeseries(title, description, unit, targets, pos) = panel('timeseries', title, description, targets, pos) {
  fieldConfig: {
    defaults: { unit: unit, custom: { drawStyle: 'line', lineWidth: 1, fillOpacity: 0, showPoints: 'never' } },
    overrides: [],
  },
};
local stateTimeline(title, description, entries, targets, pos, rowHeight=0.9) =
  panel('state-timeline', title, description, targets, pos) {
    fieldConfig: {
      defaults: {
        mappings: mappings(entries),
        color: { mode: 'thresholds' },
        thresholds: { mode: 'absolute', steps: [{ color: 'green', value: null }] },
      },
      overrides: [],
    },
    options: { showValue: 'never', mergeValues: true, rowHeight: rowHeight, legend: { showLegend: false } },
  };
local at(x, y, w, h) = { x: x, y: y, w: w, h: h };

{
  grafanaDashboards+:: {
    local cfg = $._config,
    local h = lib.new(cfg),
    local cl = cfg.clusterLabel,
    // Matchers of the dashboard's variables, for raw series (with the scrape job's) and recorded ones.
    local vars(extra) = std.join(', ', (if cl != '' then ['%s=~"$cluster"' % cl] else []) + extra),
    local raw(extra=[]) = h.sel([vars(extra)]),
    local recorded(extra=[]) = '{' + vars(extra) + '}',
    local jobs = ['job_id=~"$job"'],
    local verdictEntries = [{ text: v.text, color: v.color } for v in h.verdicts],
    local verdictCode = 'max by (job_id) (job_id:hangwatch_job_verdict:code%s)' % recorded(jobs),
    local okEntries(bad, good) = [{ text: bad, color: 'red' }, { text: good, color: 'green' }],
    // Every per-rank series carries job_id, rank and node: each rank's line says where it runs.
    local rankLegend = '{{job_id}} rank {{rank}} ({{node}})',

    local panels = [
      row('Jobs', 0),
      panel('table', 'Jobs overview',
            'Current verdict per job, the name people know it by, its culprit count, time without progress and world size. Details: '
            + cfg.monitorURL + '/diagnose?job=JOB_ID',
            [
              instant(verdictCode, 'A'),
              instant('max by (job_id) (hangwatch_job_culprit_ranks%s)' % raw(jobs), 'B'),
              instant('min by (job_id) (job_id:hangwatch_seconds_since_progress:min%s)' % recorded(jobs), 'C'),
              instant('max by (job_id) (hangwatch_job_world_size%s)' % raw(jobs), 'D'),
              // The name people know the job by (Slurm job, pod, torchelastic run), empty when unknown.
              instant('max by (job_id, display) (hangwatch_job_info%s)' % raw(jobs), 'E'),
            ], at(0, 1, 24, 7)) {
        transformations: [
          { id: 'merge', options: {} },
          { id: 'organize', options: {
            excludeByName: { Time: true, 'Value #E': true },
            indexByName: { job_id: 0, display: 1, 'Value #A': 2, 'Value #B': 3, 'Value #C': 4, 'Value #D': 5 },
            renameByName: { job_id: 'job', display: 'name', 'Value #A': 'verdict', 'Value #B': 'culprit ranks',
                            'Value #C': 'since progress', 'Value #D': 'world size' },
          } },
        ],
        fieldConfig: {
          defaults: { custom: { align: 'auto' } },
          overrides: [
            { matcher: { id: 'byName', options: 'verdict' }, properties: [
              { id: 'mappings', value: mappings(verdictEntries) },
              { id: 'custom.cellOptions', value: { type: 'color-background' } },
            ] },
            { matcher: { id: 'byName', options: 'since progress' }, properties: [{ id: 'unit', value: 's' }] },
          ],
        },
        options: { showHeader: true },
      },
      stateTimeline('Verdict timeline', "The monitor's verdict for each job over time.", verdictEntries,
                    [target(verdictCode, '{{job_id}}')], at(0, 8, 24, 7), 0.8),
      timeseries('Time since progress', 'Time since each job last made progress (since first seen if it never did).', 's',
                 [target('min by (job_id) (job_id:hangwatch_seconds_since_progress:min%s)' % recorded(jobs), '{{job_id}}')],
                 at(0, 15, 12, 8)),
      timeseries('Time since progress per rank', 'Time since each rank (or its job) last progressed.', 's',
                 [target('min by (job_id, rank) (job_id_rank:hangwatch_seconds_since_progress:min%s)' % recorded(jobs),
                         '{{job_id}} rank {{rank}}')],
                 at(12, 15, 12, 8)),

      row('Ranks', 23),
      timeseries('CPU per rank',
                 'Cores used by each rank process (1 = one core). A rank parked in a gloo collective sits near 0; NCCL ranks may spin at 1 while hung.',
                 'none',
                 [target('sum by (job_id, rank, node) (rate(hangwatch_rank_cpu_seconds_total%s[$__rate_interval]))' % raw(jobs),
                         rankLegend)],
                 at(0, 24, 12, 8)),
      timeseries('Step per rank', "Last training step each rank's log showed: a flat line is a stall.", 'none',
                 [target('max by (job_id, rank, node) (hangwatch_rank_step%s)' % raw(jobs), rankLegend)],
                 at(12, 24, 12, 8)),
      timeseries('Steps per second', 'Training progress rate per rank.', 'none',
                 [target('max by (job_id, rank, node) (deriv(hangwatch_rank_step%s[1m]))' % raw(jobs), rankLegend)],
                 at(0, 32, 12, 8)),
      timeseries('Time waiting in collectives', "Share of each rank's recent stack samples waiting in a collective (0-1).",
                 'percentunit',
                 [target('max by (job_id, rank, node) (hangwatch_rank_collective_wait_ratio%s)' % raw(jobs), rankLegend)],
                 at(12, 32, 12, 8)),
      stateTimeline('Rank alive', '1 while the rank process is alive.', okEntries('ended', 'alive'),
                    [target('max by (job_id, rank, node) (hangwatch_rank_alive%s)' % raw(jobs), rankLegend)],
                    at(0, 40, 12, 6)),
      timeseries('Ranks by state',
                 "How many of each job's ranks are in each state: the view of a job too big for per-rank panels (past 1,024 ranks they show its culprits only).",
                 'none',
                 [target('max by (job_id, state) (hangwatch_job_ranks%s) > 0' % raw(jobs), '{{job_id}} {{state}}')],
                 at(12, 40, 12, 6)),

      row('Agents', 46),
      timeseries('Time since agent report',
                 'Time since each node\'s agent last reported (it reports every second; HangwatchAgentSilent fires above %d s). A silent node stays listed for a day.' % cfg.agentSilentSeconds,
                 's',
                 [target('min by (node) (node:hangwatch_agent_seconds_since_report:min%s)' % recorded(), '{{node}}')],
                 at(0, 47, 8, 8)),
      stateTimeline('Agent collectors',
                    'Whether each collector of each agent worked in its last report (stacks: py-spy and ptrace).',
                    okEntries('failing', 'ok'),
                    [target('min by (node, collector) (hangwatch_agent_collector_up%s)' % raw(), '{{node}} {{collector}}')],
                    at(8, 47, 8, 8)),
      timeseries('Reports per second',
                 'Agent reports the monitor accepted, refused (hangwatch_reports_rejected_total{reason}: HangwatchReportsRefusedAtCapacity and HangwatchReportsRefusedWorldSize fire on its limits) and shed past its capacity (HangwatchReportsShed).',
                 'reqps', [
        target('sum(rate(hangwatch_reports_total%s[$__rate_interval]))' % raw(), 'accepted', 'A'),
        target('sum(rate(hangwatch_reports_rejected_total%s[$__rate_interval])) or vector(0)' % raw(), 'refused', 'B'),
        target('sum(rate(hangwatch_monitor_reports_shed_total%s[$__rate_interval]))' % raw(), 'shed', 'C'),
      ], at(16, 47, 8, 8)),

      row('Cost of hangs', 55),
      // Instant over the dashboard's range: counters reset with the monitor and go with their
      // jobs, so increase() over the range adds them up right; `or vector(0)`: a CPU-only cluster has no GPU time.
      panel('bargauge', 'Rank-hours and GPU-hours lost to hangs, by verdict',
            'Time jobs spent under each alarm verdict over the selected range, times their live ranks (rank-hours) and their ranks with GPUs (GPU-hours, one GPU a rank): what hangs cost. `hangwatch nodes` names the hosts behind them.',
            [
              { datasource: datasource, refId: 'A', instant: true, range: false, format: 'time_series',
                expr: 'sum by (verdict) (increase(hangwatch_job_lost_rank_seconds_total%s[$__range])) / 3600' % raw(jobs),
                legendFormat: 'rank-hours, {{verdict}}' },
              { datasource: datasource, refId: 'B', instant: true, range: false, format: 'time_series',
                expr: 'sum by (verdict) (increase(hangwatch_job_lost_gpu_seconds_total%s[$__range])) / 3600 or vector(0)' % raw(jobs),
                legendFormat: 'GPU-hours, {{verdict}}' },
            ], at(0, 56, 12, 7)) { fieldConfig: { defaults: { unit: 'h', decimals: 2 } }, options: { orientation: 'horizontal' } },
      panel('bargauge', 'GPU-hours lost to hangs, by culprit node',
            'GPU time lost to incidents over the selected range, put on the nodes their culprit ranks ran on (split among them; "unattributed": no culprit named). A host high here in many jobs is a drain candidate (HangwatchNodeCulpritInManyJobs).',
            [
              { datasource: datasource, refId: 'A', instant: true, range: false, format: 'time_series',
                expr: 'sum by (node) (increase(hangwatch_node_lost_gpu_seconds_total%s[$__range])) / 3600 or vector(0)' % raw(),
                legendFormat: '{{node}}' },
            ], at(12, 56, 12, 7)) { fieldConfig: { defaults: { unit: 'h', decimals: 2 } }, options: { orientation: 'horizontal' } },

      row('Monitor', 63),
      stateTimeline('Monitor up', 'Whether Prometheus reaches the monitor (HangwatchMonitorDown fires after 2 minutes down).',
                    okEntries('down', 'up'),
                    [target('max by (instance) (up%s)' % raw(), '{{instance}}')], at(0, 64, 8, 6)),
      timeseries('Monitor CPU', "The monitor process's CPU use (1 = one core).", 'none',
                 [target('sum by (instance) (rate(process_cpu_seconds_total%s[$__rate_interval]))' % raw(), '{{instance}}')],
                 at(8, 64, 8, 6)),
      timeseries('Monitor memory', "The monitor process's resident memory.", 'bytes',
                 [target('max by (instance) (process_resident_memory_bytes%s)' % raw(), '{{instance}}')],
                 at(16, 64, 8, 6)),
    ],

    hangwatch: {
      title: cfg.grafanaDashboardTitle,
      uid: cfg.grafanaDashboardUID,
      description: 'Hangs of distributed PyTorch jobs, as diagnosed by the hangwatch monitor',
      tags: ['hangwatch', 'pytorch', 'training'],
      timezone: 'browser',
      editable: true,
      graphTooltip: 1,
      schemaVersion: 39,
      version: 1,
      refresh: cfg.grafanaRefresh,
      time: { from: 'now-1h', to: 'now' },
      links: [{ title: 'hangwatch monitor', type: 'link', url: cfg.monitorURL + '/', targetBlank: true, icon: 'external link' }],
      annotations: { list: [{
        builtIn: 1, datasource: { type: 'grafana', uid: '-- Grafana --' }, enable: true, hide: true,
        iconColor: 'rgba(0, 211, 255, 1)', name: 'Annotations & Alerts', type: 'dashboard',
      }] },
      templating: { list: [
        { name: 'datasource', label: 'Prometheus', type: 'datasource', query: 'prometheus', current: {}, hide: 0,
          refresh: 1, regex: '', options: [] },
      ] + (if cl != '' then [
        { name: 'cluster', label: 'Cluster', type: 'query', datasource: datasource,
          definition: 'label_values(up%s, %s)' % [h.sel(), cl],
          query: { query: 'label_values(up%s, %s)' % [h.sel(), cl], refId: 'PrometheusVariableQueryEditor-VariableQuery' },
          refresh: 2, multi: false, includeAll: true, allValue: '.*', current: {}, hide: 0, sort: 1, regex: '', options: [] },
      ] else []) + [
        { name: 'job', label: 'Job', type: 'query', datasource: datasource,
          definition: 'label_values(hangwatch_job_verdict%s, job_id)' % raw(),
          query: { query: 'label_values(hangwatch_job_verdict%s, job_id)' % raw(),
                   refId: 'PrometheusVariableQueryEditor-VariableQuery' },
          refresh: 2, multi: true, includeAll: true, allValue: '.*', current: {}, hide: 0, sort: 1, regex: '', options: [] },
      ] },
      panels: [panels[i] { id: i + 1 } for i in std.range(0, std.length(panels) - 1)],
    },
  },
}
