// Package postgres runs a local PostgreSQL cluster from the machine's own
// PostgreSQL binaries: the dev stack keeps one under .dev/postgres and the
// test harness starts a throwaway one per test binary.
//
// Every connection, over TCP or the unix socket, authenticates with the
// superuser's password (scram-sha-256): a cluster that trusted local
// connections would let any local OS user write its rows.
package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/internal/freeport"
)

// Options says where the cluster lives and how it listens.
type Options struct {
	// DataDir holds the cluster; it is created by initdb when empty.
	DataDir string
	// Host and Port to listen on; Port 0 picks a free port.
	Host string
	Port int
	// SocketDir is where the unix socket goes (default: DataDir).
	SocketDir string
	// User is the database superuser (default "postgres").
	User string
	// Password is the superuser's password, which every connection must
	// give. Start sets it on the cluster, also on one an earlier start
	// (or an older version of this package, which trusted local
	// connections) left; empty generates a random one, for clusters that
	// do not outlive the process.
	Password string
	// Settings are extra postgresql.conf settings, passed with -c at start.
	Settings map[string]string
	// LogFile receives the server's log (default DataDir/postgres.log).
	LogFile string
}

// Cluster is a running local PostgreSQL server.
type Cluster struct {
	opts   Options
	bindir string
	osUser *user.User // non-nil when the server runs as another OS user
	server *exec.Cmd
	exited chan struct{} // closed when the server process has exited
}

// BinDir finds the directory holding initdb, pg_ctl and postgres: $PG_BINDIR,
// then `pg_config --bindir`, then the newest /usr/lib/postgresql/*/bin, then PATH.
func BinDir() (string, error) {
	has := func(dir string) bool {
		_, err := os.Stat(filepath.Join(dir, "initdb"))
		return err == nil
	}
	if dir := os.Getenv("PG_BINDIR"); dir != "" && has(dir) {
		return dir, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); has(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, dir := range dirs {
		if has(dir) {
			return dir, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("postgres: no PostgreSQL server binaries found (install the postgresql package or set PG_BINDIR)")
}

func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// Start initialises the cluster if its data directory is empty and starts it.
// A cluster whose server is already running (say, left by a killed parent) is
// stopped first so the new one owns it. When the process runs as root the
// server runs as the "postgres" OS user, since PostgreSQL refuses root.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	bindir, err := BinDir()
	if err != nil {
		return nil, err
	}
	c, err := prepare(ctx, o, bindir)
	if err != nil {
		return nil, err
	}
	_, err = os.Stat(filepath.Join(c.opts.DataDir, "PG_VERSION"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := c.initdb(ctx); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	default:
		// The cluster may have been made with another password, or none.
		c.stopStale(ctx)
		if err := c.setPassword(ctx); err != nil {
			return nil, err
		}
	}
	if err := c.writeHBA(); err != nil {
		return nil, err
	}
	if err := c.startServer(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// prepare fills in o's defaults and makes the data directory, the socket
// directory and the log file, owned by the server's OS user.
func prepare(ctx context.Context, o Options, bindir string) (*Cluster, error) {
	if o.DataDir == "" {
		return nil, errors.New("postgres: DataDir is required")
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.User == "" {
		o.User = "postgres"
	}
	var err error
	if o.Password == "" {
		if o.Password, err = GeneratePassword(); err != nil {
			return nil, err
		}
	}
	if o.DataDir, err = filepath.Abs(o.DataDir); err != nil {
		return nil, err
	}
	if o.SocketDir == "" {
		o.SocketDir = o.DataDir
	}
	if o.LogFile == "" {
		o.LogFile = filepath.Join(filepath.Dir(o.DataDir), filepath.Base(o.DataDir)+".log")
	}
	if o.Port == 0 {
		if o.Port, err = freeport.Pick(o.Host); err != nil {
			return nil, err
		}
	}
	c := &Cluster{opts: o, bindir: bindir}
	if os.Geteuid() == 0 {
		if c.osUser, err = user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("postgres: running as root needs a postgres OS user: %w", err)
		}
	}
	for _, dir := range []string{o.DataDir, o.SocketDir} {
		if err := c.mkdirOwned(dir); err != nil {
			return nil, err
		}
		if err := c.checkReachable(ctx, dir); err != nil {
			return nil, err
		}
	}
	if err := c.touchOwned(o.LogFile); err != nil {
		return nil, err
	}
	return c, nil
}

// takeOver starts the server on the prepared data directory. A server still
// running on it (its parent was killed before it could stop it) is stopped
// first so this process owns the cluster.
func (c *Cluster) takeOver(ctx context.Context) error {
	c.stopStale(ctx)
	return c.startServer(ctx)
}

// stopStale stops a server still running on the data directory.
func (c *Cluster) stopStale(ctx context.Context) {
	if c.pgCtl(ctx, "status") == nil {
		_ = c.pgCtl(ctx, "stop", "-m", "fast", "-w")
	}
}

// GeneratePassword returns a random password (128 bits, hex) for a cluster.
func GeneratePassword() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("postgres: generate a password: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// hbaConf admits, over the unix socket and TCP from this machine, only
// clients that prove the password; replication (a replica's base backup and
// stream) included.
const hbaConf = `# Written by better-compute at every start: every connection gives the password.
# TYPE  DATABASE     USER  ADDRESS   METHOD
local   all          all             scram-sha-256
host    all          all   samehost  scram-sha-256
local   replication  all             scram-sha-256
host    replication  all   samehost  scram-sha-256
`

// writeHBA replaces the cluster's pg_hba.conf with hbaConf, so that a
// cluster made with other rules (trust) takes these at its next start.
func (c *Cluster) writeHBA() error {
	path := filepath.Join(c.opts.DataDir, "pg_hba.conf")
	if err := os.WriteFile(path, []byte(hbaConf), 0o600); err != nil {
		return fmt.Errorf("postgres: write pg_hba.conf: %w", err)
	}
	return c.chown(path)
}

// setPassword sets the superuser's password on the stopped cluster, in
// single-user mode, which needs no authentication: the cluster's old
// password, if any, need not be known.
func (c *Cluster) setPassword(ctx context.Context) error {
	stmt := fmt.Sprintf("ALTER ROLE %s PASSWORD %s\n",
		pgx.Identifier{c.opts.User}.Sanitize(), quoteLiteral(c.opts.Password))
	cmd := c.command(ctx, filepath.Join(c.bindir, "postgres"),
		"--single", "-D", c.opts.DataDir, "-c", "password_encryption=scram-sha-256", "postgres")
	cmd.Stdin = strings.NewReader(stmt)
	out, err := cmd.CombinedOutput()
	// The server echoes a failed statement; the password stays out of errors.
	text := strings.ReplaceAll(string(out), c.opts.Password, "xxxxx")
	if err != nil {
		return fmt.Errorf("postgres: set the password in single-user mode: %w\n%s", err, text)
	}
	if strings.Contains(text, "ERROR:") {
		return fmt.Errorf("postgres: set the password in single-user mode:\n%s", text)
	}
	return nil
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// startServer runs postgres as our child, in its own process group so a
// Ctrl-C on the terminal reaches only us and we stop it in order. Should we
// die without stopping it, the kernel sends it SIGQUIT (immediate shutdown,
// which is crash-safe), so no server outlives its parent.
func (c *Cluster) startServer(ctx context.Context) error {
	args := []string{"-D", c.opts.DataDir}
	for _, kv := range c.settings() {
		args = append(args, "-c", kv)
	}
	cmd := c.command(context.WithoutCancel(ctx), filepath.Join(c.bindir, "postgres"), args...)
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	logf, err := os.OpenFile(c.opts.LogFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("postgres: start: %w", err)
	}
	c.server = cmd
	c.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(waitCtx, c.URL("postgres"))
		if err == nil {
			return conn.Close(waitCtx)
		}
		select {
		case <-c.exited:
			return fmt.Errorf("postgres: server exited at start (log in %s)", c.opts.LogFile)
		case <-waitCtx.Done():
			c.kill()
			return fmt.Errorf("postgres: not ready (log in %s): %w", c.opts.LogFile, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// settings are the server's name=value settings, in a stable order.
func (c *Cluster) settings() []string {
	o := c.opts
	settings := map[string]string{
		"listen_addresses":        o.Host,
		"port":                    strconv.Itoa(o.Port),
		"unix_socket_directories": o.SocketDir,
		"max_connections":         "200",
		"password_encryption":     "scram-sha-256",
	}
	for k, v := range o.Settings {
		settings[k] = v
	}
	out := make([]string, 0, len(settings))
	for k, v := range settings {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func (c *Cluster) initdb(ctx context.Context) error {
	// initdb reads the password from a file; it lives next to the data
	// directory (which initdb wants empty), readable by the server's OS
	// user only, for as long as initdb runs.
	pwfile, err := os.CreateTemp(filepath.Dir(c.opts.DataDir), ".pwfile-")
	if err != nil {
		return fmt.Errorf("postgres: initdb password file: %w", err)
	}
	defer os.Remove(pwfile.Name())
	_, err = pwfile.WriteString(c.opts.Password + "\n")
	if cerr := pwfile.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = c.chown(pwfile.Name())
	}
	if err != nil {
		return fmt.Errorf("postgres: initdb password file: %w", err)
	}
	cmd := c.command(ctx, filepath.Join(c.bindir, "initdb"),
		"-D", c.opts.DataDir, "-U", c.opts.User, "--auth=scram-sha-256", "--pwfile="+pwfile.Name(),
		"-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("postgres: initdb failed: %w\n%s", err, out)
	}
	return nil
}

// Stop shuts the server down in fast mode (running transactions roll back,
// everything committed is on disk) and waits for it to exit. It is
// idempotent.
func (c *Cluster) Stop(ctx context.Context) error {
	if c.server == nil {
		return nil
	}
	select {
	case <-c.exited:
		return nil
	default:
	}
	_ = c.server.Process.Signal(syscall.SIGINT)
	select {
	case <-c.exited:
		return nil
	case <-ctx.Done():
	case <-time.After(60 * time.Second):
	}
	c.kill()
	return errors.New("postgres: fast shutdown did not finish; sent immediate shutdown")
}

// kill is the immediate shutdown: safe, the next start replays the WAL.
func (c *Cluster) kill() {
	_ = c.server.Process.Signal(syscall.SIGQUIT)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.server.Process.Kill()
		<-c.exited
	}
}

func (c *Cluster) pgCtl(ctx context.Context, args ...string) error {
	full := append([]string{"-D", c.opts.DataDir}, args...)
	cmd := c.command(ctx, filepath.Join(c.bindir, "pg_ctl"), full...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pg_ctl %s: %w: %s", args[len(args)-1], err, strings.TrimSpace(out.String()))
	}
	return nil
}

// command runs a PostgreSQL binary as the postgres OS user when we are root.
// The server gets its own process group so a Ctrl-C aimed at our terminal
// reaches us, and we stop it in order, rather than killing it mid-write.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.Dir = c.opts.DataDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if c.osUser != nil {
		uid, _ := strconv.Atoi(c.osUser.Uid)
		gid, _ := strconv.Atoi(c.osUser.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		cmd.Dir = "/"
		// Its own home, not root's: libpq looks there for ~/.pgpass, and
		// pg_basebackup -R writes that path into primary_conninfo.
		cmd.Env = append(cmd.Env, "HOME="+c.osUser.HomeDir)
	}
	return cmd
}

func (c *Cluster) mkdirOwned(dir string) error {
	// Parents stay traversable so the postgres OS user can reach dir.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return c.chown(dir)
}

// checkReachable fails with a clear message when the server's OS user cannot
// reach dir (a parent such as /root is private), rather than letting initdb
// fail obscurely. It changes no permissions itself.
func (c *Cluster) checkReachable(ctx context.Context, dir string) error {
	if c.osUser == nil {
		return nil
	}
	if c.command(ctx, "/bin/sh", "-c", `cd "$1"`, "sh", dir).Run() == nil {
		return nil
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("postgres: the %s OS user cannot reach %s because %s is private; "+
				"choose a data directory elsewhere or allow traversal (chmod o+x %s)", c.osUser.Username, dir, d, d)
		}
		if d == "/" {
			return fmt.Errorf("postgres: the %s OS user cannot reach %s", c.osUser.Username, dir)
		}
	}
}

// ServerUserCanReach reports whether the OS user a cluster's server runs as
// can enter dir: always when this process is not root (the server runs as
// this process's user), else whether the postgres OS user can, which it
// cannot when a parent such as /root is private.
func ServerUserCanReach(ctx context.Context, dir string) (bool, error) {
	if os.Geteuid() != 0 {
		return true, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return false, fmt.Errorf("postgres: running as root needs a postgres OS user: %w", err)
	}
	c := &Cluster{osUser: u}
	return c.command(ctx, "/bin/sh", "-c", `cd "$1"`, "sh", dir).Run() == nil, nil
}

func (c *Cluster) touchOwned(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	return c.chown(path)
}

func (c *Cluster) chown(path string) error {
	if c.osUser == nil {
		return nil
	}
	uid, _ := strconv.Atoi(c.osUser.Uid)
	gid, _ := strconv.Atoi(c.osUser.Gid)
	return os.Chown(path, uid, gid)
}

// Host, Port, User, Password and SocketDir describe how to reach the server.
func (c *Cluster) Host() string      { return c.opts.Host }
func (c *Cluster) Port() int         { return c.opts.Port }
func (c *Cluster) User() string      { return c.opts.User }
func (c *Cluster) Password() string  { return c.opts.Password }
func (c *Cluster) SocketDir() string { return c.opts.SocketDir }
func (c *Cluster) BinDir() string    { return c.bindir }

// URL is a connection URL for database db over TCP. It carries the
// password: print RedactURL of it, never it.
func (c *Cluster) URL(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(c.opts.User, c.opts.Password),
		Host:     net.JoinHostPort(c.opts.Host, strconv.Itoa(c.opts.Port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// RedactURL returns a connection URL with its password, if any, replaced by
// "xxxxx", for banners and logs. Anything else (a key=value connection
// string, which may hold a password anywhere) becomes "(not a URL)".
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "(not a URL)"
	}
	return u.Redacted()
}

// EnsureDatabase creates database db (from template when not empty) unless it
// exists, and reports whether it created it.
func (c *Cluster) EnsureDatabase(ctx context.Context, db, template string) (bool, error) {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, db).Scan(&exists); err != nil {
		return false, err
	}
	if exists {
		return false, nil
	}
	stmt := "CREATE DATABASE " + pgx.Identifier{db}.Sanitize()
	if template != "" {
		stmt += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return false, fmt.Errorf("postgres: create database %s: %w", db, err)
	}
	return true, nil
}
