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
    // runbook_url of each alert; %s is the alert's section in docs/runbook.md. By default the copy
    // that the monitor below serves itself (GET /runbook, open without a token). The Helm chart puts
    // its runbookURL value before the '#', or else its own monitor's /runbook.
    runbookURLPattern: self.monitorURL + '/runbook#%s',
    // The monitor as people reach it (not as Prometheus does): alerts link to its /diagnose?job=.
    // The default is the in-cluster Service that deploy/kubernetes/ and the Helm chart (release
    // `hangwatch` in namespace `hangwatch`) create; the chart puts its own release's address (or
    // its monitorURL value) into the rules it installs. Elsewhere, build with your address:
    //   scripts/build-mixin.py --config site.jsonnet   (site.jsonnet: { monitorURL: 'https://...' })
    monitorURL: 'http://hangwatch-monitor.hangwatch.svc:8787',
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
  },
}
