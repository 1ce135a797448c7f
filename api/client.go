package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Client is the typed Go client of the API: the same calls over HTTP.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:8080
	Token   string // bearer token; empty for public methods
	HTTP    *http.Client
}

// NewClient returns a client of the API at baseURL, calling as token.
func NewClient(baseURL, token string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: http.DefaultClient}
}

// Call posts in to method ("group.method") and decodes the answer into out.
// An error answer is returned as a *core.Error with the server's code.
func (c *Client) Call(ctx context.Context, method string, in, out any) error {
	group, name, ok := strings.Cut(method, ".")
	if !ok {
		return fmt.Errorf("api client: method %q is not group.name", method)
	}
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+"/api/compute/"+group+"/"+name, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("api client: %s: %w", method, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e errorBody
		if json.Unmarshal(raw, &e) == nil && e.Error != nil {
			return e.Error
		}
		return fmt.Errorf("api client: %s: HTTP %d", method, resp.StatusCode)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}

// SystemVersion calls system.version.
func (c *Client) SystemVersion(ctx context.Context) (VersionOutput, error) {
	var out VersionOutput
	return out, c.Call(ctx, "system.version", struct{}{}, &out)
}

// SystemWhoami calls system.whoami.
func (c *Client) SystemWhoami(ctx context.Context) (WhoamiOutput, error) {
	var out WhoamiOutput
	return out, c.Call(ctx, "system.whoami", struct{}{}, &out)
}

// NodesListInput is nodes.list's input.
type NodesListInput struct {
	TenantID       string `json:"tenantId"`
	PoolID         string `json:"poolId,omitempty"`
	ProvisionState string `json:"provisionState,omitempty"`
	Connectivity   string `json:"connectivity,omitempty"`
	Schedulable    *bool  `json:"schedulable,omitempty"`
}

// NodesList calls nodes.list.
func (c *Client) NodesList(ctx context.Context, in NodesListInput) (NodeList, error) {
	var out NodeList
	return out, c.Call(ctx, "nodes.list", in, &out)
}

type nodeRef struct {
	TenantID string `json:"tenantId"`
	NodeID   string `json:"nodeId"`
}

// NodesGet calls nodes.get.
func (c *Client) NodesGet(ctx context.Context, tenantID, nodeID string) (Node, error) {
	var out Node
	return out, c.Call(ctx, "nodes.get", nodeRef{tenantID, nodeID}, &out)
}

// NodesEvents calls nodes.events; limit 0 takes the default (100).
func (c *Client) NodesEvents(ctx context.Context, tenantID, nodeID string, limit int) (NodeEventList, error) {
	var out NodeEventList
	in := struct {
		nodeRef
		Limit int `json:"limit,omitempty"`
	}{nodeRef{tenantID, nodeID}, limit}
	return out, c.Call(ctx, "nodes.events", in, &out)
}

// NodesCordon calls nodes.cordon.
func (c *Client) NodesCordon(ctx context.Context, tenantID, nodeID string) (Node, error) {
	var out Node
	return out, c.Call(ctx, "nodes.cordon", nodeRef{tenantID, nodeID}, &out)
}

// NodesUncordon calls nodes.uncordon.
func (c *Client) NodesUncordon(ctx context.Context, tenantID, nodeID string) (Node, error) {
	var out Node
	return out, c.Call(ctx, "nodes.uncordon", nodeRef{tenantID, nodeID}, &out)
}

// NodesLabelInput is nodes.label's input.
type NodesLabelInput struct {
	TenantID string            `json:"tenantId"`
	NodeID   string            `json:"nodeId"`
	Set      map[string]string `json:"set,omitempty"`
	Remove   []string          `json:"remove,omitempty"`
}

// NodesLabel calls nodes.label.
func (c *Client) NodesLabel(ctx context.Context, in NodesLabelInput) (Node, error) {
	var out Node
	return out, c.Call(ctx, "nodes.label", in, &out)
}

// TaintRef names taints to remove: by key, and by effect when given.
type TaintRef struct {
	Key    string `json:"key"`
	Effect string `json:"effect,omitempty"`
}

// NodesTaintInput is nodes.taint's input.
type NodesTaintInput struct {
	TenantID string     `json:"tenantId"`
	NodeID   string     `json:"nodeId"`
	Add      []Taint    `json:"add,omitempty"`
	Remove   []TaintRef `json:"remove,omitempty"`
}

// NodesTaint calls nodes.taint.
func (c *Client) NodesTaint(ctx context.Context, in NodesTaintInput) (Node, error) {
	var out Node
	return out, c.Call(ctx, "nodes.taint", in, &out)
}

// NodesDelete calls nodes.delete.
func (c *Client) NodesDelete(ctx context.Context, tenantID, nodeID string) (Node, error) {
	var out Node
	return out, c.Call(ctx, "nodes.delete", nodeRef{tenantID, nodeID}, &out)
}

// InventoryGet calls inventory.get; seq 0 is the latest snapshot.
func (c *Client) InventoryGet(ctx context.Context, tenantID, nodeID string, seq int64) (InventorySnapshot, error) {
	var out InventorySnapshot
	in := struct {
		nodeRef
		Seq int64 `json:"seq,omitempty"`
	}{nodeRef{tenantID, nodeID}, seq}
	return out, c.Call(ctx, "inventory.get", in, &out)
}

// InventoryHistoryInput is inventory.history's input.
type InventoryHistoryInput struct {
	TenantID  string `json:"tenantId"`
	NodeID    string `json:"nodeId"`
	Limit     int    `json:"limit,omitempty"`
	BeforeSeq int64  `json:"beforeSeq,omitempty"`
}

// InventoryHistory calls inventory.history.
func (c *Client) InventoryHistory(ctx context.Context, in InventoryHistoryInput) (InventoryHistory, error) {
	var out InventoryHistory
	return out, c.Call(ctx, "inventory.history", in, &out)
}

// InventoryDiffInput is inventory.diff's input; zero seqs take the last two.
type InventoryDiffInput struct {
	TenantID string `json:"tenantId"`
	NodeID   string `json:"nodeId"`
	FromSeq  int64  `json:"fromSeq,omitempty"`
	ToSeq    int64  `json:"toSeq,omitempty"`
}

// InventoryDiff calls inventory.diff.
func (c *Client) InventoryDiff(ctx context.Context, in InventoryDiffInput) (InventoryDiffOutput, error) {
	var out InventoryDiffOutput
	return out, c.Call(ctx, "inventory.diff", in, &out)
}
