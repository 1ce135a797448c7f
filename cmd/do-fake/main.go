// Command do-fake serves the fake DigitalOcean API (drivers/providers/dofake)
// on a port, for trying the provider by hand or from a test that drives a
// separate process. It prints one JSON line ({"url": …}) once it listens
// and serves until interrupted; its knobs switch at run time through
// /_fake/ (docs/fake-digitalocean.md).
//
// The accepted tokens come from $DO_FAKE_TOKENS (comma-separated), those
// whose account has previews (the signals API) from $DO_FAKE_PREVIEW_TOKENS;
// neither is ever printed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/drivers/providers/dofake"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "do-fake:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (port 0: a free port)")
	bootDelay := flag.Duration("boot-delay", 3*time.Second, "how long a created droplet stays new")
	actionDelay := flag.Duration("action-delay", 2*time.Second, "how long a droplet action stays in progress")
	listLag := flag.Duration("list-lag", 0, "how long a created droplet stays out of listings")
	perMinute := flag.Int("per-minute", dofake.DefaultPerMinute, "requests per minute per token")
	perHour := flag.Int("per-hour", dofake.DefaultPerHour, "requests per hour per token")
	quiet := flag.Bool("quiet", false, "do not log each request")
	flag.Parse()

	tokens := tokenList(os.Getenv("DO_FAKE_TOKENS"))
	previews := tokenList(os.Getenv("DO_FAKE_PREVIEW_TOKENS"))
	if len(tokens)+len(previews) == 0 {
		return errors.New("set DO_FAKE_TOKENS to the bearer tokens to accept (comma-separated)")
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *quiet {
		logger = nil
	}
	s, err := dofake.Start(*listen, dofake.Config{
		Tokens:        tokens,
		PreviewTokens: previews,
		Logger:        logger,
		Settings: dofake.Settings{
			BootDelay: *bootDelay, ActionDelay: *actionDelay, ListLag: *listLag,
			PerMinute: *perMinute, PerHour: *perHour,
		},
	})
	if err != nil {
		return err
	}
	if err := json.NewEncoder(os.Stdout).Encode(map[string]string{"url": s.URL}); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.Close(shutdown)
}

func tokenList(s string) []string {
	var out []string
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}
