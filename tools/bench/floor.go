package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/deploy/postgres"
)

// The floor: per scenario, a pgbench script doing per call the transactions
// the API does per call, against plain tables of a scratch database
// (bench_floor) on the same PostgreSQL cluster. One script run is one
// pgbench "transaction", so its tps is calls/s and its latency per call.
//
// How the API's transactions were counted (api/envelope.go, admission.go,
// reservations.go; the caller is the demo tenant's user, so every decision
// is an allowed non-override one and IAM writes no audit entry; the
// authentication is cached 30 s):
//
//	create (placed): tx1, read-write: SET LOCAL synchronous_commit, the
//	  idempotency row locked, the draft reservation, its authz row (whose
//	  trigger adds an authz_changes row), the idempotency row — 1 commit;
//	  RefreshResource re-reads the draft's authz row and Require reads the
//	  decision's facts: 2 single-statement reads, never cached;
//	  tx2, read-write: idempotency row and reservation locked, draft ->
//	  pending, the offer's quota lock (pg_advisory_xact_lock per tenant and
//	  pool, as the demo pool is offered), the allocation, its bookings,
//	  pending -> placed, the idempotency result, the audit_events row — 1
//	  commit; the started hook's read-only tx (the reservation again);
//	  then Temporal's workflow start, estimated as 2 commits in its own
//	  database (the history append, then the execution and task rows).
//	  In all: 4 write commits, 1 read-only tx, 2 reads.
//	get: authentication and the read decision are cached, so 1 read-only
//	  tx (the reservation and its allocations).
//	list (scope all): 1 read-only tx reading a page of up to 500; the
//	  per-item decisions are answered from the cache of allows.
//	contention (refused, 192 of 200 calls): tx1 as create (1 commit), the
//	  2 reads, tx2 up to the quota lock and the placement reads, rolled
//	  back (noCapacity), then the failed hook's tx: draft -> pending ->
//	  failed (1 commit). In all: 2 write commits, 1 rollback, 2 reads.

// floorSetup makes the floor's tables: stand-ins for idempotency_keys,
// reservations, authz_resources (and authz_changes), allocations,
// device_bookings, audit_events and Temporal's history and executions,
// with 1000 placed reservations for get and list.
const floorSetup = `
CREATE TABLE floor_idem (k bigint PRIMARY KEY, request_hash bytea NOT NULL, resource text NOT NULL,
	result jsonb, completed_at timestamptz);
CREATE TABLE floor_rsv (id bigint PRIMARY KEY, tenant text NOT NULL, pool text NOT NULL, state text NOT NULL,
	devices jsonb NOT NULL, starts_at timestamptz NOT NULL, ends_at timestamptz NOT NULL, failure jsonb,
	created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX floor_rsv_list ON floor_rsv (tenant, created_at, id);
CREATE TABLE floor_authz (id bigint PRIMARY KEY, tenant text NOT NULL, attributes jsonb NOT NULL);
CREATE TABLE floor_authz_changes (seq bigserial PRIMARY KEY, id bigint NOT NULL,
	xid xid8 NOT NULL DEFAULT pg_current_xact_id());
CREATE TABLE floor_alloc (id bigint PRIMARY KEY, rsv bigint NOT NULL, node text NOT NULL, atoms text[] NOT NULL);
CREATE INDEX floor_alloc_rsv ON floor_alloc (rsv);
CREATE TABLE floor_booking (alloc bigint NOT NULL, atom text NOT NULL, during tstzrange NOT NULL);
CREATE INDEX floor_booking_atom ON floor_booking (atom);
CREATE TABLE floor_audit (id bigint NOT NULL, tenant text NOT NULL, method text NOT NULL,
	at timestamptz NOT NULL DEFAULT now());
CREATE TABLE floor_wf_history (id bigint NOT NULL, events bytea NOT NULL);
CREATE TABLE floor_wf (id bigint PRIMARY KEY, state bytea NOT NULL);
INSERT INTO floor_rsv (id, tenant, pool, state, devices, starts_at, ends_at)
	SELECT g, 'acme', 'pool', 'placed', '{"class": "gpu", "count": 1}', now(), now() + interval '10 minutes'
	FROM generate_series(1, 1000) g;
INSERT INTO floor_alloc SELECT g, g, 'node', ARRAY['atom-' || g] FROM generate_series(1, 1000) g;
INSERT INTO floor_authz SELECT g, 'acme', '{}' FROM generate_series(1, 1000) g;
ANALYZE;
`

// Fragments the scripts share. Keys are drawn from far above the seeded
// ids; a collision among a run's calls is negligible. Literals hold no
// ":name": pgbench would take it for a variable, even inside quotes.
const (
	floorKey = `\set k random(1000000, 9000000000000000000)
`
	floorTx1 = `BEGIN;
SET LOCAL synchronous_commit = on;
SELECT request_hash, resource, result FROM floor_idem WHERE k = :k FOR UPDATE;
INSERT INTO floor_rsv (id, tenant, pool, state, devices, starts_at, ends_at) VALUES (:k, 'acme', 'pool', 'draft', '{"class": "gpu", "count": 1}', now(), now() + interval '10 minutes');
INSERT INTO floor_authz (id, tenant, attributes) VALUES (:k, 'acme', '{"gpuCount": 1}');
INSERT INTO floor_authz_changes (id) VALUES (:k);
INSERT INTO floor_idem (k, request_hash, resource) VALUES (:k, decode('00', 'hex'), 'rsv');
COMMIT;
`
	floorReads = `SELECT tenant, attributes FROM floor_authz WHERE id = :k;
SELECT count(*) FROM floor_authz WHERE id = :k AND tenant = 'acme';
`
	floorTx2Start = `BEGIN;
SELECT result FROM floor_idem WHERE k = :k FOR UPDATE;
SELECT state FROM floor_rsv WHERE id = :k FOR UPDATE;
UPDATE floor_rsv SET state = 'pending', updated_at = now() WHERE id = :k;
`
)

var floorScripts = map[string]string{
	"create": floorKey + floorTx1 + floorReads + floorTx2Start +
		`SELECT pg_advisory_xact_lock(hashtextextended('quota/acme/pool', 0));
INSERT INTO floor_alloc (id, rsv, node, atoms) VALUES (:k, :k, 'node', ARRAY['atom']);
INSERT INTO floor_booking (alloc, atom, during) VALUES (:k, 'atom', tstzrange(now(), now() + interval '10 minutes'));
UPDATE floor_rsv SET state = 'placed', updated_at = now() WHERE id = :k;
UPDATE floor_idem SET result = '{}', completed_at = now() WHERE k = :k;
INSERT INTO floor_audit (id, tenant, method) VALUES (:k, 'acme', 'reservations.create');
COMMIT;
BEGIN READ ONLY;
SELECT state, devices, starts_at, ends_at FROM floor_rsv WHERE id = :k;
SELECT id, node, atoms FROM floor_alloc WHERE rsv = :k;
COMMIT;
INSERT INTO floor_wf_history (id, events) VALUES (:k, decode('00', 'hex'));
INSERT INTO floor_wf (id, state) VALUES (:k, decode('00', 'hex'));
`,
	"get": `\set k random(1, 1000)
BEGIN READ ONLY;
SELECT state, devices, starts_at, ends_at, failure FROM floor_rsv WHERE id = :k AND tenant = 'acme';
SELECT id, node, atoms FROM floor_alloc WHERE rsv = :k ORDER BY node, id;
COMMIT;
`,
	"list": `BEGIN READ ONLY;
SELECT id, state, devices, starts_at, ends_at FROM floor_rsv WHERE tenant = 'acme' ORDER BY created_at, id LIMIT 500;
COMMIT;
`,
	"contention": floorKey + floorTx1 + floorReads + floorTx2Start +
		`SELECT pg_advisory_xact_lock(hashtextextended('quota/acme/contention', 0));
SELECT count(*) FROM floor_booking WHERE atom = 'atom';
ROLLBACK;
BEGIN;
SELECT state FROM floor_rsv WHERE id = :k FOR UPDATE;
UPDATE floor_rsv SET state = 'pending', updated_at = now() WHERE id = :k;
UPDATE floor_rsv SET state = 'failed', failure = '{"code":"INVALID_STATE"}', updated_at = now() WHERE id = :k;
COMMIT;
`,
}

var floorShapes = map[string]string{
	"create":     "4 write commits (2 API + 2 Temporal), 1 read-only tx, 2 reads per call",
	"get":        "1 read-only tx per call",
	"list":       "1 read-only tx of 500 rows per call",
	"contention": "2 write commits, 1 rollback, 2 reads per call (the refused path)",
}

// floorPlan is one pgbench run: for Seconds, or PerClient scripts per client.
type floorPlan struct {
	Scenario  string
	Script    string
	Shape     string
	Clients   int
	Seconds   int
	PerClient int
}

// maxFloorClients keeps the contention floor's connections well under the
// cluster's max_connections (200), which the stack also uses.
const maxFloorClients = 100

func floorPlanFor(name string, cfg config) floorPlan {
	p := floorPlan{Scenario: name, Script: floorScripts[name], Shape: floorShapes[name], Clients: cfg.clients}
	switch {
	case name == "contention":
		p.Clients = min(cfg.contentionCalls, maxFloorClients)
		p.PerClient = ceilDiv(cfg.contentionCalls, p.Clients)
	case cfg.requests > 0:
		p.PerClient = ceilDiv(cfg.requests, p.Clients)
	default:
		p.Seconds = int(math.Ceil(cfg.duration.Seconds()))
	}
	return p
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// floorResult is what a pgbench run measured.
type floorResult struct {
	Shape        string  `json:"shape"`
	Clients      int     `json:"clients"`
	Transactions int64   `json:"calls"`
	Failed       int64   `json:"failed"`
	TPS          float64 `json:"tps"`
	LatencyAvgMs float64 `json:"latencyAvgMs"`
	P50Ms        float64 `json:"p50Ms"`
	P99Ms        float64 `json:"p99Ms"`
}

// floorDatabase is the scratch database, dropped and made again each run.
const floorDatabase = "bench_floor"

type floorRunner struct {
	pgbench  string
	version  string   // the server's, for the report
	adminURL string   // the cluster's URL, to create and drop the database
	conn     *url.URL // the scratch database's
}

// newFloorRunner finds pgbench and makes the scratch database with its
// tables on the cluster dbURL points at.
func newFloorRunner(ctx context.Context, dbURL string) (*floorRunner, error) {
	bin, err := pgbenchPath()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	u.Path = "/" + floorDatabase
	f := &floorRunner{pgbench: bin, adminURL: dbURL, conn: u}
	if err := f.exec(ctx, dbURL, "DROP DATABASE IF EXISTS "+floorDatabase, "CREATE DATABASE "+floorDatabase); err != nil {
		return nil, err
	}
	if err := f.exec(ctx, u.String(), floorSetup); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&f.version); err != nil {
		return nil, err
	}
	return f, nil
}

// pgbenchPath is pgbench beside the server binaries deploy/postgres finds,
// else on PATH.
func pgbenchPath() (string, error) {
	if dir, err := postgres.BinDir(); err == nil {
		p := filepath.Join(dir, "pgbench")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("pgbench")
	if err != nil {
		return "", errors.New("pgbench not found beside the PostgreSQL binaries or on PATH")
	}
	return p, nil
}

func (f *floorRunner) exec(ctx context.Context, dbURL string, sqls ...string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, sql := range sqls {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%.40s…: %w", strings.TrimSpace(sql), err)
		}
	}
	return nil
}

func (f *floorRunner) close(ctx context.Context) {
	_ = f.exec(ctx, f.adminURL, "DROP DATABASE IF EXISTS "+floorDatabase)
}

// run runs pgbench on the plan's script with a per-transaction log, and
// reads tps and the average from its summary and p50/p99 from the log.
func (f *floorRunner) run(ctx context.Context, p floorPlan) (floorResult, error) {
	dir, err := os.MkdirTemp("", "bc-bench-floor-")
	if err != nil {
		return floorResult{}, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, p.Scenario+".sql")
	if err := os.WriteFile(script, []byte(p.Script), 0o644); err != nil {
		return floorResult{}, err
	}
	prefix := filepath.Join(dir, "log")
	args := []string{"-n", "-M", "prepared", "-f", script, "-c", strconv.Itoa(p.Clients), "-j", strconv.Itoa(p.Clients),
		"-l", "--log-prefix=" + prefix}
	if p.PerClient > 0 {
		args = append(args, "-t", strconv.Itoa(p.PerClient))
	} else {
		args = append(args, "-T", strconv.Itoa(p.Seconds))
	}
	args = append(args, connArgs(f.conn)...)
	cmd := exec.CommandContext(ctx, f.pgbench, args...)
	cmd.Env = append(os.Environ(), "PGSSLMODE="+orDefault(f.conn.Query().Get("sslmode"), "prefer"))
	if pw, ok := f.conn.User.Password(); ok {
		cmd.Env = append(cmd.Env, "PGPASSWORD="+pw)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return floorResult{}, fmt.Errorf("pgbench: %w: %s", err, errorLines(string(out), 3))
	}
	sum, err := parseSummary(string(out))
	if err != nil {
		return floorResult{}, err
	}
	lat, err := readLogs(prefix)
	if err != nil {
		return floorResult{}, err
	}
	slices.Sort(lat)
	return floorResult{Shape: p.Shape, Clients: p.Clients, Transactions: sum.transactions, Failed: sum.failed,
		TPS: sum.tps, LatencyAvgMs: sum.latencyAvgMs, P50Ms: percentile(lat, 50), P99Ms: percentile(lat, 99)}, nil
}

func orDefault(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// connArgs are pgbench's connection options for a postgres:// URL.
func connArgs(u *url.URL) []string {
	var args []string
	if h := u.Hostname(); h != "" {
		args = append(args, "-h", h)
	}
	if p := u.Port(); p != "" {
		args = append(args, "-p", p)
	}
	if n := u.User.Username(); n != "" {
		args = append(args, "-U", n)
	}
	return append(args, strings.TrimPrefix(u.Path, "/"))
}

// errorLines are the first n lines of pgbench's output that report an
// error, else its last n lines.
func errorLines(s string, n int) string {
	var errs []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "error") && len(errs) < n {
			errs = append(errs, strings.TrimSpace(l))
		}
	}
	if len(errs) == 0 {
		return lastLines(s, n)
	}
	return strings.Join(errs, " / ")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " / ")
}

// pgbenchSummary is what pgbench prints at the end of a run.
type pgbenchSummary struct {
	transactions int64
	failed       int64
	latencyAvgMs float64
	tps          float64
}

var (
	reProcessed = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
	reFailed    = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	reLatency   = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
	// PostgreSQL 14+ prints "(without initial connection time)"; older
	// ones two lines, of which "excluding connections establishing" is it.
	reTPS = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \((?:without initial connection time|excluding connections establishing)\)`)
)

// parseSummary reads pgbench's summary. A run that processed nothing is an
// error: its numbers would mean nothing.
func parseSummary(out string) (pgbenchSummary, error) {
	var s pgbenchSummary
	m := reProcessed.FindStringSubmatch(out)
	if m == nil {
		return s, fmt.Errorf("pgbench: no transaction count in its output: %s", lastLines(out, 5))
	}
	s.transactions, _ = strconv.ParseInt(m[1], 10, 64)
	if m := reFailed.FindStringSubmatch(out); m != nil {
		s.failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reLatency.FindStringSubmatch(out); m != nil {
		s.latencyAvgMs, _ = strconv.ParseFloat(m[1], 64)
	}
	m = reTPS.FindStringSubmatch(out)
	if m == nil {
		return s, fmt.Errorf("pgbench: no tps in its output: %s", lastLines(out, 5))
	}
	s.tps, _ = strconv.ParseFloat(m[1], 64)
	if s.transactions == 0 {
		return s, errors.New("pgbench processed no transactions")
	}
	return s, nil
}

// readLogs reads the per-transaction logs pgbench wrote under prefix (one
// file per thread: prefix.<pid> and prefix.<pid>.<n>).
func readLogs(prefix string) ([]float64, error) {
	files, err := filepath.Glob(prefix + ".*")
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("pgbench wrote no log under %s", prefix)
	}
	var all []float64
	for _, name := range files {
		fh, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		lat, err := parseLog(fh)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		all = append(all, lat...)
	}
	return all, nil
}

// parseLog reads a pgbench per-transaction log, lines of
// "client_id transaction_no time script_no time_epoch time_us [...]" with
// time the latency in microseconds, and returns the latencies in
// milliseconds. Failed and skipped transactions ("failed", "skipped" in
// place of the time) are left out.
func parseLog(r io.Reader) ([]float64, error) {
	var out []float64
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 6 {
			return nil, fmt.Errorf("line %d: %d fields, want at least 6", n, len(f))
		}
		us, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			if f[2] == "failed" || f[2] == "skipped" {
				continue
			}
			return nil, fmt.Errorf("line %d: latency %q: %w", n, f[2], err)
		}
		out = append(out, float64(us)/1000)
	}
	return out, sc.Err()
}

// noFloorReason says why a scenario has no floor script.
func noFloorReason(name string) string {
	switch name {
	case "gin":
		return "none: gin is itself get's yardstick (get's ratio gin tps)"
	case "activate":
		return "none: create -> active waits on the workflow, not on commits (compare it with -compare)"
	case "capacity":
		return "none: its goal is a p50"
	case "agents":
		return "none: agentload measures the API process's CPU and memory"
	}
	return "no floor script for " + name
}
