package deploytest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

// The chart is rendered the way Helm renders it (one template set, sprig's
// functions plus include, tpl, required, fail, toYaml; missing keys read as
// empty; files named _* are partials), without linking Helm and its
// Kubernetes client: the test needs the templates' output, not a cluster.

type chartMeta struct {
	APIVersion string `json:"apiVersion"`
	Name       string `json:"name"`
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

// manifest is one rendered document.
type manifest struct {
	source     string
	apiVersion string
	kind       string
	name       string
	raw        []byte
}

func chartDir() string { return filepath.Join(repoRoot(), "deploy", "helm", "better-compute") }

func readChart(t *testing.T) (chartMeta, map[string]any) {
	t.Helper()
	var meta chartMeta
	readYAML(t, filepath.Join(chartDir(), "Chart.yaml"), &meta)
	var values map[string]any
	readYAML(t, filepath.Join(chartDir(), "values.yaml"), &values)
	return meta, values
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// merge lays override over base, map by map, as `helm --set` and -f do.
func merge(base, override map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range override {
		if o, ok := v.(map[string]any); ok {
			if b, ok := out[k].(map[string]any); ok {
				out[k] = merge(b, o)
				continue
			}
		}
		out[k] = v
	}
	return out
}

func render(meta chartMeta, values map[string]any) ([]manifest, error) {
	root := template.New("chart").Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = func(v any) string {
		b, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(b), "\n")
	}
	funcs["include"] = func(name string, data any) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data any) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		if t, err = t.New("tpl").Parse(text); err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return buf.String(), err
	}
	funcs["required"] = func(msg string, v any) (any, error) {
		if v == nil || v == "" {
			return nil, errors.New(msg)
		}
		return v, nil
	}
	funcs["fail"] = func(msg string) (string, error) { return "", errors.New(msg) }
	root.Funcs(funcs)

	files, err := filepath.Glob(filepath.Join(chartDir(), "templates", "*"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if _, err := root.New(filepath.Base(f)).Parse(string(b)); err != nil {
			return nil, err
		}
	}
	data := map[string]any{
		"Values":       values,
		"Chart":        map[string]any{"Name": meta.Name, "Version": meta.Version, "AppVersion": meta.AppVersion},
		"Release":      map[string]any{"Name": "prod", "Namespace": "compute", "Service": "Helm", "IsInstall": true, "IsUpgrade": false, "Revision": 1},
		"Capabilities": map[string]any{"KubeVersion": map[string]any{"Version": "v1.33.0", "Major": "1", "Minor": "33"}},
	}
	var out []manifest
	for _, f := range files {
		name := filepath.Base(f)
		if strings.HasPrefix(name, "_") || !strings.HasSuffix(name, ".yaml") {
			continue
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return nil, err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", name, err, doc)
			}
			if strings.TrimSpace(yamlWithoutComments(doc)) == "" {
				continue
			}
			out = append(out, manifest{source: name, apiVersion: head.APIVersion, kind: head.Kind, name: head.Metadata.Name, raw: []byte(doc)})
		}
	}
	return out, nil
}

func yamlWithoutComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// chartScenarios are the values the chart is rendered with.
var chartScenarios = []struct {
	name     string
	override map[string]any
	// want is every kind/name the render holds.
	want []string
}{
	{
		name: "defaults",
		want: []string{"Deployment/prod-better-compute-api", "Deployment/prod-better-compute-worker",
			"Service/prod-better-compute-api", "Job/prod-better-compute-migrate", "ServiceAccount/prod-better-compute"},
	},
	{
		name: "everything",
		override: map[string]any{
			"temporal": map[string]any{"tls": map[string]any{"existingSecret": "temporal-client", "serverName": "temporal.example.com"}},
			"api": map[string]any{
				"nodeCA":        map[string]any{"existingSecret": "node-ca"},
				"agentListener": map[string]any{"enabled": true, "endpoint": "https://agents.example.com:8443"},
			},
			"iamHost": map[string]any{
				"enabled":         true,
				"replicaDatabase": map[string]any{"existingSecret": "better-compute-replica"},
				"refreshSecret":   map[string]any{"existingSecret": "iam-refresh"},
			},
		},
		want: []string{"Deployment/prod-better-compute-api", "Deployment/prod-better-compute-worker",
			"Deployment/prod-better-compute-iam-host", "Service/prod-better-compute-iam-host",
			"Service/prod-better-compute-agents", "NetworkPolicy/prod-better-compute-iam-host",
			"Service/prod-better-compute-api", "Job/prod-better-compute-migrate", "ServiceAccount/prod-better-compute"},
	},
	{
		name:     "without migrate",
		override: map[string]any{"migrate": map[string]any{"enabled": false}},
		want: []string{"Deployment/prod-better-compute-api", "Deployment/prod-better-compute-worker",
			"Service/prod-better-compute-api", "ServiceAccount/prod-better-compute"},
	},
}

// apiVersions are the kinds the chart may render and their API groups.
var apiVersions = map[string]string{
	"Deployment": "apps/v1", "Job": "batch/v1", "Service": "v1", "ServiceAccount": "v1",
	"NetworkPolicy": "networking.k8s.io/v1",
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

func TestHelmChart(t *testing.T) {
	meta, values := readChart(t)
	if meta.APIVersion != "v2" || meta.Name != "better-compute" || meta.Version == "" || meta.AppVersion == "" {
		t.Fatalf("Chart.yaml: %+v", meta)
	}
	commands := map[string]command{}
	commandOf := func(t *testing.T, args []string) command {
		key := strings.Join(args, " ")
		if c, ok := commands[key]; ok {
			return c
		}
		c := checkArgv(t, "better-compute", args)
		commands[key] = c
		return c
	}
	for _, sc := range chartScenarios {
		t.Run(sc.name, func(t *testing.T) {
			docs, err := render(meta, merge(values, sc.override))
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			var have []string
			podLabels := map[string]map[string]string{} // Deployment → its pods' labels
			ports := map[string][]string{}              // Deployment → its containers' port names
			var services []corev1.Service
			for _, d := range docs {
				have = append(have, d.kind+"/"+d.name)
				if want, ok := apiVersions[d.kind]; !ok || d.apiVersion != want {
					t.Errorf("%s: %s %s has apiVersion %q, want %q", d.source, d.kind, d.name, d.apiVersion, want)
				}
				// A line of blanks is an empty include left under its key.
				if blank := regexp.MustCompile(`(?m)^[ \t]+$`); blank.Match(d.raw) {
					t.Errorf("%s: %s %s has a line of blanks (an empty list?)", d.source, d.kind, d.name)
				}
				if !dnsLabel.MatchString(d.name) {
					t.Errorf("%s: %s %q is not a DNS label", d.source, d.kind, d.name)
				}
				var pod *corev1.PodTemplateSpec
				switch d.kind {
				case "Deployment":
					var o appsv1.Deployment
					strict(t, d, &o)
					pod = &o.Spec.Template
					if o.Spec.Replicas == nil || *o.Spec.Replicas < 1 {
						t.Errorf("%s: no replicas", d.name)
					}
					for k, v := range o.Spec.Selector.MatchLabels {
						if pod.Labels[k] != v {
							t.Errorf("%s: the selector %s=%s misses its pods", d.name, k, v)
						}
					}
					podLabels[d.name] = pod.Labels
					for _, c := range pod.Spec.Containers {
						for _, p := range c.Ports {
							ports[d.name] = append(ports[d.name], p.Name)
						}
					}
				case "Job":
					var o batchv1.Job
					strict(t, d, &o)
					pod = &o.Spec.Template
					if hook := o.Annotations["helm.sh/hook"]; !strings.Contains(hook, "pre-install") || !strings.Contains(hook, "pre-upgrade") {
						t.Errorf("%s: the migrate Job is not a pre-install, pre-upgrade hook: %q", d.name, hook)
					}
				case "Service":
					var o corev1.Service
					strict(t, d, &o)
					services = append(services, o)
				case "ServiceAccount":
					strict(t, d, &corev1.ServiceAccount{})
				case "NetworkPolicy":
					strict(t, d, &networkingv1.NetworkPolicy{})
				default:
					t.Errorf("%s: unexpected kind %q", d.source, d.kind)
				}
				if pod != nil {
					checkPod(t, d, pod, meta, values, commandOf)
				}
			}
			want := slices.Clone(sc.want)
			slices.Sort(have)
			slices.Sort(want)
			if !slices.Equal(have, want) {
				t.Errorf("the render has %v, want %v", have, want)
			}
			// Every Service selects a Deployment's pods, on ports they name.
			for _, s := range services {
				found := false
				for dep, labels := range podLabels {
					if selects(s.Spec.Selector, labels) {
						found = true
						for _, p := range s.Spec.Ports {
							if !slices.Contains(ports[dep], p.TargetPort.String()) {
								t.Errorf("Service %s targets port %q, which %s does not name", s.Name, p.TargetPort.String(), dep)
							}
						}
					}
				}
				if !found {
					t.Errorf("Service %s selects no Deployment", s.Name)
				}
			}
		})
	}
	t.Run("agent listener without a node CA", func(t *testing.T) {
		_, err := render(meta, merge(values, map[string]any{"api": map[string]any{"agentListener": map[string]any{"enabled": true}}}))
		if err == nil || !strings.Contains(err.Error(), "nodeCA") {
			t.Fatalf("render: %v, want the nodeCA failure", err)
		}
	})
	t.Run("without a database secret", func(t *testing.T) {
		_, err := render(meta, merge(values, map[string]any{"database": map[string]any{"existingSecret": ""}}))
		if err == nil || !strings.Contains(err.Error(), "database.existingSecret") {
			t.Fatalf("render: %v, want the database.existingSecret failure", err)
		}
	})
	t.Run("the API reaches the IAM host's Service", func(t *testing.T) {
		docs, err := render(meta, merge(values, map[string]any{"iamHost": map[string]any{"enabled": true}}))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range docs {
			if d.kind == "Deployment" && strings.HasSuffix(d.name, "-api") {
				var o appsv1.Deployment
				strict(t, d, &o)
				if got := envValue(o.Spec.Template.Spec.Containers[0].Env, "BC_IAM_URL"); got != "http://prod-better-compute-iam-host:8181" {
					t.Errorf("BC_IAM_URL=%q", got)
				}
			}
		}
	})
}

func strict(t *testing.T, d manifest, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(d.raw, into); err != nil {
		t.Errorf("%s: %s %s: %v\n%s", d.source, d.kind, d.name, err, d.raw)
	}
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func envValue(env []corev1.EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// checkPod checks a pod's containers: the chart's image, a real
// subcommand, environment variables that subcommand reads, and mounts of
// volumes the pod has.
func checkPod(t *testing.T, d manifest, pod *corev1.PodTemplateSpec, meta chartMeta, values map[string]any, commandOf func(*testing.T, []string) command) {
	t.Helper()
	image := values["image"].(map[string]any)["repository"].(string) + ":" + meta.AppVersion
	volumes := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = true
	}
	if len(pod.Spec.Containers) == 0 {
		t.Fatalf("%s: no containers", d.name)
	}
	for _, c := range pod.Spec.Containers {
		if c.Image != image {
			t.Errorf("%s: image %q, want %q", d.name, c.Image, image)
		}
		if len(c.Args) == 0 {
			t.Errorf("%s: container %s has no args (the image's entrypoint is better-compute)", d.name, c.Name)
			continue
		}
		cmd := commandOf(t, c.Args)
		seen := map[string]bool{}
		for _, e := range c.Env {
			if !cmd.env[e.Name] {
				t.Errorf("%s: %s sets %s, which %s does not read", d.name, c.Name, e.Name, cmd.path)
			}
			if seen[e.Name] {
				t.Errorf("%s: %s sets %s twice", d.name, c.Name, e.Name)
			}
			seen[e.Name] = true
			if e.Value == "" && e.ValueFrom == nil {
				t.Errorf("%s: %s sets %s to nothing", d.name, c.Name, e.Name)
			}
		}
		if !seen["BC_DATABASE_URL"] {
			t.Errorf("%s: %s has no BC_DATABASE_URL", d.name, c.Name)
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				t.Errorf("%s: %s mounts %s, which the pod lacks", d.name, c.Name, m.Name)
			}
		}
		if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: %s may escalate privileges", d.name, c.Name)
		}
	}
}
