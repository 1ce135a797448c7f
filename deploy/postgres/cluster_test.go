package postgres

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestStartStopRestartKeepsData(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx := context.Background()
	dir := t.TempDir()
	// t.TempDir's folders are private to root; the postgres OS user must reach in.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := Options{DataDir: filepath.Join(dir, "data")}
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	created, err := c.EnsureDatabase(ctx, "app", "")
	if err != nil || !created {
		t.Fatalf("EnsureDatabase = %v, %v", created, err)
	}
	execSQL(t, c.URL("app"), `CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)`)
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}

	opts.Port = c.Port()
	c2, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c2.Stop(context.Background()) })
	if created, err := c2.EnsureDatabase(ctx, "app", ""); err != nil || created {
		t.Fatalf("EnsureDatabase after restart = %v, %v", created, err)
	}
	conn, err := pgx.Connect(ctx, c2.URL("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != 42 {
		t.Fatalf("kept row = %d, %v", v, err)
	}
}

func execSQL(t *testing.T, url, sql string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

func TestStartExplainsAPrivateParent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root hands the server to another OS user")
	}
	dir := t.TempDir() // private to root: the postgres OS user cannot enter
	_, err := Start(context.Background(), Options{DataDir: filepath.Join(dir, "data")})
	if err == nil || !strings.Contains(err.Error(), "chmod o+x") {
		t.Fatalf("Start under a private folder: %v, want an error naming the fix", err)
	}
}

// publicTempDir is a t.TempDir the postgres OS user can enter when the
// tests run as root (t.TempDir's folders are private to their owner).
func publicTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// assertPasswordRequired checks that c admits a client with its password and
// refuses one without it or with a wrong one, over TCP and the unix socket.
func assertPasswordRequired(t *testing.T, c *Cluster) {
	t.Helper()
	ctx := context.Background()
	tcp := func(password string) string {
		u, err := url.Parse(c.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		if password == "" {
			u.User = url.User(c.User())
		} else {
			u.User = url.UserPassword(c.User(), password)
		}
		return u.String()
	}
	socket := func(password string) string {
		q := url.Values{"host": {c.SocketDir()}, "port": {strconv.Itoa(c.Port())}, "user": {c.User()}}
		if password != "" {
			q.Set("password", password)
		}
		return "postgres:///postgres?" + q.Encode()
	}
	for _, tc := range []struct {
		name, url string
		admitted  bool
	}{
		{"tcp with the password", tcp(c.Password()), true},
		{"socket with the password", socket(c.Password()), true},
		{"tcp without a password", tcp(""), false},
		{"tcp with a wrong password", tcp("wrong-" + c.Password()), false},
		{"socket without a password", socket(""), false},
		{"socket with a wrong password", socket("wrong-" + c.Password()), false},
	} {
		// No ~/.pgpass or PGPASSWORD may supply the password behind our back.
		t.Setenv("PGPASSFILE", filepath.Join(t.TempDir(), "none"))
		t.Setenv("PGPASSWORD", "")
		conn, err := pgx.Connect(ctx, tc.url)
		if err == nil {
			_ = conn.Close(ctx)
		}
		switch {
		case tc.admitted && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case !tc.admitted && err == nil:
			t.Errorf("%s: admitted", tc.name)
		}
	}
}

func TestStartRequiresThePasswordOverTCPAndTheSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	c, err := Start(context.Background(), Options{DataDir: filepath.Join(publicTempDir(t), "data"), Password: "s3cret-for-this-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	if c.Password() != "s3cret-for-this-test" {
		t.Fatalf("Password() = %q", c.Password())
	}
	assertPasswordRequired(t, c)
}

// A cluster an older version made trusted every local connection: the next
// Start sets the password and rewrites pg_hba.conf.
func TestStartMigratesATrustClusterToPasswords(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx := context.Background()
	opts := Options{DataDir: filepath.Join(publicTempDir(t), "data")}
	bindir, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	old, err := prepare(ctx, opts, bindir)
	if err != nil {
		t.Fatal(err)
	}
	out, err := old.command(ctx, filepath.Join(bindir, "initdb"), "-D", old.opts.DataDir, "-U", old.opts.User,
		"--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		t.Fatalf("initdb --auth=trust: %v\n%s", err, out)
	}

	opts.Password = "the-new-password"
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	assertPasswordRequired(t, c)

	// And a restart with another password takes that one.
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	opts.Password, opts.Port = "another-password", c.Port()
	c2, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c2.Stop(context.Background()) })
	assertPasswordRequired(t, c2)
}

func TestRedactURLHidesThePassword(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://postgres:hunter2@127.0.0.1:15432/db?sslmode=disable": "postgres://postgres:xxxxx@127.0.0.1:15432/db?sslmode=disable",
		"postgres://postgres@127.0.0.1:15432/db":                         "postgres://postgres@127.0.0.1:15432/db",
		"host=127.0.0.1 password=hunter2":                                "(not a URL)",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
