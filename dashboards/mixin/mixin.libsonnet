// The hangwatch monitoring mixin: alerts, recording rules, the Grafana dashboard and the
// kube-prometheus-stack objects, from one configuration (config.libsonnet).
// scripts/build-mixin.py writes the checked-in files from it.
(import 'config.libsonnet')
+ (import 'alerts.libsonnet')
+ (import 'rules.libsonnet')
+ (import 'dashboard.libsonnet')
+ (import 'kubernetes.libsonnet')
