package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/tunnels"
	"github.com/better-compute/better-compute/core"
)

// tunnelCmd is `better-compute tunnel`: tunnels.open, then the tunnel's
// WebSocket spliced with stdin and stdout (an ssh ProxyCommand), or with
// each connection accepted on --listen (one tunnel per connection).
func tunnelCmd(o Options) *cobra.Command {
	var instance, node, listen, contextName, tenant string
	var port, ttl int
	cmd := &cobra.Command{
		Use:   "tunnel (--instance ID --port P | --node ID [--port 22]) [--listen ADDR]",
		Short: "Reach a TCP port of an instance or a node through its agent's session",
		Long: "Open a tunnel (tunnels.open) to a TCP port of an instance or of a node (default 22, its sshd) and splice it\n" +
			"with stdin and stdout, e.g. ssh -o ProxyCommand='better-compute tunnel --node %h' root@node_…; with\n" +
			"--listen, accept local TCP connections on ADDR and open one tunnel for each. The tunnel ends when\n" +
			"either side closes, or at the server's maximum lifetime.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (instance == "") == (node == "") {
				return usageErrorf("give exactly one of --instance and --node")
			}
			if instance != "" && port == 0 {
				return usageErrorf("--instance needs --port")
			}
			client, conn, err := Connect(o, contextName)
			if err != nil {
				return err
			}
			if tenant == "" {
				tenant = conn.Tenant
			}
			if tenant == "" {
				return usageErrorf("no tenant: give --tenant-id, set %s, or log in with --tenant", EnvTenant)
			}
			t := tunneler{client: client, in: tunnels.OpenInput{TenantID: tenant, InstanceID: instance, NodeID: node,
				Port: port, TTLSeconds: ttl}}
			ctx := cmd.Context()
			if listen == "" {
				return t.stdio(ctx, o.stdin(), o.Stdout)
			}
			return t.listen(ctx, listen, o.Stderr)
		},
	}
	f := cmd.Flags()
	f.StringVar(&instance, "instance", "", "the instance to reach (inst_…)")
	f.StringVar(&node, "node", "", "the node to reach (node_…)")
	f.IntVar(&port, "port", 0, "the TCP port (required with --instance; a node's default is 22)")
	f.IntVar(&ttl, "ttl-seconds", 0, "how long an opened tunnel waits for its connection (default 60, at most 600)")
	f.StringVar(&listen, "listen", "", "accept local connections on this address (e.g. 127.0.0.1:2222), one tunnel each")
	f.StringVar(&tenant, "tenant-id", "", "the tenant (default: the context's)")
	f.StringVar(&contextName, "context", "", "the configuration context to use (default: the current one)")
	_ = cmd.RegisterFlagCompletionFunc("context", o.completeContexts)
	return cmd
}

func (o Options) stdin() io.Reader {
	if o.Stdin != nil {
		return o.Stdin
	}
	return os.Stdin
}

// tunneler opens tunnels of one input.
type tunneler struct {
	client *api.Client
	in     tunnels.OpenInput
}

// dial opens a tunnel and connects its WebSocket.
func (t tunneler) dial(ctx context.Context) (*websocket.Conn, error) {
	opened, err := tunnels.Open.Call(ctx, t.client, t.in)
	if err != nil {
		return nil, err
	}
	u := opened.URL
	if strings.HasPrefix(u, "/") {
		u = t.client.BaseURL + u
	}
	switch {
	case strings.HasPrefix(u, "https://"):
		u = "wss://" + strings.TrimPrefix(u, "https://")
	case strings.HasPrefix(u, "http://"):
		u = "ws://" + strings.TrimPrefix(u, "http://")
	}
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: t.client.HTTP,
		HTTPHeader:   http.Header{"Authorization": []string{"Bearer " + opened.Token}},
		Subprotocols: []string{tunnels.Subprotocol}})
	if err != nil {
		if resp != nil {
			var body struct {
				Error *core.Error `json:"error"`
			}
			raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			if json.Unmarshal(raw, &body) == nil && body.Error != nil {
				return nil, fmt.Errorf("tunnel %s: %w", opened.TunnelID, body.Error)
			}
		}
		return nil, fmt.Errorf("tunnel %s: %w", opened.TunnelID, err)
	}
	ws.SetReadLimit(1 << 20)
	return ws, nil
}

// splice copies between the local side and the tunnel until either ends.
func splice(ctx context.Context, ws *websocket.Conn, r io.Reader, w io.Writer, closeLocal func()) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	var once sync.Once
	done := make(chan struct{})
	end := func() { once.Do(func() { close(done) }) }
	go func() { _, _ = io.Copy(conn, r); end() }()
	go func() { _, _ = io.Copy(w, conn); end() }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
	if closeLocal != nil {
		closeLocal()
	}
}

// stdio splices one tunnel with stdin and stdout.
func (t tunneler) stdio(ctx context.Context, in io.Reader, out io.Writer) error {
	ws, err := t.dial(ctx)
	if err != nil {
		return err
	}
	splice(ctx, ws, in, out, nil)
	return nil
}

// listen accepts connections on addr until ctx ends, one tunnel each.
func (t tunneler) listen(ctx context.Context, addr string, log io.Writer) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	fmt.Fprintf(log, "listening on %s\n", ln.Addr())
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			ws, err := t.dial(ctx)
			if err != nil {
				fmt.Fprintf(log, "tunnel for %s: %v\n", c.RemoteAddr(), err)
				return
			}
			splice(ctx, ws, c, c, func() { c.Close() })
		}()
	}
}
