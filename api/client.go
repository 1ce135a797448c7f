package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/api/rpc"
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

// Stream calls a method whose answer is streamed (rpc.Stream) and copies
// the answer's bytes to w as they come. It answers how many rows the
// server wrote; an error the server met after it began is the stream's
// trailer, answered as an error once the bytes before it are copied.
func (c *Client) Stream(ctx context.Context, method string, in any, w io.Writer) (int64, error) {
	group, name, ok := strings.Cut(method, ".")
	if !ok {
		return 0, fmt.Errorf("api client: method %q is not group.name", method)
	}
	body, err := json.Marshal(in)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+"/api/compute/"+group+"/"+name, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, fmt.Errorf("api client: %s: %w", method, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var e errorBody
		if json.Unmarshal(raw, &e) == nil && e.Error != nil {
			return 0, e.Error
		}
		return 0, fmt.Errorf("api client: %s: HTTP %d", method, resp.StatusCode)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return 0, fmt.Errorf("api client: %s: %w", method, err)
	}
	rows, _ := strconv.ParseInt(resp.Trailer.Get(rpc.StreamRowsTrailer), 10, 64)
	if msg := resp.Trailer.Get(rpc.StreamErrorTrailer); msg != "" {
		return rows, fmt.Errorf("api client: %s: the stream ended in an error: %s", method, msg)
	}
	return rows, nil
}
