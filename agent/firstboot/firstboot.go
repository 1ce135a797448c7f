// Package firstboot is `bcd node firstboot`: the first boot of a system a
// deploy installed. The deploy's ramdisk left a NoCloud seed (a FAT
// partition labelled protocol.SeedLabel) holding protocol.SeedJoinFile;
// this reads it, joins with agent/join using the deploy boot's token and
// the machine's inventory (the same hardware the ramdisk reported, so the
// control plane matches the node by its hardware key), and then runs the
// node's session against the seed's agent endpoint, else the one the join
// answered.
package firstboot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
)

// MetaDataFile is NoCloud's meta-data file at the seed's root.
const MetaDataFile = "meta-data"

// Seed is what the first boot reads from the seed filesystem.
type Seed struct {
	Join protocol.SeedJoin
	// Hostname is meta-data's local-hostname ("" when there is none).
	Hostname string
}

// maxSeedFile bounds what is read of a seed file.
const maxSeedFile = 1 << 20

// ReadSeed reads the seed from its filesystem (a mounted directory as
// os.DirFS, or a FAT filesystem read from a disk image).
func ReadSeed(fsys fs.FS) (Seed, error) {
	raw, err := readBounded(fsys, protocol.SeedJoinFile)
	if err != nil {
		return Seed{}, fmt.Errorf("firstboot: seed: %w", err)
	}
	var s Seed
	if err := json.Unmarshal(raw, &s.Join); err != nil {
		return Seed{}, fmt.Errorf("firstboot: seed: %s: %w", protocol.SeedJoinFile, err)
	}
	if s.Join.APIURL == "" || s.Join.Token == "" {
		return Seed{}, fmt.Errorf("firstboot: seed: %s names no API URL or token", protocol.SeedJoinFile)
	}
	if md, err := readBounded(fsys, MetaDataFile); err == nil {
		s.Hostname = metaDataValue(string(md), "local-hostname")
	}
	return s, nil
}

func readBounded(fsys fs.FS, name string) ([]byte, error) {
	f, err := fsys.Open(path.Clean(name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxSeedFile))
}

// metaDataValue reads a top-level "key: value" line of NoCloud's
// meta-data, which is YAML of flat scalars; a YAML parser would be the
// only use of one in bcd.
func metaDataValue(doc, key string) string {
	for _, line := range strings.Split(doc, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != key || strings.HasPrefix(line, " ") {
			continue
		}
		return strings.Trim(strings.TrimSpace(v), `"'`)
	}
	return ""
}

// Options configures Run.
type Options struct {
	Seed Seed
	// StateDir keeps the identity; a tmpfs is fine (the installed system
	// may be read-only), and a restarted agent finds the identity there
	// instead of spending the one-time token again.
	StateDir string
	// Inventory collects the machine's inventory for the join.
	Inventory func(ctx context.Context) (*inventory.NodeInventory, error)
	// HTTPClient is the join's (nil: agent/join's default).
	HTTPClient *http.Client
	Logger     *slog.Logger
	// Session runs the node's session with the joined identity (its
	// endpoint already the seed's when it names one); nil returns after
	// the join.
	Session func(ctx context.Context, id join.Identity) error
	// RetryMin and RetryMax bound the backoff between join attempts
	// (250 ms and 5 s by default).
	RetryMin, RetryMax time.Duration
}

// Run joins and then runs the session. The join is retried on network
// errors and on the API being unavailable (the NIC may still be coming up,
// the API restarting); a refused token ends it.
func Run(ctx context.Context, o Options) error {
	if o.StateDir == "" {
		return errors.New("firstboot: a state directory is required")
	}
	if o.Inventory == nil {
		return errors.New("firstboot: an inventory source is required")
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	seed := o.Seed.Join
	if seed.APIURL == "" || seed.Token == "" {
		return errors.New("firstboot: the seed names no API URL or token")
	}
	log.Info("first boot: joining", "api", seed.APIURL, "node", seed.NodeID)
	id, err := joinWithRetry(ctx, o, log)
	if err != nil {
		return err
	}
	if seed.NodeID != "" && id.NodeID != seed.NodeID {
		return fmt.Errorf("firstboot: joined as node %s, but the seed is node %s's", id.NodeID, seed.NodeID)
	}
	if seed.AgentEndpoint != "" {
		id.AgentEndpoint = seed.AgentEndpoint
	}
	log.Info("first boot: joined", "node", id.NodeID, "endpoint", id.AgentEndpoint)
	if o.Session == nil {
		return nil
	}
	return o.Session(ctx, id)
}

func joinWithRetry(ctx context.Context, o Options, log *slog.Logger) (join.Identity, error) {
	minD, maxD := o.RetryMin, o.RetryMax
	if minD <= 0 {
		minD = 250 * time.Millisecond
	}
	if maxD < minD {
		maxD = max(5*time.Second, minD)
	}
	retry := &backoff.ExponentialBackOff{InitialInterval: minD, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: maxD}
	retry.Reset()
	for try := 1; ; try++ {
		inv, err := o.Inventory(ctx)
		if err != nil {
			return join.Identity{}, fmt.Errorf("firstboot: inventory: %w", err)
		}
		id, err := join.Join(ctx, join.Options{
			APIURL: o.Seed.Join.APIURL, Token: o.Seed.Join.Token, StateDir: o.StateDir,
			Name: o.Seed.Hostname, Inventory: inv, HTTPClient: o.HTTPClient,
		})
		if err == nil {
			return id, nil
		}
		if ctx.Err() != nil || !transient(err) {
			return join.Identity{}, fmt.Errorf("firstboot: join: %w", err)
		}
		d := retry.NextBackOff()
		log.Warn("first boot: join failed, retrying", "try", try, "error", err.Error(), "in", d.String())
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return join.Identity{}, fmt.Errorf("firstboot: join: %w (last error: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// transient is an error worth another join: anything but the API's
// answer that the request itself is wrong (a refused or spent token, a
// node that is not in the state to re-join).
func transient(err error) bool {
	var ce *core.Error
	if !errors.As(err, &ce) {
		return true
	}
	switch ce.Code {
	case core.CodeUnavailable, core.CodeInternal, core.CodeQuotaExceeded:
		return true
	}
	return false
}
