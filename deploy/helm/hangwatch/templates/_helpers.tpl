{{/* Names: <release>-<component> ("hangwatch-monitor"), or fullnameOverride-<component>. */}}
{{- define "hangwatch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hangwatch.name" -}}
{{- printf "%s-%s" (include "hangwatch.fullname" .root) .component -}}
{{- end -}}

{{/* Selector labels of a component: dict "root" $ "component" "monitor". */}}
{{- define "hangwatch.selectorLabels" -}}
app.kubernetes.io/name: hangwatch-{{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "hangwatch.labels" -}}
{{ include "hangwatch.selectorLabels" . }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: hangwatch
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{- end -}}

{{- define "hangwatch.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* What scripts/render-deploy.py writes from the settings' declarations: each daemon's defaults,
     the settings the chart sets itself, and the budgets the state volume holds. */}}
{{- define "hangwatch.declared" -}}
{{- .Files.Get "files/declared-settings.json" -}}
{{- end -}}

{{- define "hangwatch.monitorScheme" -}}
{{- if .Values.monitor.tls.secretName }}https{{ else }}http{{ end -}}
{{- end -}}

{{/* The monitor as the agents, the relays and Prometheus reach it: its Service. */}}
{{- define "hangwatch.monitorServiceURL" -}}
{{- printf "%s://%s.%s.svc:%v" (include "hangwatch.monitorScheme" .) (include "hangwatch.name" (dict "root" . "component" "monitor")) .Release.Namespace .Values.monitor.port -}}
{{- end -}}

{{/* The monitor as people reach it: the alerts' and the dashboard's links. */}}
{{- define "hangwatch.monitorURL" -}}
{{- .Values.monitorURL | default (include "hangwatch.monitorServiceURL" .) | trimSuffix "/" -}}
{{- end -}}

{{/* The runbook the alerts link to: runbookURL, else the monitor's own page (GET /runbook). */}}
{{- define "hangwatch.runbookURL" -}}
{{- .Values.runbookURL | default (printf "%s/runbook" (include "hangwatch.monitorURL" .)) | trimSuffix "/" -}}
{{- end -}}

{{/* Where the agents post: the relays' Service when there are relays, else the monitor's. */}}
{{- define "hangwatch.ingestURL" -}}
{{- if .Values.relay.enabled -}}
{{- printf "http://%s.%s.svc:%v" (include "hangwatch.name" (dict "root" . "component" "relay")) .Release.Namespace .Values.relay.port -}}
{{- else -}}
{{- include "hangwatch.monitorServiceURL" . -}}
{{- end -}}
{{- end -}}

{{- define "hangwatch.tokenSecret" -}}
{{- .Values.tokens.existingSecret | default (printf "%s-tokens" (include "hangwatch.fullname" .)) -}}
{{- end -}}

{{/* The mixin's files (scripts/build-mixin.py) with the release's addresses in place of its markers. */}}
{{- define "hangwatch.mixinFile" -}}
{{- .root.Files.Get .path | replace "__HANGWATCH_MONITOR_URL__" (include "hangwatch.monitorURL" .root) | replace "__HANGWATCH_RUNBOOK_URL__" (include "hangwatch.runbookURL" .root) | trim -}}
{{- end -}}

{{/* A daemon's settings as the TOML its --config reads: dict "root" $ "daemon" "monitor" "chosen" MAP.
     What the chart sets itself (flags, which win over the file) may not be set in the map; the
     values are written as JSON literals, which TOML reads the same for numbers, strings, true,
     false and arrays of them (the only kinds values.schema.json lets through). */}}
{{- define "hangwatch.settingsToml" -}}
{{- $declared := index (include "hangwatch.declared" .root | fromJson) .daemon -}}
{{- $daemon := .daemon -}}
{{- range $key, $setBy := $declared.setByChart -}}
{{- if hasKey $.chosen $key -}}
{{- fail (printf "%s.config.%s is set by the chart (%s): leave it out of %s.config" $daemon $key $setBy $daemon) -}}
{{- end -}}
{{- end -}}
# hangwatch-{{ .daemon }}'s settings: the chart's values ({{ .daemon }}.config). Those the chart
# sets itself are flags, which win over this file (values.yaml says which).
[{{ .daemon }}]
{{- range $key, $value := .chosen }}
{{- if not (kindIs "invalid" $value) }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The state volume's size: the budgets of what the monitor keeps there plus room for the database. */}}
{{- define "hangwatch.stateSize" -}}
{{- if .Values.monitor.persistence.size -}}
{{- .Values.monitor.persistence.size -}}
{{- else -}}
{{- $declared := (include "hangwatch.declared" . | fromJson).monitor -}}
{{- $chosen := .Values.monitor.config | default dict -}}
{{- $bytes := float64 .Values.monitor.persistence.databaseHeadroomBytes -}}
{{- range $name := $declared.stateBudgets -}}
{{- $bytes = addf $bytes (hasKey $chosen $name | ternary (get $chosen $name) (get $declared.defaults $name)) -}}
{{- end -}}
{{- printf "%dGi" (int64 (ceil (divf $bytes 1073741824))) -}}
{{- end -}}
{{- end -}}

{{/* The pod-level part shared by the monitor and the relays: a fixed non-root user whose fsGroup
     lets it read the Secret's files, which the init container copies owner-only (the daemons
     refuse a token file that group or others can read, and fsGroup makes every Secret file so). */}}
{{- define "hangwatch.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "hangwatch.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{- define "hangwatch.tokenCopier" -}}
- name: tokens
  image: {{ include "hangwatch.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  # Owner-only copies (0400, this pod's user) of the Secret's files, which fsGroup made 0440.
  command: ["sh", "-c", "umask 077 && cp -L /etc/hangwatch/secret/* /etc/hangwatch/tokens/"]
  securityContext:
    {{- include "hangwatch.containerSecurityContext" . | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {cpu: 100m, memory: 64Mi}
  volumeMounts:
    - name: token-secret
      mountPath: /etc/hangwatch/secret
      readOnly: true
    - name: tokens
      mountPath: /etc/hangwatch/tokens
{{- end -}}

{{/* The Secret's keys a pod needs, as volumes: the Secret and the in-memory copies. */}}
{{- define "hangwatch.tokenVolumes" -}}
- name: token-secret
  secret:
    secretName: {{ include "hangwatch.tokenSecret" .root }}
    defaultMode: 0400   # fsGroup adds group read: hence the copies in "tokens"
    items:
      {{- range .keys }}
      - {key: {{ . }}, path: {{ . }}}
      {{- end }}
- name: tokens
  emptyDir:
    medium: Memory      # the tokens never reach the node's disk
    sizeLimit: 1Mi
{{- end -}}

{{- define "hangwatch.podScheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The keys of the tokens' Secret the release uses (a JSON list): agents (the monitor's list) and
     agent (the one token every agent presents, one of that list) with tokens.enabled; read and
     metrics when asked for; relay (the relays' token) with relays and tokens. */}}
{{- define "hangwatch.tokenKeys" -}}
{{- $keys := list -}}
{{- if .Values.tokens.enabled -}}{{- $keys = concat $keys (list "agents" "agent") -}}{{- end -}}
{{- if .Values.tokens.read -}}{{- $keys = append $keys "read" -}}{{- end -}}
{{- if .Values.tokens.metrics -}}{{- $keys = append $keys "metrics" -}}{{- end -}}
{{- if and .Values.relay.enabled .Values.tokens.enabled -}}{{- $keys = append $keys "relay" -}}{{- end -}}
{{- toJson $keys -}}
{{- end -}}
