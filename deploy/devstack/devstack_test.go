package devstack

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/deploy/postgres"
	"github.com/better-compute/better-compute/internal/freeport"
)

// defaultPorts lists every port in Defaults: each int field named …Port and
// the port of each string field named …Addr, so a port added there is
// checked without a change here.
func defaultPorts(t *testing.T) map[string]int {
	t.Helper()
	d := reflect.ValueOf(Defaults())
	ports := map[string]int{}
	for i := 0; i < d.NumField(); i++ {
		f, v := d.Type().Field(i), d.Field(i)
		switch {
		case strings.HasSuffix(f.Name, "Port") && v.Kind() == reflect.Int:
			ports[f.Name] = int(v.Int())
		case strings.HasSuffix(f.Name, "Addr") && v.Kind() == reflect.String:
			_, p, err := net.SplitHostPort(v.String())
			if err != nil {
				t.Fatalf("Defaults().%s = %q: %v", f.Name, v.String(), err)
			}
			if ports[f.Name], err = strconv.Atoi(p); err != nil {
				t.Fatalf("Defaults().%s = %q: %v", f.Name, v.String(), err)
			}
		}
	}
	return ports
}

// Linux's ephemeral range starts at 32768: a default port there can be held
// by any outgoing connection's source port when `make run` starts. And a
// default port in freeport's range could be taken by a test's server.
func TestDefaultPortsLieBelowTheEphemeralRangeAndFreeportsRange(t *testing.T) {
	ports := defaultPorts(t)
	if len(ports) < 5 {
		t.Fatalf("found only %v in Defaults", ports)
	}
	seen := map[int]string{}
	for name, p := range ports {
		if p <= 0 || p >= 32768 || p >= freeport.Lowest {
			t.Errorf("Defaults().%s: port %d, want 0 < port < %d (freeport's range and the ephemeral range start there)",
				name, p, min(32768, freeport.Lowest))
		}
		if other, ok := seen[p]; ok {
			t.Errorf("Defaults().%s and %s share port %d", name, other, p)
		}
		seen[p] = name
	}
}

func TestClusterDirStaysInTheCheckoutWhenThePostgresUserCanReachIt(t *testing.T) {
	var probed []string
	got := clusterDir("/home/ann/src/bc/.dev", "/var/lib/better-compute", func(dir string) bool {
		probed = append(probed, dir)
		return true
	})
	if want := "/home/ann/src/bc/.dev/postgres"; got != want {
		t.Errorf("clusterDir = %q, want %q", got, want)
	}
	if len(probed) != 1 || probed[0] != "/home/ann/src/bc/.dev" {
		t.Errorf("probed %v, want the dev directory", probed)
	}
}

func TestClusterDirMovesOutOfAPrivateCheckoutToAStablePerCheckoutPlace(t *testing.T) {
	unreachable := func(string) bool { return false }
	a := clusterDir("/root/src/bc/.dev", "/var/lib/better-compute", unreachable)
	if !strings.HasPrefix(a, "/var/lib/better-compute/dev-") || filepath.Base(a) != "postgres" {
		t.Fatalf("clusterDir = %q, want /var/lib/better-compute/dev-<hash>/postgres", a)
	}
	if again := clusterDir("/root/src/bc/.dev", "/var/lib/better-compute", unreachable); again != a {
		t.Errorf("a second run chose %q, the first %q", again, a)
	}
	if other := clusterDir("/root/src/bc2/.dev", "/var/lib/better-compute", unreachable); other == a {
		t.Errorf("two checkouts share %q", a)
	}
	if fd := fallbackDir("/root/src/bc/.dev", "/var/lib/better-compute"); filepath.Join(fd, "postgres") != a {
		t.Errorf("fallbackDir = %q (what --reset removes), clusterDir = %q", fd, a)
	}
}

// As root, a checkout under a private folder shuts the postgres OS user
// out: the cluster starts anyway, with its data in the fallback place, and
// the banner says where.
func TestPostgresStartsFromAPrivateCheckoutAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root runs the server as another OS user")
	}
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx := context.Background()
	checkout := t.TempDir() // 0700, root's: the postgres OS user cannot enter
	if err := os.Chmod(checkout, 0o700); err != nil {
		t.Fatal(err)
	}
	fallback := t.TempDir()
	for _, d := range []string{filepath.Dir(fallback), fallback} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	port, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Dir: filepath.Join(checkout, ".dev"), PostgresPort: port, fallbackRoot: fallback,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}.withDefaults()
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &Stack{opts: o}
	if err := s.startPostgres(ctx); err != nil {
		t.Fatalf("startPostgres from a private checkout: %v", err)
	}
	t.Cleanup(func() { _ = s.postgres.Stop(context.Background()) })

	if !strings.HasPrefix(s.postgresDir, fallback+string(filepath.Separator)) {
		t.Errorf("the cluster's data is in %s, want under %s", s.postgresDir, fallback)
	}
	if rows := fmt.Sprint(s.postgresRows()); !strings.Contains(rows, s.postgresDir) || !strings.Contains(rows, "outside the checkout") {
		t.Errorf("the banner's rows %s do not say where the data is", rows)
	}
	conn, err := pgx.Connect(ctx, s.databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	if fi, err := os.Stat(filepath.Join(o.Dir, postgresPasswordFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("password file: %v, %v; want mode 0600", fi, err)
	}
}

// The banner prints the database URL without its password, and a restart
// keeps the password of the file.
func TestBannerRowsRedactTheDatabasePassword(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx := context.Background()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	port, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Dir: filepath.Join(dir, ".dev"), PostgresPort: port,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}.withDefaults()
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &Stack{opts: o}
	if err := s.startPostgres(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.postgres.Stop(context.Background()) })
	rows := fmt.Sprint(s.postgresRows())
	if strings.Contains(rows, s.postgres.Password()) || !strings.Contains(rows, postgres.RedactURL(s.databaseURL)) {
		t.Fatalf("the banner's rows %s show the password or no URL", rows)
	}
	if err := s.postgres.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	before := s.postgres.Password()
	if err := s.startPostgres(ctx); err != nil {
		t.Fatal(err)
	}
	if s.postgres.Password() != before {
		t.Errorf("a restart changed the password")
	}
}
