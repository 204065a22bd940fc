{{/*
The namespace of every namespaced object: values.namespace, else the release namespace, except
helm's "default" (no -n given), which means kube-system (values.yaml says why).
*/}}
{{- define "tether.namespace" -}}
{{- if .Values.namespace -}}
{{- .Values.namespace -}}
{{- else if eq .Release.Namespace "default" -}}
kube-system
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The image: [registry/]repository, then @digest or :tag (the appVersion by default). */}}
{{- define "tether.image" -}}
{{- $i := .Values.image -}}
{{- $name := $i.repository -}}
{{- if $i.registry -}}{{- $name = printf "%s/%s" (trimSuffix "/" $i.registry) $name -}}{{- end -}}
{{- if $i.digest -}}
{{- printf "%s@%s" $name $i.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (toString ($i.tag | default .Chart.AppVersion)) -}}
{{- end -}}
{{- end -}}

{{/* The pods' scrape annotations (values metrics.scrapeAnnotations). */}}
{{- define "tether.scrapeAnnotations" -}}
{{- if .Values.metrics.scrapeAnnotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
{{- end -}}
{{- end -}}

{{/*
A file of deploy/monitoring (the chart's copy) as an object, in the chart's namespace with the
given extra labels. Args: list of the root context, the file's path, the labels.
*/}}
{{- define "tether.monitoringObject" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $obj := $root.Files.Get $path | fromYaml -}}
{{- if or (not $obj) (hasKey $obj "Error") -}}
{{- fail (printf "%s: missing or not YAML (%v)" $path (get $obj "Error")) -}}
{{- end -}}
{{- $_ := set $obj.metadata "namespace" (include "tether.namespace" $root) -}}
{{- $_ := set $obj.metadata "labels" (merge (dict) $obj.metadata.labels (index . 2)) -}}
{{- toYaml $obj -}}
{{- end -}}
