// Everything a site changes. Override in your own jsonnet:
//   (import 'dashboards/mixin/mixin.libsonnet') + { _config+:: { clusterLabel: 'k8s_cluster' } }
// or pass a file of overrides to scripts/build-mixin.py --config.
{
  _config+:: {
    // Label matchers for the monitor's scrape job: in every query of the rules and the dashboard.
    hangwatchSelector: 'job="hangwatch"',
    // The label that tells clusters apart (kept in every `by (...)` and shown in the alerts);
    // '' for a single cluster without one. It must be on the scraped series (a target label), not
    // only in Prometheus' external_labels, which rule evaluation never sees.
    clusterLabel: 'cluster',
    // This cluster's name: when set, the ServiceMonitor puts it in clusterLabel on every series it
    // scrapes ('' leaves the label to the Prometheus or to no one).
    clusterName: '',
    // runbook_url of each alert; %s is the alert's section in docs/runbook.md.
    runbookURLPattern: 'https://github.com/hangwatch/hangwatch/blob/main/docs/runbook.md#%s',
    // The monitor as people reach it (not as Prometheus does): alerts link to its /diagnose?job=.
    monitorURL: 'http://hangwatch-monitor.example.internal:8787',
    // An agent that has not reported for this long is silent (it reports every second).
    agentSilentSeconds: 30,
    // HangwatchReportsShed: the share of agents' reports a monitor may refuse with 503 (shedding
    // past capacity) over 5 minutes before it warns; it fires when that lasts 10 minutes.
    reportsShedShare: 0.05,
    // HangwatchNodeCulpritInManyJobs: a node named as a culprit in incidents of this many distinct
    // jobs within the monitor's suspect window (HANGWATCH_SUSPECT_WINDOW_S, 7 days) is a drain candidate.
    suspectNodeJobs: 3,
    // HangwatchJobSlow: a job whose time per step is this many times its best settled pace of the
    // last hour (hangwatch_job_pace_ratio), for this long, whatever the cause.
    slowPaceRatio: 2,
    slowPaceFor: '30m',
    // Culprits named in one alert at most; the rest are counted.
    culpritsNamed: 10,

    grafanaDashboardUID: 'hangwatch',
    grafanaDashboardTitle: 'hangwatch',
    grafanaRefresh: '10s',

    // kube-prometheus-stack: where the PrometheusRule and ServiceMonitor live, the labels its
    // Prometheus selects them by (the Helm release name by default), and how the monitor's
    // Service is found.
    namespace: 'hangwatch',
    prometheusOperatorLabels: { release: 'kube-prometheus-stack' },
    monitorServiceLabels: { 'app.kubernetes.io/name': 'hangwatch-monitor' },
    monitorServicePort: 'http',
    // The `job` label the ServiceMonitor gives the monitor's series: what hangwatchSelector matches.
    scrapeJobName: 'hangwatch',
    scrapeInterval: '5s',
    scrapeTimeout: '4s',
  },
}
