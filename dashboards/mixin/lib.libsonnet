// Query and template pieces shared by the alerts, the recording rules and the dashboard.
{
  new(config):: {
    local cfg = config,
    local cl = cfg.clusterLabel,

    // `by (cluster, ...)` with the cluster label first, or without it when there is none.
    by(labels):: std.join(', ', (if cl != '' then [cl] else []) + labels),

    // `{<hangwatch selector>, extra...}`
    sel(extra=[]):: '{' + std.join(', ', [m for m in [cfg.hangwatchSelector] + extra if m != '']) + '}',

    runbook(anchor):: cfg.runbookURLPattern % anchor,

    // ` in cluster X` when the alert has a cluster label.
    inCluster:: if cl != '' then '{{ with $labels.%s }} in cluster {{ . }}{{ end }}' % cl else '',

    // A `printf` for a `query` template: `{SEL}` in metricExpr becomes the selector of the series
    // with this alert's value of `label` (its cluster included), written as a Go raw string so the
    // selector's quotes need no escaping.
    labelQuery(metricExpr, label, extra=[]):: (
      local matchers = [cfg.hangwatchSelector] + (if cl != '' then ['%s=%%q' % cl] else []) + ['%s=%%q' % label] + extra;
      local args = std.join(' ', (if cl != '' then ['$labels.%s' % cl] else []) + ['$labels.%s' % label]);
      'printf `%s` %s' % [std.strReplace(metricExpr, '{SEL}', '{' + std.join(', ', matchers) + '}'), args]
    ),
    // The same for this alert's job, and for this alert's monitor (its scrape target).
    jobQuery(metricExpr, extra=[]):: self.labelQuery(metricExpr, 'job_id', extra),
    instanceQuery(metricExpr, extra=[]):: self.labelQuery(metricExpr, 'instance', extra),

    diagnoseURL:: cfg.monitorURL + '/diagnose?job={{ $labels.job_id | urlquery }}',

    // The alert's job as people know it: its id, then the name from hangwatch_job_info when the
    // monitor has one, e.g. "10.0.0.1:29500 (slurm job 4242.0 (llama))"; the id alone otherwise.
    jobName:: '{{ $labels.job_id }}{{ with %s | query }} ({{ . | first | label "display" }}){{ end }}'
              % self.jobQuery('hangwatch_job_info{SEL}', ['display!=""']),

    // The culprit ranks of the alert's job, each with its node, e.g.
    // "Culprits: rank 1 on node-a, rank 3 on node-b." (at most culpritsNamed, then the count).
    // Lowest ranks first, in numeric order: templates sort only by a label's text (sortByLabel) and
    // PromQL 2.x cannot turn a label into a value, so label_replace adds `order`, the rank behind
    // its digit count ("1"+"2" = "12" sorts before "2"+"10" = "210"). Ranks below 1,000,000; a
    // bigger one lacks `order` and comes first.
    culprits(intro, none):: (
      local orderBy(expr, digits) =
        if digits > 6 then expr
        else orderBy('label_replace(%s, "order", "%d$1", "rank", "([0-9]{%d})")' % [expr, digits, digits], digits + 1);
      local q = self.jobQuery(orderBy('max by (rank, node) (hangwatch_rank_culprit{SEL} == 1)', 1));
      local n = cfg.culpritsNamed;
      '{{ with %s | query | sortByLabel "order" }}%s {{ range $i, $c := . }}' % [q, intro]
      + '{{ if lt $i %d }}{{ if $i }}, {{ end }}rank {{ $c.Labels.rank }} on {{ $c.Labels.node }}{{ end }}' % n
      + '{{ end }}{{ if gt (len .) %d }} ({{ len . }} ranks in all){{ end }}.{{ else }}%s{{ end }}' % [n, none]
    ),

    // e.g. ` for 3m 20s` (prefix, suffix around it) from the job's last progress timestamp ('' when the series is missing).
    stalledFor(prefix, suffix=''):: (
      local q = self.jobQuery('time() - max(hangwatch_job_last_progress_timestamp_seconds{SEL})');
      '{{ with %s | query }}%s{{ . | first | value | humanizeDuration }}%s{{ end }}' % [q, prefix, suffix]
    ),

    // The verdicts (verdicts.libsonnet, from the monitor's verdict catalogue) by name: each one's
    // alert severity (warning, critical; ok has no alert) and runbook section.
    verdict:: { [v.name]: v for v in cfg.verdicts },
    // The numbers the verdict panels show, in the catalogue's order (worst last; `unknown`, the
    // monitor cannot see the job, after them), each in its severity's colour.
    verdicts:: [{ verdict: v.name, text: std.asciiUpper(v.label), color: v.colour } for v in cfg.verdicts],
  },
}
