package deploytest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"
)

// unitFile is a parsed unit: section → key → values, in order.
type unitFile map[string]map[string][]string

func (u unitFile) get(section, key string) []string { return u[section][key] }

// list is a list setting's items (After=a b, After=c: a, b, c).
func (u unitFile) list(section, key string) []string {
	var items []string
	for _, v := range u[section][key] {
		items = append(items, strings.Fields(v)...)
	}
	return items
}

func (u unitFile) one(t *testing.T, name, section, key string) string {
	t.Helper()
	v := u.get(section, key)
	if len(v) != 1 || v[0] == "" {
		t.Fatalf("%s: want one [%s] %s, have %q", name, section, key, v)
	}
	return v[0]
}

func readUnit(t *testing.T, path string) unitFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opts, err := unit.DeserializeOptions(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	u := unitFile{}
	for _, o := range opts {
		if u[o.Section] == nil {
			u[o.Section] = map[string][]string{}
		}
		u[o.Section][o.Name] = append(u[o.Section][o.Name], o.Value)
	}
	return u
}

// systemdUnits are the units deploy/systemd ships and the command each runs.
var systemdUnits = []struct {
	file    string
	bin     string
	command string // the subcommand ExecStart runs
	// root is true for the node agent alone, which needs the GPUs and the
	// CDI directories (see the unit's comment).
	root    bool
	oneshot bool
	envFile string
	// borrowed is true when the environment file is another unit's, whose
	// command reads all of it.
	borrowed bool
}{
	{"better-compute-migrate.service", "better-compute", "migrate up", false, true, "serve.env", true},
	{"better-compute-serve.service", "better-compute", "serve", false, false, "serve.env", false},
	{"better-compute-worker.service", "better-compute", "worker", false, false, "worker.env", false},
	{"better-compute-iam-host.service", "better-compute", "iam-host", false, false, "iam-host.env", false},
	{"bcd-node-join.service", "bcd", "node join", true, true, "bcd-node.env", false},
	{"bcd-node.service", "bcd", "node run", true, false, "bcd-node.env", true},
	{"bcd-site.service", "bcd", "site", false, false, "bcd-site.env", false},
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

func TestSystemdUnits(t *testing.T) {
	dir := filepath.Join(repoRoot(), "deploy", "systemd")
	shipped, err := filepath.Glob(filepath.Join(dir, "*.service"))
	if err != nil {
		t.Fatal(err)
	}
	if len(shipped) != len(systemdUnits) {
		t.Errorf("deploy/systemd has %d units, the test knows %d", len(shipped), len(systemdUnits))
	}
	for _, tc := range systemdUnits {
		t.Run(tc.file, func(t *testing.T) {
			u := readUnit(t, filepath.Join(dir, tc.file))
			u.one(t, tc.file, "Unit", "Description")
			if len(u["Install"]["WantedBy"]) == 0 {
				t.Errorf("no [Install] WantedBy")
			}
			argv := strings.Fields(u.one(t, tc.file, "Service", "ExecStart"))
			if want := "/usr/local/bin/" + tc.bin; argv[0] != want {
				t.Fatalf("ExecStart runs %s, want %s", argv[0], want)
			}
			if got := strings.Join(argv[1:1+len(strings.Fields(tc.command))], " "); got != tc.command {
				t.Errorf("ExecStart runs %q, want %q", got, tc.command)
			}
			cmd := checkArgv(t, tc.bin, argv[1:])

			for key, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict"} {
				if v := u.get("Service", key); !slices.Equal(v, []string{want}) {
					t.Errorf("%s=%q, want %s", key, v, want)
				}
			}
			u.one(t, tc.file, "Service", "StateDirectory")
			typ := u.one(t, tc.file, "Service", "Type")
			if tc.oneshot {
				if typ != "oneshot" {
					t.Errorf("Type=%s, want oneshot", typ)
				}
			} else if r := u.get("Service", "Restart"); !slices.Equal(r, []string{"on-failure"}) {
				t.Errorf("Restart=%q, want on-failure", r)
			}
			user, dynamic := u.get("Service", "User"), u.get("Service", "DynamicUser")
			switch {
			case tc.root && (len(user) > 0 || len(dynamic) > 0):
				t.Errorf("the node agent runs as root, for NVML and the CDI directories")
			case tc.root:
				for _, key := range []string{"PrivateDevices", "DevicePolicy", "DeviceAllow"} {
					if len(u.get("Service", key)) > 0 {
						t.Errorf("%s would hide the GPUs from NVML", key)
					}
				}
			case len(user) == 0 && !slices.Equal(dynamic, []string{"yes"}):
				t.Errorf("runs as root: want User= or DynamicUser=yes")
			}

			envFile := u.one(t, tc.file, "Service", "EnvironmentFile")
			if want := "/etc/better-compute/" + tc.envFile; strings.TrimPrefix(envFile, "-") != want {
				t.Errorf("EnvironmentFile=%s, want %s", envFile, want)
			}
			// Every variable of the example file is read by the command or
			// by the unit's own command line.
			refs := map[string]bool{}
			for _, m := range envRef.FindAllStringSubmatch(strings.Join(argv, " "), -1) {
				refs[m[1]] = true
			}
			for _, name := range envFileNames(t, filepath.Join(dir, tc.envFile+".example")) {
				if !tc.borrowed && !cmd.env[name] && !refs[name] {
					t.Errorf("%s.example sets %s, which %s does not read", tc.envFile, name, cmd.path)
				}
			}
			for name := range refs {
				if !slices.Contains(envFileNames(t, filepath.Join(dir, tc.envFile+".example")), name) {
					t.Errorf("ExecStart uses ${%s}, which %s.example does not set", name, tc.envFile)
				}
			}
		})
	}
	serve := readUnit(t, filepath.Join(dir, "better-compute-serve.service"))
	if !slices.Contains(serve.list("Unit", "Requires"), "better-compute-migrate.service") ||
		!slices.Contains(serve.list("Unit", "After"), "better-compute-migrate.service") {
		t.Errorf("serve does not wait for the migrations: Requires=%q After=%q", serve.get("Unit", "Requires"), serve.get("Unit", "After"))
	}
	node := readUnit(t, filepath.Join(dir, "bcd-node.service"))
	if !slices.Contains(node.list("Unit", "After"), "bcd-node-join.service") || !slices.Contains(node.list("Unit", "Requires"), "bcd-node-join.service") {
		t.Errorf("bcd node run does not come after bcd node join")
	}
}

// envFileNames are the variables an example environment file sets,
// commented-out ones included.
func envFileNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	assign := regexp.MustCompile(`^#?([A-Z][A-Z0-9_]*)=`)
	var names []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if m := assign.FindStringSubmatch(s.Text()); m != nil {
			names = append(names, m[1])
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatalf("%s sets nothing", path)
	}
	return names
}

// TestSystemdAnalyzeVerify runs systemd's own checker where it is
// installed, on copies of the units that run the binaries just built (it
// checks that every command exists).
func TestSystemdAnalyzeVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed; TestSystemdUnits parsed the units")
	}
	dir := t.TempDir()
	var files []string
	for _, tc := range systemdUnits {
		b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "systemd", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, tc.file)
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/", binDir+"/")), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, path)
	}
	out, err := exec.Command(analyze, append([]string{"verify", "--man=no", "--generators=no"}, files...)...).CombinedOutput()
	// Unknown keys and bad values are warnings: any output is a finding.
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
