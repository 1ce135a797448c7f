package api

import (
	"context"
	"encoding/json"
)

// CommandsRunInput is commands.run's input. Args are the kind's (ExecArgs,
// CDIExposeArgs with device ids or indices, CDIWithdrawArgs, none for
// inventory.refresh and reboot); NotBefore and NotAfter are epoch
// milliseconds (0: none).
type CommandsRunInput struct {
	TenantID       string          `json:"tenantId"`
	NodeID         string          `json:"nodeId"`
	Kind           string          `json:"kind"`
	Args           json.RawMessage `json:"args,omitempty"`
	NotBefore      int64           `json:"notBefore,omitempty"`
	NotAfter       int64           `json:"notAfter,omitempty"`
	MinGeneration  *int64          `json:"minGeneration,omitempty"`
	IdempotencyKey string          `json:"idempotencyKey,omitempty"`
}

// CommandsRun calls commands.run: the command, queued.
func (c *Client) CommandsRun(ctx context.Context, in CommandsRunInput) (Command, error) {
	var out Command
	return out, c.Call(ctx, "commands.run", in, &out)
}

// CommandsGet calls commands.get.
func (c *Client) CommandsGet(ctx context.Context, tenantID, nodeID, commandID string) (Command, error) {
	var out Command
	return out, c.Call(ctx, "commands.get", map[string]string{"tenantId": tenantID, "nodeId": nodeID, "commandId": commandID}, &out)
}

// CommandsListInput is commands.list's input; zero fields take the
// defaults (every state, 100).
type CommandsListInput struct {
	TenantID string `json:"tenantId"`
	NodeID   string `json:"nodeId"`
	State    string `json:"state,omitempty"`
	Limit    int    `json:"limit,omitempty"`
}

// CommandsList calls commands.list: the node's commands, newest first.
func (c *Client) CommandsList(ctx context.Context, in CommandsListInput) (CommandList, error) {
	var out CommandList
	return out, c.Call(ctx, "commands.list", in, &out)
}

// CommandsCancel calls commands.cancel.
func (c *Client) CommandsCancel(ctx context.Context, tenantID, nodeID, commandID string) (Command, error) {
	var out Command
	return out, c.Call(ctx, "commands.cancel", map[string]string{"tenantId": tenantID, "nodeId": nodeID, "commandId": commandID}, &out)
}
