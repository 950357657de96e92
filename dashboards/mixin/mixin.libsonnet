// The hangwatch monitoring mixin: alerts, recording rules, the Grafana dashboard and the
// kube-prometheus-stack objects, from one configuration (config.libsonnet).
// scripts/build-mixin.py writes the checked-in files from it.
(import 'config.libsonnet')
// The verdicts, written from the monitor's verdict catalogue by scripts/build-mixin.py: not a site setting.
+ { _config+:: { verdicts:: import 'verdicts.libsonnet' } }
+ (import 'alerts.libsonnet')
+ (import 'rules.libsonnet')
+ (import 'dashboard.libsonnet')
+ (import 'kubernetes.libsonnet')
