package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// agentsResult is what the bench keeps of agentload's JSON (its names).
type agentsResult struct {
	Agents           int     `json:"agents"`
	ConnectedAtEnd   int     `json:"connectedAtEnd"`
	HoldSeconds      float64 `json:"holdSeconds"`
	HoldHeartbeats   float64 `json:"holdHeartbeatsHandled"`
	HeartbeatsPerSec float64 `json:"holdHeartbeatsPerSecond"`
	HeartbeatP50ms   float64 `json:"heartbeatP50ms"`
	HeartbeatP99ms   float64 `json:"heartbeatP99ms"`
	HeartbeatMeanms  float64 `json:"heartbeatMeanMs"`
	APICPUAvg        float64 `json:"apiCpuAvgPercent"` // of one core, over the hold
	APICPUMax        float64 `json:"apiCpuMaxPercent"`
	APIRSSMaxMiB     float64 `json:"apiRssMaxMiB"`
	SessionErrors    int64   `json:"sessionErrors"`
}

// agentsScenario runs `go run ./tools/agentload` from the module's root:
// it starts a stack of its own and a `better-compute serve` child, holds
// cfg.agents sessions for cfg.agentsDuration after the ramp, and measures
// that child. Its output goes to the progress log; the row is its hold:
// heartbeats handled per second and their p50/p99.
func agentsScenario(ctx context.Context, cfg config, progress func(string, ...any)) (result, error) {
	res := result{Scenario: "agents", Clients: cfg.agents}
	root, err := moduleRoot(ctx)
	if err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp("", "bc-bench-agents-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "agentload.json")
	args := agentloadArgs(cfg, out)
	progress("go %s (ramp at agentload's default rate, then a %s hold)", strings.Join(args, " "), cfg.agentsDuration)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			progress("agentload: %s", sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr) // a line too long for the scanner
	}()
	runErr := cmd.Run()
	pw.Close()
	<-done
	if err := ctx.Err(); err != nil {
		return res, err
	}
	a, err := readAgents(out)
	if err != nil {
		if runErr != nil {
			return res, fmt.Errorf("agentload: %w", runErr)
		}
		return res, err
	}
	fillAgents(&res, a)
	if runErr != nil {
		res.Note += "; agentload failed: " + runErr.Error()
	}
	return res, nil
}

func agentloadArgs(cfg config, jsonFile string) []string {
	return []string{"run", "./tools/agentload", "-agents", strconv.Itoa(cfg.agents),
		"-duration", cfg.agentsDuration.String(), "-json", jsonFile}
}

// fillAgents makes the row of agentload's figures.
func fillAgents(res *result, a agentsResult) {
	res.Agents = &a
	res.Calls = int(a.HoldHeartbeats)
	res.OK = res.Calls
	res.Seconds = a.HoldSeconds
	res.CallsPerSec = a.HeartbeatsPerSec
	res.MeanMs, res.P50Ms, res.P99Ms = a.HeartbeatMeanms, a.HeartbeatP50ms, a.HeartbeatP99ms
	res.Note = fmt.Sprintf("%d agents, %d connected at the end; the API process: %.1f%% of a core (max %.1f%%), RSS max %.0f MiB; "+
		"calls are heartbeats the API handled in the hold, their latencies its own", a.Agents, a.ConnectedAtEnd,
		a.APICPUAvg, a.APICPUMax, a.APIRSSMaxMiB)
	if a.SessionErrors > 0 {
		res.Note += fmt.Sprintf("; %d session errors", a.SessionErrors)
	}
}

func readAgents(path string) (agentsResult, error) {
	var a agentsResult
	b, err := os.ReadFile(path)
	if err != nil {
		return a, fmt.Errorf("agentload wrote no result: %w", err)
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("agentload's result: %w", err)
	}
	return a, nil
}

// moduleRoot is the directory of the main module's go.mod: agentload
// builds ./cmd/better-compute from it.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the module: run the bench from the repository")
	}
	return filepath.Dir(mod), nil
}
