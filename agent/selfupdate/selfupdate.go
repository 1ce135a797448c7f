// Package selfupdate replaces the running bcd with a release's build
// (docs/agent-self-update.md). An agent.update command downloads the build
// next to the running executable, checks its size, SHA-256 and SSH
// signature and that it runs and reports the release's version, keeps the
// running build as <executable>.previous, renames the new one over the
// executable and execs it in the same process (same pid, same identity
// files). A marker in the state directory carries the command across the
// exec: the new build must hold a session within the confirm window, or
// the previous build is put back and exec'd, and whichever build holds the
// next session answers the command's result.
package selfupdate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/agent/protocol"
	coreimages "github.com/better-compute/better-compute/core/images"
)

// DefaultConfirmWithin is how long a new build may take to hold a session
// when the command names no window.
const DefaultConfirmWithin = 120 * time.Second

// markerFile, in the state directory, is the update in flight.
const markerFile = "agent-update.json"

// previousSuffix names the kept build next to the executable.
const previousSuffix = ".previous"

// Marker states.
const (
	// Swapped: the new build is in place and has not held a session yet.
	Swapped = "swapped"
	// RolledBack: the previous build was put back; the command failed.
	RolledBack = "rolledBack"
)

// Marker is the update in flight, kept across the exec.
type Marker struct {
	Seq         int64  `json:"seq"`
	FromVersion string `json:"fromVersion"`
	ToVersion   string `json:"toVersion"`
	// Deadline (epoch ms) is when an unconfirmed new build is rolled back.
	Deadline int64  `json:"deadline"`
	State    string `json:"state"`
	// Starts counts the new build's starts: a second start means it died
	// (and a supervisor restarted it) before it held a session.
	Starts int    `json:"starts"`
	Error  string `json:"error,omitempty"`
}

// Updater does agent.update for the running build.
type Updater struct {
	// StateDir is the agent's state directory (the marker's home).
	StateDir string
	// Executable is the running build's path (os.Executable, symlinks
	// resolved); the new build replaces it.
	Executable string
	// Version is the running build's agentVersion ("bcd/0.1.0").
	Version string
	// Endpoint and Client reach the agent listener (mutual TLS).
	Endpoint string
	Client   *http.Client
	// Exec replaces the process (syscall.Exec); tests record the call.
	Exec   func(path string, argv, env []string) error
	Logger *slog.Logger
	// Now is the clock (time.Now).
	Now func() time.Time
}

func (u *Updater) now() time.Time {
	if u.Now != nil {
		return u.Now()
	}
	return time.Now()
}

var sha256Pattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Update runs agent.update seq with args. On success it does not return:
// the process becomes the new build. An error means nothing changed (the
// running build stays, no marker is left) and the command failed.
func (u *Updater) Update(ctx context.Context, seq int64, args protocol.AgentUpdateArgs) error {
	if err := checkArgs(args); err != nil {
		return err
	}
	if args.Version == u.Version {
		return fmt.Errorf("this agent already runs %s", u.Version)
	}
	candidate := u.Executable + ".new"
	defer os.Remove(candidate) // gone once renamed; a failed update leaves nothing
	if err := u.download(ctx, args, candidate); err != nil {
		return err
	}
	if err := verifySignature(candidate, args); err != nil {
		return err
	}
	if err := checkVersion(ctx, candidate, args.Version); err != nil {
		return err
	}
	window := DefaultConfirmWithin
	if args.ConfirmWithinSeconds > 0 {
		window = time.Duration(args.ConfirmWithinSeconds) * time.Second
	}
	m := Marker{Seq: seq, FromVersion: u.Version, ToVersion: args.Version, State: Swapped,
		Deadline: u.now().Add(window).UnixMilli()}
	// The previous build is kept first, so every crash from here on finds
	// a build to put back; the marker is written before the swap, so a
	// crash after it is found at the next start.
	if err := copyFile(u.Executable, u.Executable+previousSuffix); err != nil {
		return fmt.Errorf("keeping the previous build: %w", err)
	}
	if err := u.writeMarker(m); err != nil {
		return err
	}
	if err := os.Rename(candidate, u.Executable); err != nil {
		_ = u.removeMarker()
		return fmt.Errorf("putting the new build in place: %w", err)
	}
	if err := syncDir(filepath.Dir(u.Executable)); err != nil {
		u.log().Warn("syncing the executable's directory", "error", err.Error())
	}
	u.log().Info("agent update: starting the new build", "from", u.Version, "to", args.Version, "seq", seq)
	err := u.Exec(u.Executable, os.Args, os.Environ())
	// Exec failed: the process is still the previous build.
	if err == nil { // only a test's Exec returns without an error
		return nil
	}
	return errors.Join(fmt.Errorf("agent.update: starting the new build: %w", err), u.restore())
}

// Start runs when `bcd node run` starts, before its session. With no
// update in flight it answers nil. When this is an update's new build for
// the second time (it died before holding a session) or past the confirm
// deadline, it puts the previous build back and execs it (not returning
// on success). Otherwise it answers the marker: Confirmed must be called
// once a session is up, and Watch bounds the wait.
func (u *Updater) Start() (*Marker, error) {
	m, err := u.readMarker()
	if err != nil || m == nil {
		return nil, err
	}
	if m.State == Swapped && u.Version == m.ToVersion {
		m.Starts++
		if err := u.writeMarker(*m); err != nil {
			return nil, err
		}
		switch {
		case m.Starts > 1:
			return nil, u.rollback(*m, "the new build exited before it held a session")
		case u.now().UnixMilli() >= m.Deadline:
			return nil, u.rollback(*m, "the new build did not hold a session in time")
		}
		return m, nil
	}
	if m.State == Swapped {
		// The marker is written before the swap: a crash between them
		// leaves the previous build running with a swapped marker.
		m.State, m.Error = RolledBack, "the update was interrupted before the new build started"
		if err := u.writeMarker(*m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Watch rolls m's new build back once its deadline passes unless ctx ends
// first (the session came up and Confirmed ran, or the agent stops).
func (u *Updater) Watch(ctx context.Context, m Marker) {
	if m.State != Swapped {
		return
	}
	t := time.NewTimer(time.Until(time.UnixMilli(m.Deadline)))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
		if err := u.rollback(m, "the new build did not hold a session in time"); err != nil {
			u.log().Error("agent update: rollback failed", "error", err.Error())
		}
	}
}

// Result is the command result m stands for, sent on the first session.
func (m Marker) Result() protocol.Result {
	if m.State == Swapped {
		return protocol.Result{Type: protocol.FrameResult, Seq: m.Seq, State: protocol.CommandSucceeded,
			Stdout: "updated from " + m.FromVersion + " to " + m.ToVersion}
	}
	return protocol.Result{Type: protocol.FrameResult, Seq: m.Seq, State: protocol.CommandFailed,
		Error: "rolled back to " + m.FromVersion + ": " + m.Error}
}

// Confirmed ends the update once its result is sent on a session: the
// marker goes, and the kept previous build stays for an operator's (or a
// rollout's) rollback.
func (u *Updater) Confirmed() error { return u.removeMarker() }

func (u *Updater) rollback(m Marker, why string) error {
	u.log().Warn("agent update: rolling back", "to", m.FromVersion, "reason", why)
	if err := os.Rename(u.Executable+previousSuffix, u.Executable); err != nil {
		return fmt.Errorf("agent update: putting the previous build back: %w", err)
	}
	if err := syncDir(filepath.Dir(u.Executable)); err != nil {
		u.log().Warn("syncing the executable's directory", "error", err.Error())
	}
	m.State, m.Error = RolledBack, why
	if err := u.writeMarker(m); err != nil {
		return err
	}
	return u.Exec(u.Executable, os.Args, os.Environ())
}

// restore undoes a swap whose exec failed: the previous build goes back
// in place and the marker away (the command's failure is answered now).
func (u *Updater) restore() error {
	err := os.Rename(u.Executable+previousSuffix, u.Executable)
	return errors.Join(err, u.removeMarker())
}

func (u *Updater) log() *slog.Logger {
	if u.Logger != nil {
		return u.Logger
	}
	return slog.Default()
}

func checkArgs(a protocol.AgentUpdateArgs) error {
	switch {
	case a.ReleaseID == "" || a.Artifact == "" || strings.ContainsAny(a.ReleaseID+a.Artifact, "/?#%"):
		return errors.New("agent.update: releaseId and artifact are required names")
	case !strings.HasPrefix(a.Version, "bcd/") || len(a.Version) == len("bcd/"):
		return fmt.Errorf("agent.update: version %q is not bcd/<version>", a.Version)
	case !sha256Pattern.MatchString(a.SHA256):
		return errors.New("agent.update: sha256 is not 64 lower-case hex digits")
	case a.SizeBytes <= 0:
		return errors.New("agent.update: sizeBytes must be positive")
	case a.Signature == "" || len(a.Signers) == 0:
		return errors.New("agent.update: an unsigned build, or no signers to check it against, is refused")
	}
	return nil
}

// download streams the artifact into path, hashing it, and refuses bytes
// of another size or digest.
func (u *Updater) download(ctx context.Context, a protocol.AgentUpdateArgs, path string) error {
	if u.Client == nil || u.Endpoint == "" {
		return errors.New("agent.update: no agent listener to download from")
	}
	url := strings.TrimRight(u.Endpoint, "/") + protocol.ReleaseArtifactPath + a.ReleaseID + "/" + a.Artifact
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := u.Client.Do(req)
	if err != nil {
		return fmt.Errorf("agent.update: downloading the build: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("agent.update: downloading the build: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o700)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, a.SizeBytes+1))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("agent.update: writing the build: %w", err)
	}
	if n != a.SizeBytes || hex.EncodeToString(h.Sum(nil)) != a.SHA256 {
		return fmt.Errorf("agent.update: the downloaded build is not the release's (%d bytes, sha256 %x)", n, h.Sum(nil))
	}
	return os.Chmod(path, 0o755)
}

// verifySignature checks the build's SSH signature against the signers.
func verifySignature(path string, a protocol.AgentUpdateArgs) error {
	sig, err := sshsig.Unarmor([]byte(strings.TrimSpace(a.Signature)))
	if err != nil {
		return fmt.Errorf("agent.update: the signature: %w", err)
	}
	for _, line := range a.Signers {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		err = sshsig.Verify(f, sig, pub, sig.HashAlgorithm, coreimages.SignatureNamespace)
		f.Close()
		if err == nil {
			return nil
		}
	}
	return errors.New("agent.update: the build's signature is not by one of the fleet's signers")
}

// checkVersion runs `<candidate> version` and wants it to report version:
// a build that does not start, or says another version, never replaces
// the running one.
func checkVersion(ctx context.Context, candidate, version string) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, candidate, "version").Output()
	if err != nil {
		return fmt.Errorf("agent.update: the new build does not run: %w", err)
	}
	want := "bcd " + strings.TrimPrefix(version, "bcd/") + " "
	if !bytes.HasPrefix(out, []byte(want)) {
		return fmt.Errorf("agent.update: the new build says %q, not %s", strings.TrimSpace(string(out)), version)
	}
	return nil
}

func (u *Updater) markerPath() string { return filepath.Join(u.StateDir, markerFile) }

func (u *Updater) readMarker() (*Marker, error) {
	raw, err := os.ReadFile(u.markerPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var m Marker
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("agent update: %s: %w", markerFile, err)
	}
	return &m, nil
}

func (u *Updater) writeMarker(m Marker) error {
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp := u.markerPath() + ".tmp"
	if err := writeSynced(tmp, raw, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, u.markerPath()); err != nil {
		return err
	}
	return syncDir(u.StateDir)
}

func (u *Updater) removeMarker() error {
	if err := os.Remove(u.markerPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncDir(u.StateDir)
}

// copyFile copies from to to (mode kept), synced, through a temporary
// file renamed into place.
func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	tmp := to + ".tmp"
	dst, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, src)
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, to)
}

func writeSynced(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
