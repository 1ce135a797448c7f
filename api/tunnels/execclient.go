package tunnels

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/coder/websocket"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
)

// ExitStatus is how an exec tunnel's command ended: its exit frame.
type ExitStatus = protocol.ExecExitStatus

// Exec connects to an exec tunnel (OpenExec's answer: url, absolute,
// ws(s):// or http(s)://, and the token) and runs it: stdin is sent, then
// the stdin-closed frame; stdout and stderr are written as they come; the
// answer is the exit frame. A refusal before the upgrade is its API error
// (a *core.Error); the stream's end without an exit frame is an error.
// httpClient nil is http.DefaultClient. A stdin read still blocked when the
// command exits is left to finish on its own (its bytes are dropped).
func Exec(ctx context.Context, httpClient *http.Client, url, token string, stdin io.Reader, stdout, stderr io.Writer) (ExitStatus, error) {
	switch {
	case strings.HasPrefix(url, "https://"):
		url = "wss://" + strings.TrimPrefix(url, "https://")
	case strings.HasPrefix(url, "http://"):
		url = "ws://" + strings.TrimPrefix(url, "http://")
	}
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: httpClient,
		HTTPHeader:   http.Header{"Authorization": []string{"Bearer " + token}},
		Subprotocols: []string{Subprotocol}})
	if err != nil {
		return ExitStatus{}, DialError(resp, err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(maxMessage)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	enc := protocol.NewExecEncoder(conn)
	go func() {
		if stdin != nil {
			buf := make([]byte, 32<<10)
			for {
				n, err := stdin.Read(buf)
				if n > 0 {
					if werr := enc.Write(protocol.ExecStdin, buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					break
				}
			}
		}
		_ = enc.Write(protocol.ExecStdinClosed, nil)
	}()
	dec := protocol.NewExecDecoder(conn)
	for {
		ch, p, err := dec.Next()
		if err != nil {
			return ExitStatus{}, fmt.Errorf("the exec tunnel ended before its exit status: %w", err)
		}
		var w io.Writer
		switch ch {
		case protocol.ExecStdout:
			w = stdout
		case protocol.ExecStderr:
			w = stderr
		case protocol.ExecExit:
			st, err := protocol.DecodeExit(p)
			_ = ws.Close(websocket.StatusNormalClosure, "")
			return st, err
		default:
			return ExitStatus{}, fmt.Errorf("%w: channel %d from the agent", protocol.ErrExecFrame, ch)
		}
		if w != nil {
			if _, err := w.Write(p); err != nil {
				return ExitStatus{}, err
			}
		}
	}
}

// DialError is a refused tunnel connect's error: the API's error in the
// answer's body when there is one, else err.
func DialError(resp *http.Response, err error) error {
	if resp == nil || resp.Body == nil {
		return err
	}
	var body struct {
		Error *core.Error `json:"error"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if json.Unmarshal(raw, &body) == nil && body.Error != nil {
		return body.Error
	}
	return errors.Join(err, fmt.Errorf("HTTP %d", resp.StatusCode))
}
