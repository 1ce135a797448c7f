package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

// commandPool inserts a site and a bcd pool of tenant and returns the pool's id.
func commandPool(t *testing.T, s *store.Store, tenant string) string {
	t.Helper()
	ctx := context.Background()
	site, pool := core.NewID("site"), core.NewID("pool")
	if _, err := s.Pool.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, $2, $1, 'eu', 'eu-west', 'custom', 'idn_x')`, site, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
		VALUES ($1, $2, $3, $1, 'metal-host', 'H100', 80, 'bcd', 'idn_x')`, pool, tenant, site); err != nil {
		t.Fatal(err)
	}
	return pool
}

// commandNode inserts a live node of tenant in a new bcd pool.
func commandNode(t *testing.T, s *store.Store, tenant string) string {
	t.Helper()
	id := core.NewID("node")
	if _, err := s.Pool.Exec(context.Background(), `INSERT INTO nodes (id, tenant_id, pool_id, name) VALUES ($1, $2, $3, $1)`,
		id, tenant, commandPool(t, s, tenant)); err != nil {
		t.Fatal(err)
	}
	return id
}

func inTx[T any](t *testing.T, s *store.Store, fn func(ctx context.Context, tx store.Tx) (T, error)) (T, error) {
	t.Helper()
	var out T
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		out, err = fn(context.Background(), tx)
		return err
	})
	return out, err
}

func queue(t *testing.T, s *store.Store, c store.NodeCommand, key string) store.NodeCommand {
	t.Helper()
	got, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (store.NodeCommand, error) {
		return store.QueueNodeCommand(ctx, tx, c, key)
	})
	if err != nil {
		t.Fatalf("queue %+v: %v", c, err)
	}
	return got
}

func pending(t *testing.T, s *store.Store, node string, after int64) []int64 {
	t.Helper()
	cmds, err := inTx(t, s, func(ctx context.Context, tx store.Tx) ([]store.NodeCommand, error) {
		return store.PendingNodeCommands(ctx, tx, node, after, 100)
	})
	if err != nil {
		t.Fatal(err)
	}
	seqs := []int64{}
	for _, c := range cmds {
		seqs = append(seqs, c.Seq)
	}
	return seqs
}

func equalSeqs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestNodeCommandQueue(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	node, other := commandNode(t, s, "acme"), commandNode(t, s, "acme")
	base := store.NodeCommand{NodeID: node, TenantID: "acme", Kind: store.CommandExec, CreatedBy: "idn_x",
		Args: json.RawMessage(`{"argv":["true"]}`)}

	// Seqs are per node, from 1, gap-free.
	a := queue(t, s, base, "")
	b := queue(t, s, base, "k1")
	o := queue(t, s, store.NodeCommand{NodeID: other, TenantID: "acme", Kind: store.CommandReboot, CreatedBy: "idn_x"}, "")
	if a.Seq != 1 || b.Seq != 2 || o.Seq != 1 || !core.ValidID("cmd", a.ID) || a.ID == b.ID || a.State != store.CommandQueued ||
		a.TenantID != "acme" || a.CreatedBy != "idn_x" || string(o.Args) != `{}` || a.CreatedAt.IsZero() || a.FinishedAt != nil {
		t.Fatalf("queued %+v, %+v, %+v", a, b, o)
	}
	var args map[string][]string
	if err := json.Unmarshal(a.Args, &args); err != nil || args["argv"][0] != "true" {
		t.Fatalf("args %s: %v", a.Args, err)
	}
	// The same key answers the existing command and takes no seq.
	if again := queue(t, s, base, "k1"); again.ID != b.ID || again.Seq != 2 {
		t.Fatalf("same key = %+v, want %s", again, b.ID)
	}
	if c := queue(t, s, base, ""); c.Seq != 3 {
		t.Fatalf("next seq = %d, want 3", c.Seq)
	}
	// A deleted or unknown node takes no command.
	if _, err := s.Pool.Exec(ctx, `UPDATE nodes SET deleted_at = now() WHERE id = $1`, other); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{other, core.NewID("node")} {
		_, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (store.NodeCommand, error) {
			c := base
			c.NodeID = id
			return store.QueueNodeCommand(ctx, tx, c, "")
		})
		if !strings.Contains(errString(err), "not found") {
			t.Fatalf("queue on %s = %v, want NOT_FOUND", id, err)
		}
	}
	// The table refuses a bad kind and non-object args.
	for _, c := range []store.NodeCommand{{Kind: "shell"}, {Kind: store.CommandExec, Args: json.RawMessage(`[1]`)}} {
		c.NodeID, c.TenantID, c.CreatedBy = node, "acme", "idn_x"
		if _, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (store.NodeCommand, error) {
			return store.QueueNodeCommand(ctx, tx, c, "")
		}); err == nil {
			t.Fatalf("queued %+v", c)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestNodeCommandConcurrentSeqs(t *testing.T) {
	s := testenv.Store(t)
	node := commandNode(t, s, "acme")
	const n = 16
	var wg sync.WaitGroup
	seqs := make(chan int64, n)
	ids := make(chan string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := ""
			if i%2 == 0 {
				key = "same"
			}
			c, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (store.NodeCommand, error) {
				return store.QueueNodeCommand(ctx, tx, store.NodeCommand{NodeID: node, TenantID: "acme",
					Kind: store.CommandInventoryRefresh, CreatedBy: "idn_x"}, key)
			})
			if err != nil {
				t.Error(err)
				return
			}
			if key != "" {
				ids <- c.ID
			} else {
				seqs <- c.Seq
			}
		}()
	}
	wg.Wait()
	close(seqs)
	close(ids)
	var keyed string
	for id := range ids {
		if keyed != "" && id != keyed {
			t.Fatalf("one key made two commands: %s, %s", keyed, id)
		}
		keyed = id
	}
	var rows, max int64
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*), max(seq) FROM node_commands WHERE node_id = $1`, node).Scan(&rows, &max); err != nil {
		t.Fatal(err)
	}
	if rows != n/2+1 || max != rows {
		t.Fatalf("%d commands, max seq %d; want %d, gap-free", rows, max, n/2+1)
	}
}

func TestNodeCommandDelivery(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	node := commandNode(t, s, "acme")
	past, future := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	mk := func(nb, na *time.Time) store.NodeCommand {
		return queue(t, s, store.NodeCommand{NodeID: node, TenantID: "acme", Kind: store.CommandInventoryRefresh,
			CreatedBy: "idn_x", NotBefore: nb, NotAfter: na}, "")
	}
	c1 := mk(nil, nil)
	c2 := mk(&past, &future) // in its window
	c3 := mk(&future, nil)   // not yet
	c4 := mk(nil, &future)   // expires below
	c5 := mk(nil, nil)
	if got := pending(t, s, node, 0); !equalSeqs(got, []int64{c1.Seq, c2.Seq, c4.Seq, c5.Seq}) {
		t.Fatalf("pending = %v", got)
	}
	if got := pending(t, s, node, c2.Seq); !equalSeqs(got, []int64{c4.Seq, c5.Seq}) {
		t.Fatalf("pending after %d = %v", c2.Seq, got)
	}
	if _, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (any, error) {
		return nil, store.MarkNodeCommandsDelivered(ctx, tx, node, []int64{c1.Seq, c4.Seq})
	}); err != nil {
		t.Fatal(err)
	}
	get := func(id string) store.NodeCommand {
		t.Helper()
		c, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (store.NodeCommand, error) {
			return store.GetNodeCommand(ctx, tx, "acme", node, id)
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	d1 := get(c1.ID)
	if d1.State != store.CommandDelivered || d1.DeliveredAt == nil {
		t.Fatalf("delivered = %+v", d1)
	}
	// Delivered commands are delivered again (at least once).
	if got := pending(t, s, node, 0); !equalSeqs(got, []int64{c1.Seq, c2.Seq, c4.Seq, c5.Seq}) {
		t.Fatalf("pending after delivery = %v", got)
	}
	// Past not_after: expired, never returned, whether queued or delivered.
	if _, err := s.Pool.Exec(ctx, `UPDATE node_commands SET not_after = now() - interval '1 second' WHERE node_id = $1 AND seq IN ($2, $3)`,
		node, c4.Seq, c5.Seq); err != nil {
		t.Fatal(err)
	}
	if got := pending(t, s, node, 0); !equalSeqs(got, []int64{c1.Seq, c2.Seq}) {
		t.Fatalf("pending after expiry = %v", got)
	}
	if g := get(c5.ID); g.State != store.CommandExpired || g.FinishedAt == nil {
		t.Fatalf("expired = %+v", g)
	}
	// The delivered, then expired c4 still takes the agent's result.
	if err := recordResult(s, node, c4.Seq, store.NodeCommandResult{State: store.CommandSkipped, Error: "expired"}); err != nil {
		t.Fatal(err)
	}
	if g := get(c4.ID); g.State != store.CommandSkipped || g.Error != "expired" {
		t.Fatalf("expired after delivery, then result = %+v", g)
	}
	// c3 comes when its time does.
	if _, err := s.Pool.Exec(ctx, `UPDATE node_commands SET not_before = now() WHERE node_id = $1 AND seq = $2`, node, c3.Seq); err != nil {
		t.Fatal(err)
	}
	if got := pending(t, s, node, 0); !equalSeqs(got, []int64{c1.Seq, c2.Seq, c3.Seq}) {
		t.Fatalf("pending once c3 is due = %v", got)
	}
}

func recordResult(s *store.Store, node string, seq int64, r store.NodeCommandResult) error {
	return s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		return store.RecordNodeCommandResult(context.Background(), tx, node, seq, r)
	})
}

func TestNodeCommandResults(t *testing.T) {
	s := testenv.Store(t)
	node := commandNode(t, s, "acme")
	c := queue(t, s, store.NodeCommand{NodeID: node, TenantID: "acme", Kind: store.CommandExec, CreatedBy: "idn_x",
		Args: json.RawMessage(`{"argv":["x"]}`)}, "")
	zero, one := 0, 1
	// Long output is cut to the limit at a character boundary; NUL and bad
	// UTF-8 become U+FFFD.
	long := strings.Repeat("é", store.MaxCommandOutput) // 2 bytes each
	if err := recordResult(s, node, c.Seq, store.NodeCommandResult{State: store.CommandSucceeded, ExitCode: &zero,
		Stdout: long, Stderr: "a\x00b\xffc", Error: strings.Repeat("e", 10000)}); err != nil {
		t.Fatal(err)
	}
	got, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (store.NodeCommand, error) {
		return store.GetNodeCommand(ctx, tx, "acme", node, c.ID)
	})
	if err != nil || got.State != store.CommandSucceeded || got.ExitCode == nil || *got.ExitCode != 0 || !got.Truncated ||
		len(got.Stdout) != store.MaxCommandOutput || !utf8.ValidString(got.Stdout) || got.Stderr != "a\uFFFDb\uFFFDc" ||
		len(got.Error) != store.MaxCommandError || got.FinishedAt == nil {
		t.Fatalf("result = state %s exit %v truncated %v stdout %d stderr %q error %d, %v", got.State, got.ExitCode,
			got.Truncated, len(got.Stdout), got.Stderr, len(got.Error), err)
	}
	// The first result wins: a second one changes nothing and is no error.
	if err := recordResult(s, node, c.Seq, store.NodeCommandResult{State: store.CommandFailed, ExitCode: &one}); err != nil {
		t.Fatal(err)
	}
	again, _ := inTx(t, s, func(ctx context.Context, tx store.Tx) (store.NodeCommand, error) {
		return store.GetNodeCommand(ctx, tx, "acme", node, c.ID)
	})
	if again.State != store.CommandSucceeded || *again.ExitCode != 0 || !again.FinishedAt.Equal(*got.FinishedAt) {
		t.Fatalf("after a second result = %+v", again)
	}
	if err := recordResult(s, node, 99, store.NodeCommandResult{State: store.CommandSucceeded}); !strings.Contains(errString(err), "no command") {
		t.Fatalf("unknown seq = %v", err)
	}
	if err := recordResult(s, node, c.Seq, store.NodeCommandResult{State: "cancelled"}); err == nil {
		t.Fatal("a result may not be cancelled")
	}
}

func TestNodeCommandCancelAndList(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	node := commandNode(t, s, "acme")
	mk := func() store.NodeCommand {
		return queue(t, s, store.NodeCommand{NodeID: node, TenantID: "acme", Kind: store.CommandReboot, CreatedBy: "idn_x"}, "")
	}
	cancel := func(tenant, id string) (store.NodeCommand, error) {
		return inTx(t, s, func(ctx context.Context, tx store.Tx) (store.NodeCommand, error) {
			return store.CancelNodeCommand(ctx, tx, tenant, node, id)
		})
	}
	queued, delivered, done := mk(), mk(), mk()
	if _, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (any, error) {
		return nil, store.MarkNodeCommandsDelivered(ctx, tx, node, []int64{delivered.Seq, done.Seq})
	}); err != nil {
		t.Fatal(err)
	}
	if err := recordResult(s, node, done.Seq, store.NodeCommandResult{State: store.CommandSucceeded}); err != nil {
		t.Fatal(err)
	}

	// The trigger notifies on cancellation (and on insert).
	conn, err := s.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN `+store.NodeCommandsChannel); err != nil {
		t.Fatal(err)
	}

	c, err := cancel("acme", queued.ID)
	if err != nil || c.State != store.CommandCancelled || c.FinishedAt == nil || c.CancelRequestedAt != nil {
		t.Fatalf("cancel queued = %+v, %v", c, err)
	}
	c, err = cancel("acme", delivered.ID)
	if err != nil || c.State != store.CommandCancelled || c.FinishedAt != nil || c.CancelRequestedAt == nil {
		t.Fatalf("cancel delivered = %+v, %v", c, err)
	}
	wait, stop := context.WithTimeout(ctx, 5*time.Second)
	defer stop()
	if n, err := conn.Conn().WaitForNotification(wait); err != nil || n.Payload != node || n.Channel != store.NodeCommandsChannel {
		t.Fatalf("notification = %+v, %v", n, err)
	}
	if seqs, err := inTx(t, s, func(ctx context.Context, tx store.Tx) ([]int64, error) {
		return store.CancelRequestedNodeCommands(ctx, tx, node)
	}); err != nil || !equalSeqs(seqs, []int64{delivered.Seq}) {
		t.Fatalf("cancel requested = %v, %v", seqs, err)
	}
	// Again: unchanged. Finished: INVALID_STATE. Another tenant: NOT_FOUND.
	if c2, err := cancel("acme", delivered.ID); err != nil || !c2.CancelRequestedAt.Equal(*c.CancelRequestedAt) {
		t.Fatalf("cancel again = %+v, %v", c2, err)
	}
	if _, err := cancel("acme", done.ID); core.AsError(err).Code != core.CodeInvalidState {
		t.Fatalf("cancel finished = %v", err)
	}
	if _, err := cancel("globex", queued.ID); core.AsError(err).Code != core.CodeNotFound {
		t.Fatalf("cancel of another tenant = %v", err)
	}
	// The agent's result after a cancel: recorded, still cancelled.
	one := 137
	if err := recordResult(s, node, delivered.Seq, store.NodeCommandResult{State: store.CommandFailed, ExitCode: &one, Stderr: "killed"}); err != nil {
		t.Fatal(err)
	}
	got, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (store.NodeCommand, error) {
		return store.GetNodeCommand(ctx, tx, "acme", node, delivered.ID)
	})
	if err != nil || got.State != store.CommandCancelled || got.ExitCode == nil || *got.ExitCode != 137 || got.Stderr != "killed" || got.FinishedAt == nil {
		t.Fatalf("result after cancel = %+v, %v", got, err)
	}
	if seqs, _ := inTx(t, s, func(ctx context.Context, tx store.Tx) ([]int64, error) {
		return store.CancelRequestedNodeCommands(ctx, tx, node)
	}); len(seqs) != 0 {
		t.Fatalf("cancel still requested for %v", seqs)
	}
	// A cancelled queued command is never delivered, nor is its late result taken.
	if got := pending(t, s, node, 0); len(got) != 0 {
		t.Fatalf("pending = %v", got)
	}

	list := func(tenant, state string, limit int) []int64 {
		t.Helper()
		cmds, err := inTx(t, s, func(ctx context.Context, tx store.Tx) ([]store.NodeCommand, error) {
			return store.ListNodeCommands(ctx, tx, tenant, node, state, store.PageQuery{Limit: limit})
		})
		cmds = cmds[:min(len(cmds), limit)] // a page's rows read one past the page
		if err != nil {
			t.Fatal(err)
		}
		seqs := []int64{}
		for _, c := range cmds {
			seqs = append(seqs, c.Seq)
		}
		return seqs
	}
	if got := list("acme", "", 10); !equalSeqs(got, []int64{3, 2, 1}) {
		t.Fatalf("list = %v", got)
	}
	if got := list("acme", store.CommandCancelled, 1); !equalSeqs(got, []int64{2}) {
		t.Fatalf("list cancelled, limit 1 = %v", got)
	}
	if got := list("globex", "", 10); len(got) != 0 {
		t.Fatalf("another tenant's list = %v", got)
	}
	if _, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (store.NodeCommand, error) {
		return store.GetNodeCommand(ctx, tx, "acme", node, core.NewID("cmd"))
	}); core.AsError(err).Code != core.CodeNotFound {
		t.Fatalf("get unknown = %v", err)
	}
}
