// Package nodespec keeps the NodeSpec `bcd` converged on: the control
// plane's desired state of the node (labels, taints, cordon, drain),
// numbered by generation. Converging today means recording the spec in the
// state directory, where the node's workload manager and the agent's own
// commands read it; the generation recorded is what the agent reports as
// observedGeneration.
package nodespec

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// File is the spec's file in the state directory.
const File = "nodespec.json"

// Taint is a node taint.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

// Spec is the desired state of one generation.
type Spec struct {
	Labels   map[string]string `json:"labels"`
	Taints   []Taint           `json:"taints"`
	Cordoned bool              `json:"cordoned"`
	Drain    string            `json:"drain,omitempty"`
	// Instances are the VPS instances the node runs (instances.go).
	Instances []Instance `json:"instances,omitempty"`
	// Volumes are the sandbox volumes the node keeps (volumes.go).
	Volumes []Volume `json:"volumes,omitempty"`
	// SSH is the node's sshd trust; nil leaves sshd's files alone.
	SSH *SSH `json:"ssh,omitempty"`
}

type record struct {
	Generation int64 `json:"generation"`
	Spec       Spec  `json:"spec"`
}

// Store is the spec kept in a state directory; safe for concurrent use.
type Store struct {
	dir string
	mu  sync.Mutex
	cur record
}

// Open reads the spec kept in dir (none yet: generation 0).
func Open(dir string) (*Store, error) {
	s := &Store{dir: dir}
	b, err := os.ReadFile(filepath.Join(dir, File))
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &s.cur); err != nil {
		return nil, fmt.Errorf("nodespec: %s: %w", File, err)
	}
	return s, nil
}

// Observed is the generation converged on.
func (s *Store) Observed() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.Generation
}

// Apply converges on spec at generation: an older generation than the one
// held changes nothing. It answers the generation now observed.
func (s *Store) Apply(generation int64, spec Spec) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if generation <= s.cur.Generation {
		return s.cur.Generation, nil
	}
	next := record{Generation: generation, Spec: spec}
	b, err := json.MarshalIndent(next, "", "  ")
	if err != nil {
		return s.cur.Generation, err
	}
	if err := writeFileAtomic(filepath.Join(s.dir, File), b); err != nil {
		return s.cur.Generation, err
	}
	s.cur = next
	return generation, nil
}

func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".nodespec-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
