package nodes

import (
	"context"
	"encoding/json"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// The commands' types, as the methods answer and take them.
type (
	Command         = domain.Command
	ExecArgs        = domain.ExecArgs
	CDIExposeArgs   = domain.CDIExposeArgs
	CDIWithdrawArgs = domain.CDIWithdrawArgs
)

// CommandList is commands.list's answer, newest (highest seq) first.
type CommandList struct {
	Items      []Command `json:"items"`
	NextCursor string    `json:"nextCursor,omitempty"`
}

// RunCommandInput is commands.run's input. Args are the kind's (ExecArgs,
// CDIExposeArgs with device ids or indices, CDIWithdrawArgs, none for
// inventory.refresh and reboot), checked by the domain per kind; notBefore
// and notAfter are epoch milliseconds, within a year, notAfter in the
// future and after notBefore. With an idempotencyKey, a retry answers the
// command that key queued; the key with another request is CONFLICT.
type RunCommandInput struct {
	TenantID       string               `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID         string               `json:"nodeId" jsonschema:"required" id:"node"`
	Kind           protocol.CommandKind `json:"kind" jsonschema:"required"`
	Args           json.RawMessage      `json:"args,omitempty" jsonschema:"type=object" maxBytes:"65536"`
	NotBefore      *int64               `json:"notBefore,omitempty" jsonschema:"minimum=0" unit:"epoch-ms"`
	NotAfter       *int64               `json:"notAfter,omitempty" jsonschema:"minimum=0" unit:"epoch-ms"`
	MinGeneration  *int64               `json:"minGeneration,omitempty" jsonschema:"minimum=0"`
	IdempotencyKey string               `json:"idempotencyKey,omitempty" id:"tenant"`
}

// CommandInput names one command of a node.
type CommandInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID    string `json:"nodeId" jsonschema:"required" id:"node"`
	CommandID string `json:"commandId" jsonschema:"required" id:"cmd"`
}

// ListCommandsInput is commands.list's input: in state when given, a page
// of them.
type ListCommandsInput struct {
	TenantID string                `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string                `json:"nodeId" jsonschema:"required" id:"node"`
	State    protocol.CommandState `json:"state,omitempty"`
	rpc.ListInput
}

// The commands.* methods.
const (
	RunCommand    rpc.Ref[RunCommandInput, Command]       = "commands.run"
	GetCommand    rpc.Ref[CommandInput, Command]          = "commands.get"
	ListCommands  rpc.Ref[ListCommandsInput, CommandList] = "commands.list"
	CancelCommand rpc.Ref[CommandInput, Command]          = "commands.cancel"
)

func (m methods) commands() []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[RunCommandInput, Command]{Name: RunCommand, Action: "compute:nodes:exec", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in RunCommandInput) (Command, error) {
				return domain.RunCommand(ctx, tx, c.TenantID, in.NodeID, domain.NewCommand{Kind: string(in.Kind), Args: in.Args,
					NotBefore: in.NotBefore, NotAfter: in.NotAfter, MinGeneration: in.MinGeneration,
					IdempotencyKey: in.IdempotencyKey, CreatedBy: c.Caller.IdentityID})
			}},
		&rpc.Method[CommandInput, Command]{Name: GetCommand, Action: "compute:nodes:read", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CommandInput) (Command, error) {
				return domain.GetCommand(ctx, tx, c.TenantID, in.NodeID, in.CommandID)
			}},
		&rpc.Method[ListCommandsInput, CommandList]{Name: ListCommands, Action: "compute:nodes:read", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindRead,
			// Newest first: by the node's command seq, descending.
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListCommandsInput) (CommandList, error) {
				q, err := in.Page()
				if err != nil {
					return CommandList{}, err
				}
				read, err := domain.ListCommands(ctx, tx, c.TenantID, in.NodeID, string(in.State), q)
				items, next := rpc.Paged(read, q, func(cmd Command) store.Key { return store.Key{Seq: cmd.Seq} })
				return CommandList{Items: items, NextCursor: next}, err
			}},
		// A delivered or running command is recorded cancelled and its
		// agent told to stop it; a finished one is INVALID_STATE.
		&rpc.Method[CommandInput, Command]{Name: CancelCommand, Action: "compute:nodes:exec", DecidedOn: "compute-node",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CommandInput) (Command, error) {
				return domain.CancelCommand(ctx, tx, c.TenantID, in.NodeID, in.CommandID)
			}},
	}
}
