package dofake

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"time"
)

// Kinds of resources the fake counts in Stats.Created and Stats.Live.
const (
	KindDroplets            = "droplets"
	KindDatabases           = "databases"
	KindDatabaseReplicas    = "databaseReplicas"
	KindDatabaseUsers       = "databaseUsers"
	KindDatabaseDBs         = "databaseDBs"
	KindDatabasePools       = "databasePools"
	KindApps                = "apps"
	KindFunctionsNamespaces = "functionsNamespaces"
	KindDedicatedInferences = "dedicatedInferences"
)

// Kinds lists every kind Stats counts.
var Kinds = []string{
	KindDroplets, KindDatabases, KindDatabaseReplicas, KindDatabaseUsers, KindDatabaseDBs,
	KindDatabasePools, KindApps, KindFunctionsNamespaces, KindDedicatedInferences,
}

// resources is the state of what is not a droplet: managed databases,
// apps, functions namespaces and dedicated inference endpoints.
type resources struct {
	clusters   map[string]*cluster
	apps       map[string]*app
	namespaces map[string]*namespace
	inferences map[string]*inference
	// createdOf counts creates per kind (droplets are st.created).
	createdOf map[string]int
	drift     []DriftRule
	// driftRewrites counts reads a drift rule rewrote.
	driftRewrites int
	oneClicks     []OneClick
	signals       []map[string]any
	// previews are the tokens whose account has previews enabled.
	previews map[string]bool
}

func newResources() resources {
	return resources{
		clusters:   map[string]*cluster{},
		apps:       map[string]*app{},
		namespaces: map[string]*namespace{},
		inferences: map[string]*inference{},
		createdOf:  map[string]int{},
		previews:   map[string]bool{},
	}
}

// newID counts one create of kind and answers its id: a UUID derived from
// the kind and its number, stable from run to run.
func (rs *resources) newID(kind string) (id string, seq int) {
	rs.createdOf[kind]++
	seq = rs.createdOf[kind]
	h := sha256.Sum256(fmt.Appendf(nil, "%s:%d", kind, seq))
	h[6] = h[6]&0x0f | 0x40 // version 4
	h[8] = h[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16]), seq
}

// newSecret is a password or key: random, so no test can guess one.
func newSecret(prefix string) string {
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// kindCounts answers the creates and the live resources per kind.
func (st *state) kindCounts() (created, live map[string]int) {
	created, live = map[string]int{}, map[string]int{}
	for _, k := range Kinds {
		created[k] = st.createdOf[k]
		live[k] = 0
	}
	created[KindDroplets] = st.created
	live[KindDroplets] = len(st.droplets)
	for _, c := range st.clusters {
		live[KindDatabases]++
		live[KindDatabaseReplicas] += len(c.replicas)
		live[KindDatabaseUsers] += len(c.users)
		live[KindDatabaseDBs] += len(c.dbs)
		live[KindDatabasePools] += len(c.pools)
	}
	live[KindApps] = len(st.apps)
	live[KindFunctionsNamespaces] = len(st.namespaces)
	live[KindDedicatedInferences] = len(st.inferences)
	return created, live
}

// Created answers how many resources of kind (KindDatabases, …) were ever
// created, those whose create answered a failure included.
func (f *Fake) Created(kind string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if kind == KindDroplets {
		return f.st.created
	}
	return f.st.createdOf[kind]
}

// settleResources moves every resource whose delay passed by now to its
// next state.
func (st *state) settleResources(now time.Time) {
	for _, c := range st.clusters {
		c.settle(now)
		for _, r := range c.replicas {
			r.settle(now)
		}
	}
	for _, a := range st.apps {
		a.settle(now)
	}
	for _, in := range st.inferences {
		in.settle(now)
	}
}

// listedBy reports whether a resource created to be listed at listedAt
// shows in a listing at now (the listing lag).
func listedBy(listedAt, now time.Time) bool { return !listedAt.After(now) }
