// Package ramdisk is `bcd ramdisk`, the agent of a machine booted into the
// ramdisk: it reports the machine's inventory to the control plane with its
// boot token, runs the steps it is answered (wipe the disks, power off,
// wait, and a deploy's write-image, write-seed, exec and reboot) and
// reports each step's result.
//
// The conversation: POST the report (or, with a site's discovery token, the
// discover body) and get RamdiskInstructions; run their steps in order,
// POSTing a RamdiskResult after each one. An answer to a result that holds
// steps replaces the steps still queued; an empty one keeps them. A failed
// step drops the queue unless its answer says what to do next. With nothing
// left to run, the ramdisk waits: it stays up and re-reports, so the
// control plane sees it alive and can hand it more steps.
package ramdisk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	coreinv "github.com/better-compute/better-compute/core/inventory"
)

// Machine is what the steps act on: the real one the ramdisk booted on
// (Host) or a simulated one (Simulated).
type Machine interface {
	// Inventory collects the NodeInventory v1 document.
	Inventory(ctx context.Context) (*coreinv.NodeInventory, error)
	// WipeDisks erases the partition tables and signatures of disks and
	// says what it wiped.
	WipeDisks(ctx context.Context, disks []coreinv.Disk) (string, error)
	// PowerOff turns the machine off. On a real machine it does not return
	// when it succeeds.
	PowerOff(ctx context.Context) error
	// OpenDisk opens one disk of the inventory for the deploy steps.
	OpenDisk(ctx context.Context, d coreinv.Disk) (Disk, error)
	// Reboot restarts the machine. On a real machine it does not return
	// when it succeeds.
	Reboot(ctx context.Context) error
}

// ErrUnauthorized is returned when the API refuses the token (401 or 403):
// it will not be accepted on a retry, so the ramdisk stops.
var ErrUnauthorized = errors.New("ramdisk: the API refused the boot token")

// DefaultWaitInterval is how often the wait step re-reports.
const DefaultWaitInterval = 30 * time.Second

// Agent runs the ramdisk's conversation with the API.
type Agent struct {
	Config  protocol.RamdiskBootConfig
	Machine Machine
	// BootMAC is the MAC the machine booted from; the discover body
	// carries it.
	BootMAC string
	// Client is the HTTP client; nil means one with a 30 s timeout.
	Client *http.Client
	// Log receives progress lines (the serial console in a VM); nil
	// discards them.
	Log *slog.Logger
	// RetryMin and RetryMax bound the backoff between tries while the
	// network or the API is not there yet; zero means 250 ms and 5 s.
	RetryMin, RetryMax time.Duration
	// WaitInterval is the wait step's default re-report period; zero
	// means DefaultWaitInterval. An answer's PollMs overrides it.
	WaitInterval time.Duration

	// nodeID is the node the reports are for, as the API answered.
	nodeID string
	// pollInterval is the last answer's PollMs (0: none said).
	pollInterval time.Duration
	// imageDisk is the disk write-image wrote in this boot, which
	// write-seed writes to unless told otherwise.
	imageDisk string
}

// Run reports, runs the steps, and returns once the machine powered off
// (only a simulated one returns then), the context ended, or the API
// refused the token or the conversation (an error).
func (a *Agent) Run(ctx context.Context) error {
	if a.Config.APIURL == "" || a.Config.Token == "" {
		return errors.New("ramdisk: the boot config has no apiUrl or token")
	}
	inv, err := a.Machine.Inventory(ctx)
	if err != nil {
		return fmt.Errorf("ramdisk: inventory: %w", err)
	}
	a.log().Info("inventory collected", "disks", len(inv.Disks), "nics", len(inv.NICs),
		"cpus", inv.CPU.LogicalCPUs, "memoryBytes", inv.Memory.TotalBytes)
	instr, err := a.report(ctx, inv)
	if err != nil {
		return err
	}
	a.log().Info("reported", "nodeId", instr.NodeID, "steps", stepNames(instr.Steps))
	a.nodeID = instr.NodeID
	a.heard(instr)
	queue := instr.Steps
	for {
		if len(queue) == 0 {
			queue = []protocol.RamdiskStep{{Name: protocol.StepWait}}
		}
		step := queue[0]
		queue = queue[1:]
		a.log().Info("step", "name", step.Name)
		start := time.Now()
		var res protocol.RamdiskStepResult
		var next []protocol.RamdiskStep
		switch step.Name {
		case protocol.StepWipeDisks:
			msg, err := a.Machine.WipeDisks(ctx, inv.Disks)
			res = result(step.Name, start, msg, err)
		case protocol.StepPowerOff:
			res = result(step.Name, start, "powering off", nil)
			// The result goes first: nothing is sent once the power is off.
			if _, err := a.sendResult(ctx, res); err != nil {
				return err
			}
			a.log().Info("powering off")
			if err := a.Machine.PowerOff(ctx); err != nil {
				return fmt.Errorf("ramdisk: power off: %w", err)
			}
			return nil
		case protocol.StepReboot:
			res = result(step.Name, start, "rebooting", nil)
			// As for power-off: nothing is sent once the machine restarts.
			if _, err := a.sendResult(ctx, res); err != nil {
				return err
			}
			a.log().Info("rebooting")
			if err := a.Machine.Reboot(ctx); err != nil {
				return fmt.Errorf("ramdisk: reboot: %w", err)
			}
			return nil
		case protocol.StepWriteImage:
			msg, err := a.writeImage(ctx, inv, step.Args)
			res = result(step.Name, start, msg, err)
		case protocol.StepWriteSeed:
			msg, err := a.writeSeed(ctx, inv, step.Args)
			res = result(step.Name, start, msg, err)
		case protocol.StepExec:
			msg, err := execStep(ctx, step.Args)
			res = result(step.Name, start, msg, err)
		case protocol.StepWait:
			var err error
			next, err = a.wait(ctx, inv, step)
			if err != nil {
				return err
			}
			res = result(step.Name, start, fmt.Sprintf("new steps: %s", strings.Join(stepNames(next), ", ")), nil)
		default:
			res = result(step.Name, start, "", fmt.Errorf("unknown step %q", step.Name))
		}
		if res.OK {
			a.log().Info("step done", "name", res.Name, "durationMs", res.DurationMs, "message", res.Message)
		} else {
			a.log().Error("step failed", "name", res.Name, "durationMs", res.DurationMs, "message", res.Message)
		}
		if ctx.Err() != nil {
			// The step ended because the ramdisk is stopping.
			return fmt.Errorf("ramdisk: %s: %w", step.Name, ctx.Err())
		}
		answer, err := a.sendResult(ctx, res)
		if err != nil {
			return err
		}
		a.heard(answer)
		switch {
		case len(answer.Steps) > 0:
			queue = answer.Steps
		case len(next) > 0:
			queue = next
		case !res.OK:
			queue = nil
		}
	}
}

func result(name string, start time.Time, msg string, err error) protocol.RamdiskStepResult {
	r := protocol.RamdiskStepResult{Name: name, OK: err == nil, Message: msg, DurationMs: time.Since(start).Milliseconds()}
	if err != nil {
		r.Message = err.Error()
	}
	return r
}

// heard notes what an answer says about the conversation itself.
func (a *Agent) heard(in protocol.RamdiskInstructions) {
	if in.PollMs > 0 {
		a.pollInterval = time.Duration(in.PollMs) * time.Millisecond
	}
}

// waitInterval is how long the wait step sleeps between reports: the
// step's own interval, else the last answer's PollMs, else WaitInterval.
func (a *Agent) waitInterval(step protocol.RamdiskStep) time.Duration {
	if s, ok := step.Args["interval"]; ok {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return time.Duration(n) * time.Second
		}
	}
	if a.pollInterval > 0 {
		return a.pollInterval
	}
	if a.WaitInterval > 0 {
		return a.WaitInterval
	}
	return DefaultWaitInterval
}

// wait re-reports every interval until an answer holds steps other than
// another wait, and returns them.
func (a *Agent) wait(ctx context.Context, inv *coreinv.NodeInventory, step protocol.RamdiskStep) ([]protocol.RamdiskStep, error) {
	interval := a.waitInterval(step)
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("ramdisk: wait: %w", ctx.Err())
		case <-t.C:
		}
		instr, err := a.report(ctx, inv)
		if err != nil {
			return nil, err
		}
		a.heard(instr)
		interval = a.waitInterval(step)
		if len(instr.Steps) > 0 && !(len(instr.Steps) == 1 && instr.Steps[0].Name == protocol.StepWait) {
			return instr.Steps, nil
		}
		t.Reset(interval)
	}
}

// report sends the inventory: as a report with a boot token, as a discover
// body with a discovery token.
func (a *Agent) report(ctx context.Context, inv *coreinv.NodeInventory) (protocol.RamdiskInstructions, error) {
	raw, err := json.Marshal(inv)
	if err != nil {
		return protocol.RamdiskInstructions{}, fmt.Errorf("ramdisk: encode inventory: %w", err)
	}
	var out protocol.RamdiskInstructions
	if strings.HasPrefix(a.Config.Token, protocol.DiscoveryTokenPrefix) {
		body := protocol.RamdiskDiscover{Token: a.Config.Token, BootMAC: a.BootMAC, Inventory: raw}
		err = a.post(ctx, protocol.RamdiskDiscoverPath, body, &out)
	} else {
		err = a.post(ctx, protocol.RamdiskReportPath, protocol.RamdiskReport{Token: a.Config.Token, Inventory: raw}, &out)
	}
	return out, err
}

func (a *Agent) sendResult(ctx context.Context, r protocol.RamdiskStepResult) (protocol.RamdiskInstructions, error) {
	var out protocol.RamdiskInstructions
	err := a.post(ctx, protocol.RamdiskResultPath, protocol.RamdiskResult{Token: a.Config.Token, Results: []protocol.RamdiskStepResult{r}}, &out)
	return out, err
}

// post sends body as JSON and decodes the answer into out, retrying with
// backoff on network errors, 429 and 5xx (the NIC may still be coming up,
// the API may be restarting). 401 and 403 end with ErrUnauthorized, any
// other 4xx with its message.
func (a *Agent) post(ctx context.Context, path string, body, out any) error {
	payload, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("ramdisk: encode %s: %w", path, err)
	}
	url := strings.TrimSuffix(a.Config.APIURL, "/") + path
	client := a.Client
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	minD, maxD := a.backoff()
	delay := minD
	for try := 1; ; try++ {
		retry, err := a.postOnce(ctx, client, url, payload, out)
		if err == nil {
			return nil
		}
		if !retry {
			return fmt.Errorf("ramdisk: POST %s: %w", path, err)
		}
		a.log().Warn("API not reachable yet, retrying", "path", path, "try", try, "error", err.Error(), "in", delay.String())
		// Jitter keeps a rack of machines booted together from calling in
		// lockstep.
		d := delay/2 + rand.N(delay/2+1)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("ramdisk: POST %s: %w (last error: %w)", path, ctx.Err(), err)
		case <-t.C:
		}
		delay = min(delay*2, maxD)
	}
}

// backoff is the range of the delays between tries.
func (a *Agent) backoff() (minD, maxD time.Duration) {
	minD, maxD = a.RetryMin, a.RetryMax
	if minD <= 0 {
		minD = 250 * time.Millisecond
	}
	if maxD < minD {
		maxD = max(5*time.Second, minD)
	}
	return minD, maxD
}

func (a *Agent) postOnce(ctx context.Context, client *http.Client, url string, payload []byte, out any) (retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return ctx.Err() == nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return true, err
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return false, fmt.Errorf("%w (%s)", ErrUnauthorized, resp.Status)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return true, fmt.Errorf("%s: %s", resp.Status, snippet(b))
	case resp.StatusCode >= 300:
		return false, fmt.Errorf("%s: %s", resp.Status, apiMessage(b))
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return false, nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return false, fmt.Errorf("decode answer: %w", err)
	}
	return false, nil
}

// apiMessage is an API error body's code and message ("NOT_FOUND: the
// secret … is gone"), else the body's start.
func apiMessage(b []byte) string {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
		return e.Error.Code + ": " + e.Error.Message
	}
	return snippet(b)
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

func stepNames(steps []protocol.RamdiskStep) []string {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.Name
	}
	return names
}

func (a *Agent) log() *slog.Logger {
	if a.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Log
}
