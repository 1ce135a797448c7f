package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// qmp runs one QEMU Machine Protocol command on the monitor socket. The
// protocol is line-delimited JSON: a greeting, capability negotiation, then
// a command and its return (asynchronous events interleave and are
// skipped). Each command dials afresh, so a monitor left by a dead process
// fails that one command only.
func qmp(ctx context.Context, socket, command string, args any) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	r := bufio.NewReader(conn)
	enc := json.NewEncoder(conn)
	type reply struct {
		QMP    json.RawMessage `json:"QMP"`
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
		Event string `json:"event"`
	}
	read := func() (reply, error) {
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return reply{}, err
			}
			var rep reply
			if err := json.Unmarshal(line, &rep); err != nil {
				return reply{}, fmt.Errorf("qmp reply %q: %w", line, err)
			}
			if rep.Event != "" {
				continue
			}
			return rep, nil
		}
	}
	if rep, err := read(); err != nil || rep.QMP == nil {
		return nil, fmt.Errorf("qmp %s: no greeting: %v", command, err)
	}
	run := func(cmd string, args any) (json.RawMessage, error) {
		msg := map[string]any{"execute": cmd}
		if args != nil {
			msg["arguments"] = args
		}
		if err := enc.Encode(msg); err != nil {
			return nil, err
		}
		rep, err := read()
		if err != nil {
			return nil, err
		}
		if rep.Error != nil {
			return nil, errors.New(rep.Error.Class + ": " + rep.Error.Desc)
		}
		return rep.Return, nil
	}
	if _, err := run("qmp_capabilities", nil); err != nil {
		return nil, fmt.Errorf("qmp capabilities: %w", err)
	}
	out, err := run(command, args)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	return out, nil
}
