package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

func TestCommandsRunAndRead(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{"hardwareProfile":"8xH100"}`)
	n := e.node(schedulableNode(p.ID, "gpu-a07"), fixture(t, "h100-8x-sxm.json"))

	// exec: queued with seq 1, the args as stored.
	notAfter := time.Now().Add(time.Hour).UnixMilli()
	gen := int64(3)
	run, err := nodes.RunCommand.Call(ctx, c, nodes.RunCommandInput{TenantID: "acme", NodeID: n.ID, Kind: protocol.CommandExec,
		Args:     json.RawMessage(`{"argv":["nvidia-smi","-L"],"timeoutSeconds":30,"env":{"LC_ALL":"C"}}`),
		NotAfter: new(notAfter), MinGeneration: &gen})
	if err != nil || !core.ValidID("cmd", run.ID) || run.Seq != 1 || run.State != "queued" || run.NodeID != n.ID ||
		run.TenantID != "acme" || run.Kind != "exec" || run.NotAfter == nil || *run.NotAfter != notAfter || run.NotBefore != nil ||
		run.MinGeneration == nil || *run.MinGeneration != 3 || run.CreatedBy != e.boot.UserIdentityID || run.FinishedAt != nil {
		t.Fatalf("run = %+v, %v", run, err)
	}
	var args nodes.ExecArgs
	if err := json.Unmarshal(run.Args, &args); err != nil || strings.Join(args.Argv, " ") != "nvidia-smi -L" ||
		args.TimeoutSeconds != 30 || args.Env["LC_ALL"] != "C" {
		t.Fatalf("args = %s, %v", run.Args, err)
	}
	if e.count(`SELECT count(*) FROM audit_events WHERE method = 'commands.run' AND resource_id = $1 AND action = 'compute:nodes:exec'`, n.ID) != 1 {
		t.Fatal("no audit row for commands.run")
	}

	// Every other kind; cdi.expose's device ids become GPU indices.
	gpus := e.gpuAtoms(n.ID)
	var index int
	if err := e.store.Pool.QueryRow(ctx, `SELECT (attributes->>'index')::int FROM devices WHERE node_id = $1 AND device_id = $2`,
		n.ID, gpus[0]).Scan(&index); err != nil {
		t.Fatal(err)
	}
	rsv := core.NewID("rsv")
	expose, err := nodes.RunCommand.Call(ctx, c, nodes.RunCommandInput{TenantID: "acme", NodeID: n.ID, Kind: protocol.CommandCDIExpose,
		Args: json.RawMessage(fmt.Sprintf(`{"reservationId":%q,"devices":[%q, 7]}`, rsv, gpus[0]))})
	if err != nil || expose.Seq != 2 {
		t.Fatalf("cdi.expose = %+v, %v", expose, err)
	}
	var cdi nodes.CDIExposeArgs
	if err := json.Unmarshal(expose.Args, &cdi); err != nil || cdi.ReservationID != rsv || len(cdi.Devices) != 2 ||
		cdi.Devices[0] != index || cdi.Devices[1] != 7 || cdi.Kind != "" {
		t.Fatalf("cdi.expose args = %s, %v (GPU %s is index %d)", expose.Args, err, gpus[0], index)
	}
	for i, in := range []nodes.RunCommandInput{
		{Kind: protocol.CommandCDIWithdraw, Args: json.RawMessage(`{"reservationId":"` + rsv + `"}`)},
		{Kind: protocol.CommandInventoryRefresh},
		{Kind: protocol.CommandReboot, Args: json.RawMessage(`{}`), NotBefore: new(int64(time.Now().Add(time.Minute).UnixMilli()))},
	} {
		in.TenantID, in.NodeID = "acme", n.ID
		got, err := nodes.RunCommand.Call(ctx, c, in)
		if err != nil || got.Seq != int64(3+i) || got.Kind != string(in.Kind) || string(got.Args) != "{}" && in.Kind != protocol.CommandCDIWithdraw {
			t.Fatalf("run %s = %+v, %v", in.Kind, got, err)
		}
	}

	// An idempotency key: the retry answers the same command; the key
	// with another request is CONFLICT.
	keyed := nodes.RunCommandInput{TenantID: "acme", NodeID: n.ID, Kind: protocol.CommandExec,
		Args: json.RawMessage(`{"argv":["true"]}`), IdempotencyKey: "retry-1"}
	first, err := nodes.RunCommand.Call(ctx, c, keyed)
	if err != nil {
		t.Fatal(err)
	}
	again, err := nodes.RunCommand.Call(ctx, c, keyed)
	if err != nil || again.ID != first.ID || again.Seq != first.Seq || first.Seq != 6 {
		t.Fatalf("retry = %+v, %v; first %+v", again, err, first)
	}
	keyed.Args = json.RawMessage(`{"argv":["false"]}`)
	if _, err := nodes.RunCommand.Call(ctx, c, keyed); codeOf(err) != core.CodeConflict {
		t.Fatalf("key reused with other args = %v, want CONFLICT", err)
	}

	// get and list (newest first, by state, limited).
	got, err := nodes.GetCommand.Call(ctx, c, nodes.CommandInput{TenantID: "acme", NodeID: n.ID, CommandID: run.ID})
	if err != nil || got.ID != run.ID || got.Seq != 1 || string(got.Args) != string(run.Args) {
		t.Fatalf("get = %+v, %v", got, err)
	}
	list, err := nodes.ListCommands.Call(ctx, c, nodes.ListCommandsInput{TenantID: "acme", NodeID: n.ID})
	if err != nil || len(list.Items) != 6 || list.Items[0].Seq != 6 || list.Items[5].Seq != 1 {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if list, err := nodes.ListCommands.Call(ctx, c, nodes.ListCommandsInput{TenantID: "acme", NodeID: n.ID, State: "queued", ListInput: rpc.ListInput{Limit: 2}}); err != nil ||
		len(list.Items) != 2 || list.Items[0].Seq != 6 {
		t.Fatalf("list queued, limit 2 = %+v, %v", list, err)
	}
	if _, err := nodes.GetCommand.Call(ctx, c, nodes.CommandInput{TenantID: "acme", NodeID: n.ID, CommandID: core.NewID("cmd")}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("get unknown = %v", err)
	}

	// Another tenant's node, or a deleted one, is NOT_FOUND.
	g := e.client(e.globex)
	if _, err := nodes.RunCommand.Call(ctx, g, nodes.RunCommandInput{TenantID: "globex", NodeID: n.ID, Kind: protocol.CommandReboot}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("run on another tenant's node = %v", err)
	}
	if _, err := nodes.GetCommand.Call(ctx, g, nodes.CommandInput{TenantID: "globex", NodeID: n.ID, CommandID: run.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("get of another tenant's command = %v", err)
	}
	if _, err := nodes.Cordon.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.Delete.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.ListCommands.Call(ctx, c, nodes.ListCommandsInput{TenantID: "acme", NodeID: n.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("list of a deleted node = %v", err)
	}
	if _, err := nodes.RunCommand.Call(ctx, c, nodes.RunCommandInput{TenantID: "acme", NodeID: n.ID, Kind: protocol.CommandReboot}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("run on a deleted node = %v", err)
	}
}

func TestCommandsValidation(t *testing.T) {
	e := newEnv(t)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{"hardwareProfile":"8xH100"}`)
	n := e.node(schedulableNode(p.ID, "gpu-a07"), fixture(t, "h100-8x-sxm.json"))
	rsv := core.NewID("rsv")
	body := func(kind, args string, more ...string) string {
		b := `{"tenantId":"acme","nodeId":"` + n.ID + `","kind":"` + kind + `"`
		if args != "" {
			b += `,"args":` + args
		}
		for _, m := range more {
			b += "," + m
		}
		return b + "}"
	}
	past := fmt.Sprint(time.Now().Add(-time.Minute).UnixMilli())
	soon := fmt.Sprint(time.Now().Add(time.Minute).UnixMilli())
	e.wantInvalid(e.boot.UserToken, "commands.run", map[string]string{
		body("shell", `{}`):                                                                         "kind",
		body("exec", `[]`):                                                                          "args",
		body("exec", `{}`):                                                                          "args.argv",
		body("exec", `{"argv":[]}`):                                                                 "args.argv",
		body("exec", `{"argv":[""]}`):                                                               "args.argv",
		body("exec", `{"argv":"ls"}`):                                                               "args.argv",
		body("exec", `{"argv":[1]}`):                                                                "args.argv",
		body("exec", `{"argv":["ls"],"timeoutSeconds":3601}`):                                       "args.timeoutSeconds",
		body("exec", `{"argv":["ls"],"timeoutSeconds":0}`):                                          "args.timeoutSeconds",
		body("exec", `{"argv":["ls"],"timeoutSeconds":1.5}`):                                        "args.timeoutSeconds",
		body("exec", `{"argv":["ls"],"env":{"A=B":"c"}}`):                                           "args.env",
		body("exec", `{"argv":["ls"],"env":{"A":1}}`):                                               "args.env",
		body("exec", `{"argv":["ls"],"shell":true}`):                                                "args.shell",
		body("exec", `{"ARGV":["ls"]}`):                                                             "args.ARGV",
		body("cdi.expose", `{"devices":[0]}`):                                                       "args.reservationId",
		body("cdi.expose", `{"reservationId":"r1","devices":[0]}`):                                  "args.reservationId",
		body("cdi.expose", `{"reservationId":"`+rsv+`"}`):                                           "args.devices",
		body("cdi.expose", `{"reservationId":"`+rsv+`","devices":[]}`):                              "args.devices",
		body("cdi.expose", `{"reservationId":"`+rsv+`","devices":[-1]}`):                            "args.devices",
		body("cdi.expose", `{"reservationId":"`+rsv+`","devices":["GPU-nope"]}`):                    "args.devices",
		body("cdi.expose", `{"reservationId":"`+rsv+`","devices":[1,1]}`):                           "args.devices",
		body("cdi.expose", `{"reservationId":"`+rsv+`","devices":[0],"kind":"gpu"}`):                "args.kind",
		body("cdi.withdraw", `{}`):                                                                  "args.reservationId",
		body("inventory.refresh", `{"full":true}`):                                                  "args.full",
		body("reboot", `{"force":true}`):                                                            "args.force",
		body("reboot", "", `"notAfter":`+past):                                                      "notAfter",
		body("reboot", "", `"notBefore":`+soon, `"notAfter":`+soon):                                 "notAfter",
		body("reboot", "", `"minGeneration":-1`):                                                    "minGeneration",
		body("reboot", "", `"notBefore":`+fmt.Sprint(time.Now().Add(400*24*time.Hour).UnixMilli())): "notBefore",
	})
	e.wantInvalid(e.boot.UserToken, "commands.list", map[string]string{
		`{"tenantId":"acme","nodeId":"` + n.ID + `","limit":0}`:       "limit",
		`{"tenantId":"acme","nodeId":"` + n.ID + `","state":"done"}`:  "state",
		`{"tenantId":"acme","nodeId":"` + n.ID + `","commandId":"x"}`: "commandId",
		`{"tenantId":"acme","limit":5}`:                               "nodeId",
	})
	// No command was queued by any of them.
	if got := e.count(`SELECT count(*) FROM node_commands WHERE node_id = $1`, n.ID); got != 0 {
		t.Fatalf("%d commands queued by invalid requests", got)
	}
	// A caller with no policy may not run commands.
	status, out := e.call(e.stranger, "commands.run", body("reboot", ""))
	if status != 403 || !strings.Contains(out, "ACCESS_DENIED") {
		t.Fatalf("stranger's run = %d %s", status, out)
	}
}

func TestCommandsCancel(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{"hardwareProfile":"8xH100"}`)
	n := e.node(schedulableNode(p.ID, "gpu-a07"), nil)
	mk := func() nodes.Command {
		t.Helper()
		cmd, err := nodes.RunCommand.Call(ctx, c, nodes.RunCommandInput{TenantID: "acme", NodeID: n.ID, Kind: protocol.CommandInventoryRefresh})
		if err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	queued, delivered, finished := mk(), mk(), mk()
	err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if err := store.MarkNodeCommandsDelivered(ctx, tx, n.ID, []int64{delivered.Seq, finished.Seq}); err != nil {
			return err
		}
		return store.RecordNodeCommandResult(ctx, tx, n.ID, finished.Seq, store.NodeCommandResult{State: store.CommandSucceeded})
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := nodes.CancelCommand.Call(ctx, c, nodes.CommandInput{TenantID: "acme", NodeID: n.ID, CommandID: queued.ID})
	if err != nil || got.State != "cancelled" || got.FinishedAt == nil || got.CancelRequestedAt != nil {
		t.Fatalf("cancel queued = %+v, %v", got, err)
	}
	got, err = nodes.CancelCommand.Call(ctx, c, nodes.CommandInput{TenantID: "acme", NodeID: n.ID, CommandID: delivered.ID})
	if err != nil || got.State != "cancelled" || got.CancelRequestedAt == nil || got.DeliveredAt == nil {
		t.Fatalf("cancel delivered = %+v, %v", got, err)
	}
	if again, err := nodes.CancelCommand.Call(ctx, c, nodes.CommandInput{TenantID: "acme", NodeID: n.ID, CommandID: delivered.ID}); err != nil || *again.CancelRequestedAt != *got.CancelRequestedAt {
		t.Fatalf("cancel again = %+v, %v", again, err)
	}
	if _, err := nodes.CancelCommand.Call(ctx, c, nodes.CommandInput{TenantID: "acme", NodeID: n.ID, CommandID: finished.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("cancel finished = %v, want INVALID_STATE", err)
	}
	if _, err := nodes.CancelCommand.Call(ctx, e.client(e.globex), nodes.CommandInput{TenantID: "globex", NodeID: n.ID, CommandID: queued.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("cancel by another tenant = %v", err)
	}
	list, err := nodes.ListCommands.Call(ctx, c, nodes.ListCommandsInput{TenantID: "acme", NodeID: n.ID, State: "cancelled"})
	if err != nil || len(list.Items) != 2 {
		t.Fatalf("cancelled = %+v, %v", list, err)
	}
}
