package e2e

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/cli"
	"github.com/better-compute/better-compute/internal/freeport"
)

// quickstartMarker opens the README's CLI quick start: the ```sh block
// after it is what this test runs, so the README and the test cannot drift.
const quickstartMarker = "<!-- cli-quickstart"

// readmeQuickstart is the README's CLI quick start, line by line.
func readmeQuickstart(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	marked, inBlock := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !marked:
			marked = strings.HasPrefix(line, quickstartMarker)
		case !inBlock:
			if strings.TrimSpace(line) == "```sh" {
				inBlock = true
			} else if strings.TrimSpace(line) != "" {
				t.Fatalf("README: %q follows the quick start's marker, not a ```sh block", line)
			}
		case strings.TrimSpace(line) == "```":
			return lines
		default:
			lines = append(lines, line)
		}
	}
	t.Fatalf("README has no ```sh block after %s (or it is not closed): %v", quickstartMarker, sc.Err())
	return nil
}

// TestREADMECLIQuickstart runs the README's CLI quick start, as written,
// against a dev stack whose contexts the stack wrote itself.
func TestREADMECLIQuickstart(t *testing.T) {
	dir := stackDir(t)
	lines := readmeQuickstart(t)
	if len(lines) < 5 {
		t.Fatalf("the README's CLI quick start has %d lines", len(lines))
	}
	// A checkout of its own: bin/better-compute, and a home holding the
	// CLI's configuration, so nothing of the user's is read or written.
	checkout := t.TempDir()
	built, err := betterComputeBinary()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(checkout, "bin", "better-compute")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(built, bin); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	config := filepath.Join(home, "better-compute", "config.yaml")

	bcd, err := bcdBinary()
	if err != nil {
		t.Fatal(err)
	}
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := devstack.Start(context.Background(), devstack.Options{
		Dir: dir, APIAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0", BCD: bcd, PostgresPort: pgPort,
		TemporalAddr: "127.0.0.1:0", UIAddr: "-", CLIConfig: config,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })

	c, err := cli.LoadConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{devstack.CLIContextDemo, devstack.CLIContextAdmin} {
		x, ok := c.Get(name)
		if !ok || x.API != s.APIURL() || x.TokenFile == "" {
			t.Fatalf("context %s: %+v, %v", name, x, ok)
		}
	}
	if fi, err := os.Stat(config); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the CLI config: %v, %v; want mode 0600", fi, err)
	}
	if raw, _ := os.ReadFile(config); bytes.Contains(raw, []byte(mustToken(t, s.DemoToken))) {
		t.Fatal("the CLI config holds the demo token itself")
	}

	script := "set -ex\n" + strings.Join(lines, "\n") + "\n"
	sh := exec.Command("sh", "-c", script)
	sh.Dir = checkout
	sh.Env = append(cleanEnv(), "HOME="+home, "XDG_CONFIG_HOME="+home, cli.EnvConfig+"="+config)
	var stdout, stderr bytes.Buffer
	sh.Stdout, sh.Stderr = &stdout, &stderr
	if err := sh.Run(); err != nil {
		t.Fatalf("the README's CLI quick start: %v\nstdout:\n%s\nstderr (the commands, as sh ran them):\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{`AUTHENTICATED +true`, `NAME +training`, `STATE +active`, `STATE +released`, `dev-agent-1`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("the quick start's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\"start\": \"") {
		t.Errorf("-o json rendered a time; it keeps the API's epoch ms:\n%s", out)
	}
}

func mustToken(t *testing.T, read func() (string, error)) string {
	t.Helper()
	tok, err := read()
	if err != nil || tok == "" {
		t.Fatalf("token: %q, %v", tok, err)
	}
	return tok
}

// cleanEnv is the test's environment without the CLI's own variables, so
// the contexts alone decide where the commands call.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case cli.EnvAPIURL, cli.EnvToken, cli.EnvTenant, cli.EnvContext, cli.EnvConfig, "HOME", "XDG_CONFIG_HOME":
			continue
		}
		out = append(out, kv)
	}
	return out
}
