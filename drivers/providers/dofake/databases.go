package dofake

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"time"
)

// Database cluster and replica statuses.
const (
	DatabaseCreating = "creating"
	DatabaseOnline   = "online"
	DatabaseResizing = "resizing"
)

// engine is what the fake knows of a database engine.
type engine struct {
	versions       []string // the last is the default
	protocol       string
	port, poolPort int
	adminUser      string
	defaultDB      string
	users, dbs     bool // whether it has users and logical databases
	pools          bool
}

var engines = map[string]engine{
	"pg":     {versions: []string{"14", "15", "16", "17"}, protocol: "postgresql", port: 25060, poolPort: 25061, adminUser: "doadmin", defaultDB: "defaultdb", users: true, dbs: true, pools: true},
	"mysql":  {versions: []string{"8"}, protocol: "mysql", port: 25060, adminUser: "doadmin", defaultDB: "defaultdb", users: true, dbs: true},
	"valkey": {versions: []string{"8"}, protocol: "rediss", port: 25061, adminUser: "default"},
}

// databaseSize is a cluster size: its default storage and node limit.
type databaseSize struct {
	storageMiB uint64
	maxNodes   int
}

var databaseSizes = map[string]databaseSize{
	"db-s-1vcpu-1gb":  {10 * 1024, 1},
	"db-s-1vcpu-2gb":  {25 * 1024, 3},
	"db-s-2vcpu-4gb":  {38 * 1024, 3},
	"db-s-4vcpu-8gb":  {115 * 1024, 3},
	"db-s-6vcpu-16gb": {270 * 1024, 3},
}

// defaultProjectID is the account's default project.
const defaultProjectID = "7f1c2a9e-3b0d-4e5f-8a6b-9c0d1e2f3a4b"

var (
	clusterNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{1,61}[a-z0-9]$`)
	dbObjectRE    = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,62}$`)
)

type cluster struct {
	id, name, engine, version string
	region, size              string
	numNodes                  int
	storageMiB                uint64
	tags                      []string
	privateNetwork, projectID string
	status                    string
	// due is when creating or resizing ends; the resize's target below.
	due                             time.Time
	resizeSize                      string
	resizeNodes                     int
	resizeStorage                   uint64
	created, listedAt               time.Time
	seq                             int
	adminPassword                   string
	users                           []*dbUser // the admin user first
	dbs                             []*dbDB
	pools                           []*dbPool
	rules                           []*firewallRule
	replicas                        []*replica
	maintenanceDay, maintenanceHour string
}

type dbUser struct {
	name, role, password string
	listedAt             time.Time
}

type dbDB struct {
	name     string
	listedAt time.Time
}

type dbPool struct {
	name, user, db, mode string
	size                 int
	listedAt             time.Time
}

type firewallRule struct {
	uuid, typ, value string
	created          time.Time
}

type replica struct {
	id, name, region, size string
	storageMiB             uint64
	tags                   []string
	privateNetwork, status string
	due, created, listedAt time.Time
	seq                    int
}

func (c *cluster) settle(now time.Time) {
	if c.status == DatabaseOnline || c.due.After(now) {
		return
	}
	if c.status == DatabaseResizing {
		c.size, c.numNodes, c.storageMiB = c.resizeSize, c.resizeNodes, c.resizeStorage
	}
	c.status = DatabaseOnline
}

func (r *replica) settle(now time.Time) {
	if r.status == DatabaseCreating && !r.due.After(now) {
		r.status = DatabaseOnline
	}
}

// The wire forms, as godo's Database, DatabaseUser, DatabasePool,
// DatabaseReplica and DatabaseFirewallRule read them.

type wireDBConnection struct {
	Protocol string `json:"protocol"`
	URI      string `json:"uri"`
	Database string `json:"database,omitempty"`
	Host     string `json:"host"`
	Port     int    `json:"port"`
	User     string `json:"user"`
	Password string `json:"password,omitempty"`
	SSL      bool   `json:"ssl"`
}

type wireDBUser struct {
	Name     string `json:"name"`
	Role     string `json:"role"`
	Password string `json:"password,omitempty"`
}

type wireMaintenance struct {
	Day         string   `json:"day"`
	Hour        string   `json:"hour"`
	Pending     bool     `json:"pending"`
	Description []string `json:"description"`
}

type wireDatabase struct {
	ID                 string            `json:"id"`
	Name               string            `json:"name"`
	Engine             string            `json:"engine"`
	Version            string            `json:"version"`
	Connection         *wireDBConnection `json:"connection"`
	PrivateConnection  *wireDBConnection `json:"private_connection"`
	Users              []wireDBUser      `json:"users"`
	NumNodes           int               `json:"num_nodes"`
	Size               string            `json:"size"`
	DBNames            []string          `json:"db_names"`
	Region             string            `json:"region"`
	Status             string            `json:"status"`
	MaintenanceWindow  wireMaintenance   `json:"maintenance_window"`
	CreatedAt          string            `json:"created_at"`
	PrivateNetworkUUID string            `json:"private_network_uuid"`
	Tags               []string          `json:"tags"`
	ProjectID          string            `json:"project_id"`
	StorageSizeMib     uint64            `json:"storage_size_mib"`
}

type wirePool struct {
	User              string            `json:"user"`
	Name              string            `json:"name"`
	Size              int               `json:"size"`
	DB                string            `json:"db"`
	Mode              string            `json:"mode"`
	Connection        *wireDBConnection `json:"connection"`
	PrivateConnection *wireDBConnection `json:"private_connection"`
}

type wireReplica struct {
	ID                 string            `json:"id"`
	Name               string            `json:"name"`
	Connection         *wireDBConnection `json:"connection"`
	PrivateConnection  *wireDBConnection `json:"private_connection"`
	Region             string            `json:"region"`
	Status             string            `json:"status"`
	CreatedAt          string            `json:"created_at"`
	PrivateNetworkUUID string            `json:"private_network_uuid"`
	Tags               []string          `json:"tags"`
	StorageSizeMib     uint64            `json:"storage_size_mib"`
	Size               string            `json:"size"`
}

type wireFirewallRule struct {
	UUID        string `json:"uuid"`
	ClusterUUID string `json:"cluster_uuid"`
	Type        string `json:"type"`
	Value       string `json:"value"`
	CreatedAt   string `json:"created_at"`
}

// host is a cluster's (or replica's) address, under the reserved
// ".invalid" domain so nothing real is ever reached.
func host(name string, seq int, private bool) string {
	h := fmt.Sprintf("%s-do-user-%d-0.db.dofake.invalid", name, seq)
	if private {
		return "private-" + h
	}
	return h
}

// connection is how to reach host as user on database; the password only
// when given (a create's answer).
func connection(e engine, hostname string, port int, user, password, database string) *wireDBConnection {
	cred := user
	if password != "" {
		cred += ":" + password
	}
	uri := fmt.Sprintf("%s://%s@%s:%d", e.protocol, cred, hostname, port)
	switch e.protocol {
	case "postgresql":
		uri += "/" + database + "?sslmode=require"
	case "mysql":
		uri += "/" + database + "?ssl-mode=REQUIRED"
	}
	return &wireDBConnection{Protocol: e.protocol, URI: uri, Database: database, Host: hostname, Port: port, User: user, Password: password, SSL: true}
}

// wireDatabase answers c; withPassword only in its create's answer.
func (c *cluster) wire(withPassword bool) wireDatabase {
	e := engines[c.engine]
	password := ""
	if withPassword {
		password = c.adminPassword
	}
	users := []wireDBUser{}
	for _, u := range c.users {
		w := wireDBUser{Name: u.name, Role: u.role}
		if withPassword {
			w.Password = u.password
		}
		users = append(users, w)
	}
	dbNames := []string{}
	for _, d := range c.dbs {
		dbNames = append(dbNames, d.name)
	}
	return wireDatabase{
		ID: c.id, Name: c.name, Engine: c.engine, Version: c.version,
		Connection:        connection(e, host(c.name, c.seq, false), e.port, e.adminUser, password, e.defaultDB),
		PrivateConnection: connection(e, host(c.name, c.seq, true), e.port, e.adminUser, password, e.defaultDB),
		Users:             users, NumNodes: c.numNodes, Size: c.size, DBNames: dbNames, Region: c.region,
		Status: c.status, MaintenanceWindow: wireMaintenance{Day: c.maintenanceDay, Hour: c.maintenanceHour, Description: []string{}},
		CreatedAt: stamp(c.created), PrivateNetworkUUID: c.privateNetwork, Tags: slices.Clone(c.tags),
		ProjectID: c.projectID, StorageSizeMib: c.storageMiB,
	}
}

func (c *cluster) wirePool(p *dbPool) wirePool {
	e := engines[c.engine]
	return wirePool{
		User: p.user, Name: p.name, Size: p.size, DB: p.db, Mode: p.mode,
		Connection:        connection(e, host(c.name, c.seq, false), e.poolPort, p.user, "", p.name),
		PrivateConnection: connection(e, host(c.name, c.seq, true), e.poolPort, p.user, "", p.name),
	}
}

func (c *cluster) wireReplica(r *replica) wireReplica {
	e := engines[c.engine]
	return wireReplica{
		ID: r.id, Name: r.name,
		Connection:        connection(e, host(r.name, r.seq, false), e.port, e.adminUser, "", e.defaultDB),
		PrivateConnection: connection(e, host(r.name, r.seq, true), e.port, e.adminUser, "", e.defaultDB),
		Region:            r.region, Status: r.status, CreatedAt: stamp(r.created), PrivateNetworkUUID: r.privateNetwork,
		Tags: slices.Clone(r.tags), StorageSizeMib: r.storageMiB, Size: r.size,
	}
}

func (f *Fake) databaseRoutes() map[string]handler {
	users := children[*dbUser, wireDBUser]{key: "user", of: func(c *cluster) *[]*dbUser { return &c.users },
		wire: func(_ *cluster, u *dbUser) wireDBUser { return wireDBUser{Name: u.name, Role: u.role} }}
	dbs := children[*dbDB, map[string]string]{key: "db", of: func(c *cluster) *[]*dbDB { return &c.dbs },
		wire: func(_ *cluster, d *dbDB) map[string]string { return map[string]string{"name": d.name} }}
	pools := children[*dbPool, wirePool]{key: "pool", of: func(c *cluster) *[]*dbPool { return &c.pools }, wire: (*cluster).wirePool}
	replicas := children[*replica, wireReplica]{key: "replica", of: func(c *cluster) *[]*replica { return &c.replicas },
		wire: (*cluster).wireReplica}
	// The cluster's admin user cannot be deleted.
	adminUser := func(u *dbUser) (int, any, bool) {
		if u.role != "primary" {
			return 0, nil, false
		}
		status, body := fail(http.StatusUnprocessableEntity, "The cluster's admin user cannot be deleted.")
		return status, body, true
	}
	st := &f.st
	return map[string]handler{
		"POST /v2/databases":                              f.createCluster,
		"GET /v2/databases":                               f.listClusters,
		"GET /v2/databases/{id}":                          f.getCluster,
		"DELETE /v2/databases/{id}":                       f.deleteCluster,
		"PUT /v2/databases/{id}/resize":                   f.resizeCluster,
		"POST /v2/databases/{id}/users":                   f.createDBUser,
		"POST /v2/databases/{id}/users/{name}/reset_auth": f.resetDBUserAuth,
		"GET /v2/databases/{id}/users":                    users.list(st),
		"GET /v2/databases/{id}/users/{name}":             users.get(st),
		"DELETE /v2/databases/{id}/users/{name}":          users.delete(st, adminUser),
		"POST /v2/databases/{id}/dbs":                     f.createDB,
		"GET /v2/databases/{id}/dbs":                      dbs.list(st),
		"GET /v2/databases/{id}/dbs/{name}":               dbs.get(st),
		"DELETE /v2/databases/{id}/dbs/{name}":            dbs.delete(st, nil),
		"POST /v2/databases/{id}/pools":                   f.createPool,
		"GET /v2/databases/{id}/pools":                    pools.list(st),
		"GET /v2/databases/{id}/pools/{name}":             pools.get(st),
		"PUT /v2/databases/{id}/pools/{name}":             f.updatePool,
		"DELETE /v2/databases/{id}/pools/{name}":          pools.delete(st, nil),
		"GET /v2/databases/{id}/firewall":                 f.getFirewall,
		"PUT /v2/databases/{id}/firewall":                 f.putFirewall,
		"POST /v2/databases/{id}/replicas":                f.createReplica,
		"GET /v2/databases/{id}/replicas":                 replicas.list(st),
		"GET /v2/databases/{id}/replicas/{name}":          replicas.get(st),
		"DELETE /v2/databases/{id}/replicas/{name}":       replicas.delete(st, nil),
	}
}

// databaseCreateRequest is godo's DatabaseCreateRequest.
type databaseCreateRequest struct {
	Name               string   `json:"name"`
	Engine             string   `json:"engine"`
	Version            string   `json:"version"`
	Size               string   `json:"size"`
	Region             string   `json:"region"`
	NumNodes           int      `json:"num_nodes"`
	PrivateNetworkUUID string   `json:"private_network_uuid"`
	Tags               []string `json:"tags"`
	ProjectID          string   `json:"project_id"`
	StorageSizeMib     uint64   `json:"storage_size_mib"`
	Rules              []struct {
		UUID  string `json:"uuid"`
		Type  string `json:"type"`
		Value string `json:"value"`
	} `json:"rules"`
}

// nameTaken reports whether a cluster or replica already has name: names
// are unique in an account, as DigitalOcean's are.
func (st *state) nameTaken(name string) bool {
	for _, c := range st.clusters {
		if c.name == name || findChild(c.replicas, name) != nil {
			return true
		}
	}
	return false
}

func (f *Fake) createCluster(r *http.Request, now time.Time) (int, any) {
	st := &f.st
	var req databaseCreateRequest
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if !clusterNameRE.MatchString(req.Name) {
		return fail(http.StatusUnprocessableEntity, "name must be 3 to 63 lowercase letters, digits and dashes, starting with a letter.")
	}
	if st.nameTaken(req.Name) {
		return fail(http.StatusUnprocessableEntity, "name is already in use by another cluster.")
	}
	e, ok := engines[req.Engine]
	if !ok {
		return fail(http.StatusUnprocessableEntity, "engine %q is not supported.", req.Engine)
	}
	version := req.Version
	if version == "" {
		version = e.versions[len(e.versions)-1]
	}
	if !slices.Contains(e.versions, version) {
		return fail(http.StatusUnprocessableEntity, "version %q is not supported for %s.", version, req.Engine)
	}
	region := st.region(req.Region)
	if region == nil || !region.Available {
		return fail(http.StatusUnprocessableEntity, "region %q is not available.", req.Region)
	}
	size, ok := databaseSizes[req.Size]
	if !ok {
		return fail(http.StatusUnprocessableEntity, "size %q is not available.", req.Size)
	}
	if req.NumNodes < 1 || req.NumNodes > size.maxNodes {
		return fail(http.StatusUnprocessableEntity, "num_nodes must be from 1 to %d for %s.", size.maxNodes, req.Size)
	}
	storage := req.StorageSizeMib
	if storage == 0 {
		storage = size.storageMiB
	}
	if storage < size.storageMiB {
		return fail(http.StatusUnprocessableEntity, "storage_size_mib must be at least %d for %s.", size.storageMiB, req.Size)
	}
	if status, body := checkTags(req.Tags); status != 0 {
		return status, body
	}
	var rules []*firewallRule
	for _, rr := range req.Rules {
		if msg := firewallRuleProblem(rr.Type, rr.Value); msg != "" {
			return fail(http.StatusUnprocessableEntity, "%s", msg)
		}
		rules = append(rules, &firewallRule{typ: rr.Type, value: rr.Value, created: now})
	}

	id, seq := st.newID(KindDatabases)
	c := &cluster{
		id: id, name: req.Name, engine: req.Engine, version: version, region: region.Slug, size: req.Size,
		numNodes: req.NumNodes, storageMiB: storage, tags: dedupe(req.Tags), privateNetwork: req.PrivateNetworkUUID,
		projectID: req.ProjectID, status: DatabaseCreating, due: now.Add(st.settings.DatabaseDelay),
		created: now, listedAt: now.Add(st.settings.ListLag), seq: seq, adminPassword: newSecret("AVNS_"),
		maintenanceDay: "tuesday", maintenanceHour: "04:00:00",
	}
	if c.privateNetwork == "" {
		c.privateNetwork = vpcUUID(region.Slug)
	}
	if c.projectID == "" {
		c.projectID = defaultProjectID
	}
	for _, rule := range rules {
		rule.uuid, _ = st.newID("firewallRules")
	}
	c.rules = rules
	if e.users {
		c.users = []*dbUser{{name: e.adminUser, role: "primary", password: c.adminPassword, listedAt: now}}
	}
	if e.dbs {
		c.dbs = []*dbDB{{name: e.defaultDB, listedAt: now}}
	}
	for _, t := range c.tags {
		st.tags[t] = true // tags given at create are created, as a droplet's
	}
	st.clusters[c.id] = c
	return http.StatusCreated, map[string]any{"database": c.wire(true)}
}

func checkTags(tags []string) (int, any) {
	for _, t := range tags {
		if !tagRE.MatchString(t) {
			return fail(http.StatusUnprocessableEntity, "Tags may contain letters, numbers, colons, dashes, and underscores (at most 255).")
		}
	}
	return 0, nil
}

func firewallRuleProblem(typ, value string) string {
	switch typ {
	case "ip_addr", "droplet", "k8s", "tag", "app":
	default:
		return fmt.Sprintf("firewall rule type %q is not one of ip_addr, droplet, k8s, tag, app.", typ)
	}
	if value == "" {
		return "a firewall rule needs a value."
	}
	return ""
}

// clusterFrom is the cluster the path names; nil when absent.
func (st *state) clusterFrom(r *http.Request) *cluster {
	return st.clusters[r.PathValue("id")]
}

// listedClusters are the clusters a listing shows at now, by creation.
func (st *state) listedClusters(now time.Time) []*cluster {
	var listed []*cluster
	for _, c := range st.clusters {
		if listedBy(c.listedAt, now) {
			listed = append(listed, c)
		}
	}
	slices.SortFunc(listed, func(a, b *cluster) int { return a.seq - b.seq })
	return listed
}

func (f *Fake) listClusters(r *http.Request, now time.Time) (int, any) {
	tag := r.URL.Query().Get("tag_name")
	out := []wireDatabase{}
	for _, c := range f.st.listedClusters(now) {
		f.st.drifted(KindDatabases, c.id, c)
		if tag != "" && !slices.Contains(c.tags, tag) {
			continue
		}
		out = append(out, c.wire(false))
	}
	return paged(r, "databases", out)
}

func (f *Fake) getCluster(r *http.Request, _ time.Time) (int, any) {
	c := f.st.clusterFrom(r)
	if c == nil {
		return notFoundAnswer()
	}
	f.st.drifted(KindDatabases, c.id, c)
	return http.StatusOK, map[string]any{"database": c.wire(false)}
}

func (f *Fake) deleteCluster(r *http.Request, _ time.Time) (int, any) {
	c := f.st.clusterFrom(r)
	if c == nil {
		return notFoundAnswer()
	}
	delete(f.st.clusters, c.id)
	return http.StatusNoContent, nil
}

func (f *Fake) resizeCluster(r *http.Request, now time.Time) (int, any) {
	c := f.st.clusterFrom(r)
	if c == nil {
		return notFoundAnswer()
	}
	var req struct {
		Size           string `json:"size"`
		NumNodes       int    `json:"num_nodes"`
		StorageSizeMib uint64 `json:"storage_size_mib"`
	}
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if c.status != DatabaseOnline {
		return fail(http.StatusUnprocessableEntity, "The cluster is %s; it can be resized once online.", c.status)
	}
	target := req.Size
	if target == "" {
		target = c.size
	}
	size, ok := databaseSizes[target]
	if !ok {
		return fail(http.StatusUnprocessableEntity, "size %q is not available.", target)
	}
	nodes := req.NumNodes
	if nodes == 0 {
		nodes = c.numNodes
	}
	if nodes < 1 || nodes > size.maxNodes {
		return fail(http.StatusUnprocessableEntity, "num_nodes must be from 1 to %d for %s.", size.maxNodes, target)
	}
	storage := req.StorageSizeMib
	if storage == 0 {
		storage = max(c.storageMiB, size.storageMiB)
	}
	if storage < c.storageMiB || storage < size.storageMiB {
		return fail(http.StatusUnprocessableEntity, "storage cannot shrink below %d MiB.", max(c.storageMiB, size.storageMiB))
	}
	c.status, c.due = DatabaseResizing, now.Add(f.st.settings.DatabaseDelay)
	c.resizeSize, c.resizeNodes, c.resizeStorage = target, nodes, storage
	return http.StatusAccepted, nil
}

// onlineCluster is the path's cluster when children can be added to it:
// not while it is still being created.
func (st *state) onlineCluster(r *http.Request) (*cluster, int, any) {
	c := st.clusterFrom(r)
	if c == nil {
		s, b := notFoundAnswer()
		return nil, s, b
	}
	if c.status == DatabaseCreating {
		s, b := fail(http.StatusUnprocessableEntity, "The cluster is still being created.")
		return nil, s, b
	}
	return c, 0, nil
}

// newChild checks a request to create a user or a logical database of the
// cluster the path names: the cluster online, its engine managing them
// (managed), the body's name valid and not taken. On a refusal c is nil
// and status and body are the answer.
func (f *Fake) newChild(r *http.Request, what string, managed func(engine) bool, taken func(*cluster, string) bool) (
	c *cluster, name string, status int, body any) {
	c, status, body = f.st.onlineCluster(r)
	if c == nil {
		return nil, "", status, body
	}
	var req struct {
		Name string `json:"name"`
	}
	refuse := func(code int, format string, args ...any) (*cluster, string, int, any) {
		status, body := fail(code, format, args...)
		return nil, "", status, body
	}
	switch err := decode(r, &req); {
	case err != nil:
		return refuse(http.StatusBadRequest, "%v", err)
	case !managed(engines[c.engine]):
		return refuse(http.StatusUnprocessableEntity, "%s clusters have no %ss to manage.", c.engine, what)
	case !dbObjectRE.MatchString(req.Name):
		return refuse(http.StatusUnprocessableEntity, "%s name %q is not valid.", what, req.Name)
	case taken(c, req.Name):
		return refuse(http.StatusUnprocessableEntity, "%s %q already exists.", what, req.Name)
	}
	return c, req.Name, 0, nil
}

func (f *Fake) createDBUser(r *http.Request, now time.Time) (int, any) {
	c, name, status, body := f.newChild(r, "user", func(e engine) bool { return e.users },
		func(c *cluster, n string) bool { return findChild(c.users, n) != nil })
	if c == nil {
		return status, body
	}
	f.st.newID(KindDatabaseUsers)
	u := &dbUser{name: name, role: "normal", password: newSecret("AVNS_"), listedAt: now.Add(f.st.settings.ListLag)}
	c.users = append(c.users, u)
	return http.StatusCreated, map[string]any{"user": wireDBUser{Name: u.name, Role: u.role, Password: u.password}}
}

// resetDBUserAuth gives a user (the admin too) a new password, answered
// once, as DigitalOcean's reset_auth does.
func (f *Fake) resetDBUserAuth(r *http.Request, now time.Time) (int, any) {
	c, status, body := f.st.onlineCluster(r)
	if c == nil {
		return status, body
	}
	u := findChild(c.users, r.PathValue("name"))
	if u == nil {
		return fail(http.StatusNotFound, "user %q not found.", r.PathValue("name"))
	}
	u.password = newSecret("AVNS_")
	if u.role == "primary" {
		c.adminPassword = u.password
	}
	return http.StatusOK, map[string]any{"user": wireDBUser{Name: u.name, Role: u.role, Password: u.password}}
}

func (f *Fake) createDB(r *http.Request, now time.Time) (int, any) {
	c, name, status, body := f.newChild(r, "database", func(e engine) bool { return e.dbs },
		func(c *cluster, n string) bool { return findChild(c.dbs, n) != nil })
	if c == nil {
		return status, body
	}
	f.st.newID(KindDatabaseDBs)
	c.dbs = append(c.dbs, &dbDB{name: name, listedAt: now.Add(f.st.settings.ListLag)})
	return http.StatusCreated, map[string]any{"db": map[string]string{"name": name}}
}

// poolRequest is godo's DatabaseCreatePoolRequest (and, without the name,
// DatabaseUpdatePoolRequest).
type poolRequest struct {
	User string `json:"user"`
	Name string `json:"name"`
	Size int    `json:"size"`
	DB   string `json:"db"`
	Mode string `json:"mode"`
}

// poolProblem checks a pool's settings against c; "" when they are valid.
func (c *cluster) poolProblem(req poolRequest) string {
	switch {
	case req.Mode != "session" && req.Mode != "transaction" && req.Mode != "statement":
		return fmt.Sprintf("mode %q is not one of session, transaction, statement.", req.Mode)
	case req.Size < 1:
		return "size must be at least 1."
	case findChild(c.dbs, req.DB) == nil:
		return fmt.Sprintf("database %q does not exist.", req.DB)
	case req.User != "" && findChild(c.users, req.User) == nil:
		return fmt.Sprintf("user %q does not exist.", req.User)
	}
	return ""
}

func (f *Fake) createPool(r *http.Request, now time.Time) (int, any) {
	c, status, body := f.st.onlineCluster(r)
	if c == nil {
		return status, body
	}
	var req poolRequest
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if !engines[c.engine].pools {
		return fail(http.StatusUnprocessableEntity, "%s clusters have no connection pools.", c.engine)
	}
	if !dbObjectRE.MatchString(req.Name) {
		return fail(http.StatusUnprocessableEntity, "pool name %q is not valid.", req.Name)
	}
	if findChild(c.pools, req.Name) != nil {
		return fail(http.StatusUnprocessableEntity, "pool %q already exists.", req.Name)
	}
	if msg := c.poolProblem(req); msg != "" {
		return fail(http.StatusUnprocessableEntity, "%s", msg)
	}
	f.st.newID(KindDatabasePools)
	p := &dbPool{name: req.Name, user: req.User, db: req.DB, mode: req.Mode, size: req.Size, listedAt: now.Add(f.st.settings.ListLag)}
	c.pools = append(c.pools, p)
	return http.StatusCreated, map[string]any{"pool": c.wirePool(p)}
}

func (f *Fake) updatePool(r *http.Request, _ time.Time) (int, any) {
	c := f.st.clusterFrom(r)
	if c == nil {
		return notFoundAnswer()
	}
	p := findChild(c.pools, r.PathValue("name"))
	if p == nil {
		return notFoundAnswer()
	}
	var req poolRequest
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if msg := c.poolProblem(req); msg != "" {
		return fail(http.StatusUnprocessableEntity, "%s", msg)
	}
	p.user, p.db, p.mode, p.size = req.User, req.DB, req.Mode, req.Size
	return http.StatusNoContent, nil
}

func (f *Fake) getFirewall(r *http.Request, _ time.Time) (int, any) {
	c := f.st.clusterFrom(r)
	if c == nil {
		return notFoundAnswer()
	}
	out := []wireFirewallRule{}
	for _, rule := range c.rules {
		out = append(out, wireFirewallRule{UUID: rule.uuid, ClusterUUID: c.id, Type: rule.typ, Value: rule.value, CreatedAt: stamp(rule.created)})
	}
	return http.StatusOK, map[string]any{"rules": out}
}

// putFirewall replaces the cluster's rules; a rule naming the uuid of one
// it has keeps that rule's uuid and creation.
func (f *Fake) putFirewall(r *http.Request, now time.Time) (int, any) {
	c := f.st.clusterFrom(r)
	if c == nil {
		return notFoundAnswer()
	}
	var req struct {
		Rules []struct {
			UUID  string `json:"uuid"`
			Type  string `json:"type"`
			Value string `json:"value"`
		} `json:"rules"`
	}
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	var rules []*firewallRule
	for _, rr := range req.Rules {
		if msg := firewallRuleProblem(rr.Type, rr.Value); msg != "" {
			return fail(http.StatusUnprocessableEntity, "%s", msg)
		}
		rules = append(rules, &firewallRule{uuid: rr.UUID, typ: rr.Type, value: rr.Value, created: now})
	}
	for _, rule := range rules {
		i := slices.IndexFunc(c.rules, func(old *firewallRule) bool { return old.uuid == rule.uuid })
		if rule.uuid != "" && i >= 0 {
			rule.created = c.rules[i].created
			continue
		}
		rule.uuid, _ = f.st.newID("firewallRules")
	}
	c.rules = rules
	return http.StatusNoContent, nil
}

// replicaRequest is godo's DatabaseCreateReplicaRequest.
type replicaRequest struct {
	Name               string   `json:"name"`
	Region             string   `json:"region"`
	Size               string   `json:"size"`
	PrivateNetworkUUID string   `json:"private_network_uuid"`
	Tags               []string `json:"tags"`
	StorageSizeMib     uint64   `json:"storage_size_mib"`
}

func (f *Fake) createReplica(r *http.Request, now time.Time) (int, any) {
	st := &f.st
	c := st.clusterFrom(r)
	if c == nil {
		return notFoundAnswer()
	}
	var req replicaRequest
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if c.status != DatabaseOnline {
		return fail(http.StatusUnprocessableEntity, "The cluster is %s; replicas can be added once online.", c.status)
	}
	if !clusterNameRE.MatchString(req.Name) {
		return fail(http.StatusUnprocessableEntity, "name must be 3 to 63 lowercase letters, digits and dashes, starting with a letter.")
	}
	if st.nameTaken(req.Name) {
		return fail(http.StatusUnprocessableEntity, "name is already in use by another cluster.")
	}
	regionSlug := req.Region
	if regionSlug == "" {
		regionSlug = c.region
	}
	if region := st.region(regionSlug); region == nil || !region.Available {
		return fail(http.StatusUnprocessableEntity, "region %q is not available.", regionSlug)
	}
	sizeSlug := req.Size
	if sizeSlug == "" {
		sizeSlug = c.size
	}
	if _, ok := databaseSizes[sizeSlug]; !ok {
		return fail(http.StatusUnprocessableEntity, "size %q is not available.", sizeSlug)
	}
	storage := max(req.StorageSizeMib, c.storageMiB)
	if status, body := checkTags(req.Tags); status != 0 {
		return status, body
	}
	id, seq := st.newID(KindDatabaseReplicas)
	rep := &replica{
		id: id, name: req.Name, region: regionSlug, size: sizeSlug, storageMiB: storage, tags: dedupe(req.Tags),
		privateNetwork: req.PrivateNetworkUUID, status: DatabaseCreating, due: now.Add(st.settings.DatabaseDelay),
		created: now, listedAt: now.Add(st.settings.ListLag), seq: seq,
	}
	if rep.privateNetwork == "" {
		rep.privateNetwork = vpcUUID(regionSlug)
	}
	c.replicas = append(c.replicas, rep)
	return http.StatusCreated, map[string]any{"replica": c.wireReplica(rep)}
}

// A cluster's children (users, dbs, pools, replicas) are named within it
// and listed only once their listing lag has passed; children serves the
// routes they share: list, get by name and delete.
type child interface {
	childName() string
	listedAfter() time.Time
}

func (u *dbUser) childName() string       { return u.name }
func (u *dbUser) listedAfter() time.Time  { return u.listedAt }
func (d *dbDB) childName() string         { return d.name }
func (d *dbDB) listedAfter() time.Time    { return d.listedAt }
func (p *dbPool) childName() string       { return p.name }
func (p *dbPool) listedAfter() time.Time  { return p.listedAt }
func (r *replica) childName() string      { return r.name }
func (r *replica) listedAfter() time.Time { return r.listedAt }

// childIndex is the index of the child named name (-1: none).
func childIndex[T child](items []T, name string) int {
	return slices.IndexFunc(items, func(it T) bool { return it.childName() == name })
}

// findChild is the child named name (nil: none).
func findChild[T child](items []T, name string) T {
	if i := childIndex(items, name); i >= 0 {
		return items[i]
	}
	var none T
	return none
}

// children are one kind of a cluster's children: key names them in an
// answer, of picks them from a cluster, wire answers one.
type children[T child, W any] struct {
	key  string
	of   func(*cluster) *[]T
	wire func(*cluster, T) W
}

func (ch children[T, W]) list(st *state) handler {
	return func(r *http.Request, now time.Time) (int, any) {
		c := st.clusterFrom(r)
		if c == nil {
			return notFoundAnswer()
		}
		out := []W{}
		for _, it := range *ch.of(c) {
			if listedBy(it.listedAfter(), now) {
				out = append(out, ch.wire(c, it))
			}
		}
		return paged(r, ch.key+"s", out)
	}
}

func (ch children[T, W]) get(st *state) handler {
	return func(r *http.Request, _ time.Time) (int, any) {
		c := st.clusterFrom(r)
		if c == nil {
			return notFoundAnswer()
		}
		i := childIndex(*ch.of(c), r.PathValue("name"))
		if i < 0 {
			return notFoundAnswer()
		}
		return http.StatusOK, map[string]any{ch.key: ch.wire(c, (*ch.of(c))[i])}
	}
}

// delete removes the named child; keep, when set, refuses some (an
// answer and true).
func (ch children[T, W]) delete(st *state, keep func(T) (int, any, bool)) handler {
	return func(r *http.Request, _ time.Time) (int, any) {
		c := st.clusterFrom(r)
		if c == nil {
			return notFoundAnswer()
		}
		items := ch.of(c)
		i := childIndex(*items, r.PathValue("name"))
		if i < 0 {
			return notFoundAnswer()
		}
		if keep != nil {
			if status, body, refused := keep((*items)[i]); refused {
				return status, body
			}
		}
		*items = slices.Delete(*items, i, i+1)
		return http.StatusNoContent, nil
	}
}
