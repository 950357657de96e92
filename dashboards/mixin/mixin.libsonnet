// The hangwatch monitoring mixin: alerts, recording rules and the Grafana dashboard, from one
// configuration (config.libsonnet). scripts/build-mixin.py writes the checked-in files from it, the
// Helm chart's copies included (its PrometheusRule and dashboard ConfigMap wrap them: deploy/helm/).
(import 'config.libsonnet')
// The verdicts, written from the monitor's verdict catalogue by scripts/build-mixin.py: not a site setting.
+ { _config+:: { verdicts:: import 'verdicts.libsonnet' } }
+ (import 'alerts.libsonnet')
+ (import 'rules.libsonnet')
+ (import 'dashboard.libsonnet')
