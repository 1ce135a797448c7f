package deploytest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// binDir holds better-compute and bcd, built once by TestMain; it is set
// before any test runs and never changed.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "deploytest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "./cmd/better-compute", "./cmd/bcd")
	cmd.Dir = repoRoot()
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the binaries: %v\n%s", err, out)
		return 1
	}
	binDir = dir
	return m.Run()
}

// repoRoot is the repository's root: this package is deploy/deploytest.
func repoRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Dir(filepath.Dir(wd))
}

// command is what one subcommand's --help says it accepts.
type command struct {
	path  string          // "better-compute migrate up"
	flags map[string]bool // long names without the dashes
	env   map[string]bool // the environment variables its help names
}

var (
	flagLine = regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9-]*)`)
	envName  = regexp.MustCompile(`\benv (BC_[A-Z0-9_]+)|\$(BCD?_[A-Z0-9_]+)`)
)

// help runs `<bin> <words...> --help`; ok is false when the words are not
// a subcommand, for cobra then prints a parent's help, whose usage differs.
func help(bin string, words ...string) (text string, ok bool, err error) {
	out, err := exec.Command(filepath.Join(binDir, bin), append(words, "--help")...).CombinedOutput()
	if err != nil {
		return string(out), false, err
	}
	path := strings.Join(append([]string{bin}, words...), " ")
	_, usage, _ := strings.Cut(string(out), "Usage:\n")
	first := strings.TrimSpace(strings.SplitN(usage, "\n", 2)[0])
	return string(out), first == path || strings.HasPrefix(first, path+" "), nil
}

// lookup reads the flags and environment variables of a subcommand from
// its help, failing the test when there is no such subcommand.
func lookup(t *testing.T, bin string, words ...string) command {
	t.Helper()
	path := strings.Join(append([]string{bin}, words...), " ")
	text, ok, err := help(bin, words...)
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", path, err, text)
	}
	if !ok {
		t.Fatalf("%q is not a command:\n%s", path, text)
	}
	c := command{path: path, flags: map[string]bool{}, env: map[string]bool{}}
	for _, m := range flagLine.FindAllStringSubmatch(text, -1) {
		c.flags[m[1]] = true
	}
	for _, m := range envName.FindAllStringSubmatch(text, -1) {
		c.env[m[1]+m[2]] = true
	}
	return c
}

// checkArgv checks a command line (without the binary): its leading words
// must be a subcommand and every --flag one of that subcommand's. It
// returns the subcommand.
func checkArgv(t *testing.T, bin string, argv []string) command {
	t.Helper()
	var words []string
	for len(argv) > 0 && !strings.HasPrefix(argv[0], "-") {
		words, argv = append(words, argv[0]), argv[1:]
	}
	if len(words) == 0 {
		t.Fatalf("%s: the command line names no subcommand", bin)
	}
	c := lookup(t, bin, words...)
	for _, a := range argv {
		if !strings.HasPrefix(a, "--") {
			continue // a flag's value
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !c.flags[name] {
			t.Errorf("%s has no flag --%s", c.path, name)
		}
	}
	return c
}

// The checks below are only as good as lookup: it must see inherited flags
// and environment variables, and refuse words that are not a subcommand.
func TestLookupReadsHelp(t *testing.T) {
	c := lookup(t, "better-compute", "migrate", "up")
	if !c.flags["database-url"] || !c.env["BC_DATABASE_URL"] {
		t.Fatalf("migrate up's help lost its inherited flags: %v %v", c.flags, c.env)
	}
	if !lookup(t, "bcd", "node", "join").env["BCD_JOIN_TOKEN"] {
		t.Fatal("bcd node join's help does not name BCD_JOIN_TOKEN")
	}
	for _, tc := range []struct {
		bin   string
		words []string
	}{{"better-compute", []string{"migrate", "sideways"}}, {"bcd", []string{"node", "walk"}}, {"bcd", []string{"nodes"}}} {
		if _, ok, _ := help(tc.bin, tc.words...); ok {
			t.Errorf("%s %v reads as a command", tc.bin, tc.words)
		}
	}
}
