package deploytest

import (
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The subset of the Compose specification the file uses.
type composeFile struct {
	Name     string                    `json:"name"`
	Services map[string]composeService `json:"services"`
	Volumes  map[string]any            `json:"volumes"`
}

type composeService struct {
	Image       string            `json:"image"`
	Build       *composeBuild     `json:"build"`
	Command     []string          `json:"command"`
	Environment map[string]string `json:"environment"`
	DependsOn   map[string]struct {
		Condition string `json:"condition"`
	} `json:"depends_on"`
	Healthcheck *struct {
		Test []string `json:"test"`
	} `json:"healthcheck"`
	Volumes []string `json:"volumes"`
}

type composeBuild struct {
	Context    string `json:"context"`
	Dockerfile string `json:"dockerfile"`
}

// interpolation is Compose's ${VAR:-default}: the test reads the defaults.
var interpolation = regexp.MustCompile(`\$\{[A-Z_]+:-([^}]*)\}`)

func TestComposeFile(t *testing.T) {
	dir := filepath.Join(repoRoot(), "deploy", "compose")
	b, err := os.ReadFile(filepath.Join(dir, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	// Strict but for the x- extension holding the shared settings.
	var loose map[string]any
	if err := yaml.Unmarshal(b, &loose); err != nil {
		t.Fatal(err)
	}
	for k := range loose {
		if !strings.HasPrefix(k, "x-") && !slices.Contains([]string{"name", "services", "volumes"}, k) {
			t.Errorf("unexpected top-level key %q", k)
		}
	}
	if err := yaml.Unmarshal(interpolation.ReplaceAll(b, []byte("$1")), &f); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"postgres", "temporal", "migrate", "serve", "worker"} {
		if _, ok := f.Services[name]; !ok {
			t.Fatalf("no %s service", name)
		}
	}
	for name, s := range f.Services {
		for dep, d := range s.DependsOn {
			target, ok := f.Services[dep]
			switch {
			case !ok:
				t.Errorf("%s depends on %s, which is not a service", name, dep)
			case d.Condition == "service_healthy" && target.Healthcheck == nil:
				t.Errorf("%s waits for %s to be healthy, which has no healthcheck", name, dep)
			case d.Condition != "service_healthy" && d.Condition != "service_completed_successfully":
				t.Errorf("%s depends on %s with condition %q: want it healthy or completed", name, dep, d.Condition)
			}
		}
		if s.Healthcheck != nil && (len(s.Healthcheck.Test) < 2 || !slices.Contains([]string{"CMD", "CMD-SHELL"}, s.Healthcheck.Test[0])) {
			t.Errorf("%s: healthcheck %q", name, s.Healthcheck.Test)
		}
		for _, v := range s.Volumes {
			if vol, _, _ := strings.Cut(v, ":"); !strings.HasPrefix(vol, ".") && !strings.HasPrefix(vol, "/") {
				if _, ok := f.Volumes[vol]; !ok {
					t.Errorf("%s mounts volume %s, which is not declared", name, vol)
				}
			}
		}
	}
	for _, name := range []string{"postgres", "temporal", "serve"} {
		if f.Services[name].Healthcheck == nil {
			t.Errorf("%s has no healthcheck", name)
		}
	}
	wants := map[string]map[string]string{
		"migrate": {"postgres": "service_healthy"},
		"serve":   {"migrate": "service_completed_successfully", "temporal": "service_healthy"},
		"worker":  {"migrate": "service_completed_successfully", "temporal": "service_healthy"},
	}
	for name, deps := range wants {
		for dep, cond := range deps {
			if got := f.Services[name].DependsOn[dep].Condition; got != cond {
				t.Errorf("%s depends on %s with %q, want %q", name, dep, got, cond)
			}
		}
	}

	// Better Compute's services: the image of deploy/Dockerfile, real
	// subcommands, variables they read, and the database and Temporal of
	// this file.
	for _, name := range []string{"migrate", "serve", "worker"} {
		s := f.Services[name]
		if s.Build == nil || s.Build.Dockerfile != "deploy/Dockerfile" {
			t.Errorf("%s is not built from deploy/Dockerfile: %+v", name, s.Build)
		} else if _, err := os.Stat(filepath.Join(dir, s.Build.Context, s.Build.Dockerfile)); err != nil {
			t.Errorf("%s: build context %s: %v", name, s.Build.Context, err)
		}
		cmd := checkArgv(t, "better-compute", s.Command)
		for k := range s.Environment {
			if !cmd.env[k] {
				t.Errorf("%s sets %s, which %s does not read", name, k, cmd.path)
			}
		}
		db, err := url.Parse(s.Environment["BC_DATABASE_URL"])
		if err != nil || db.Hostname() != "postgres" || strings.TrimPrefix(db.Path, "/") != f.Services["postgres"].Environment["POSTGRES_DB"] {
			t.Errorf("%s: BC_DATABASE_URL %q is not the postgres service's database", name, s.Environment["BC_DATABASE_URL"])
		}
		if host, _, err := net.SplitHostPort(s.Environment["BC_TEMPORAL_ADDRESS"]); err != nil || host != "temporal" {
			t.Errorf("%s: BC_TEMPORAL_ADDRESS %q is not the temporal service", name, s.Environment["BC_TEMPORAL_ADDRESS"])
		}
	}
	if ns := f.Services["temporal"].Environment["DEFAULT_NAMESPACE"]; ns != f.Services["serve"].Environment["BC_TEMPORAL_NAMESPACE"] {
		t.Errorf("Temporal creates namespace %q, the control plane uses %q", ns, f.Services["serve"].Environment["BC_TEMPORAL_NAMESPACE"])
	}
	if l := f.Services["serve"].Environment["BC_LISTEN"]; !strings.HasPrefix(l, "0.0.0.0:") {
		t.Errorf("serve listens on %q: unreachable from outside its container", l)
	}

	// Where Docker's compose plugin is installed, its own check runs too.
	if exec.Command("docker", "compose", "version").Run() == nil {
		if out, err := exec.Command("docker", "compose", "-f", filepath.Join(dir, "compose.yaml"), "config", "-q").CombinedOutput(); err != nil {
			t.Errorf("docker compose config: %v\n%s", err, out)
		}
	}
}

func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	from := regexp.MustCompile(`(?m)^FROM\s+(\S+)(?:\s+AS\s+(\S+))?`).FindAllStringSubmatch(text, -1)
	if len(from) < 2 || from[0][2] == "" {
		t.Fatalf("want a multi-stage build with a named build stage, have %q", from)
	}
	if !strings.Contains(text, "COPY --from="+from[0][2]) {
		t.Errorf("the last stage does not copy from the build stage %s", from[0][2])
	}
	if !regexp.MustCompile(`go build [^\n]*(\\\n[^\n]*)*\./cmd/better-compute`).MatchString(text) {
		t.Errorf("the build stage does not build ./cmd/better-compute")
	}
	if !strings.Contains(text, `ENTRYPOINT ["/usr/local/bin/better-compute"]`) {
		t.Errorf("the entrypoint is not better-compute: the chart and compose file pass only subcommands")
	}
	if !regexp.MustCompile(`(?m)^USER\s+\S+`).MatchString(text) {
		t.Errorf("the image runs as root")
	}
}
