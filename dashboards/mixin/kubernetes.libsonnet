// kube-prometheus-stack objects: the rules as a PrometheusRule, the scrape as a ServiceMonitor.
{
  kubernetes+:: {
    local cfg = $._config,
    local labels = { 'app.kubernetes.io/part-of': 'hangwatch' } + cfg.prometheusOperatorLabels,

    prometheusRule: {
      apiVersion: 'monitoring.coreos.com/v1',
      kind: 'PrometheusRule',
      metadata: { name: 'hangwatch', namespace: cfg.namespace, labels: labels },
      spec: { groups: $.prometheusAlerts.groups + $.prometheusRules.groups },
    },

    serviceMonitor: {
      apiVersion: 'monitoring.coreos.com/v1',
      kind: 'ServiceMonitor',
      metadata: { name: 'hangwatch-monitor', namespace: cfg.namespace, labels: labels },
      spec: {
        selector: { matchLabels: cfg.monitorServiceLabels },
        namespaceSelector: { matchNames: [cfg.namespace] },
        endpoints: [{
          port: cfg.monitorServicePort,
          path: '/metrics',
          interval: cfg.scrapeInterval,
          scrapeTimeout: cfg.scrapeTimeout,
          // The operator names the job after the Service; the rules select the scrape job by
          // hangwatchSelector, so give it that name.
          // The cluster as a target label (clusterName): Prometheus' external_labels are not seen
          // by the rules, so "in cluster X" needs the label on the series themselves.
          relabelings: [{ targetLabel: 'job', replacement: cfg.scrapeJobName }]
                       + (if cfg.clusterName != '' && cfg.clusterLabel != ''
                          then [{ targetLabel: cfg.clusterLabel, replacement: cfg.clusterName }] else []),
          // A monitor with a metrics token (HANGWATCH_METRICS_TOKEN_FILE) wants it here, from a Secret:
          //   authorization: { type: Bearer, credentials: { name: hangwatch-monitor-tokens, key: metrics } }
        }],
      },
    },
  },
}
