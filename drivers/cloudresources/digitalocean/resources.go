package digitalocean

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/digitalocean/godo"

	"github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/drivers/providers"
	doprovider "github.com/better-compute/better-compute/drivers/providers/digitalocean"
)

// The kinds Resources serves: the managed PostgreSQL family, apps,
// functions namespaces and dedicated inference endpoints.
const (
	KindCluster   = "do.database.pg"
	KindUser      = "do.database.pg.user"
	KindDatabase  = "do.database.pg.database"
	KindPool      = "do.database.pg.pool"
	KindFirewall  = "do.database.pg.firewall"
	KindReplica   = "do.database.pg.replica"
	KindApp       = "do.app"
	KindNamespace = "do.functions.namespace"
	KindInference = "do.inference.dedicated"
)

// perPage is the page size of the cluster listing (DigitalOcean's maximum);
// maxPages bounds it.
const (
	perPage  = 200
	maxPages = 500
)

// Resources is one DigitalOcean account's managed PostgreSQL clusters and
// what lives in them, apps, functions namespaces and dedicated inference
// endpoints, over godo. Nothing is retried here: every create is
// sent once, and the reconciler's activities retry the rest.
type Resources struct {
	client *godo.Client
}

var _ cloudresources.ProviderResources = (*Resources)(nil)

// New serves the account of client, a client opened by
// drivers/providers/digitalocean's Factory.Client (its limiter and token).
func New(client *godo.Client) *Resources { return &Resources{client: client} }

// Open opens the account of credential c through factory.
func Open(ctx context.Context, factory *doprovider.Factory, c providers.Credential) (*Resources, error) {
	client, err := factory.Client(ctx, c)
	if err != nil {
		return nil, err
	}
	return New(client), nil
}

// Kinds implements cloudresources.ProviderResources: every manifest.
func (r *Resources) Kinds() *cloudresources.KindSet { return Kinds() }

// Observe implements cloudresources.ProviderResources.
func (r *Resources) Observe(ctx context.Context, req cloudresources.ObserveRequest) (cloudresources.Observed, error) {
	switch req.Kind {
	case KindCluster:
		if req.ProviderID != "" {
			return r.getCluster(ctx, req.ProviderID)
		}
		return r.findCluster(ctx, req.Name, req.Owner)
	case KindApp:
		if req.ProviderID == "" {
			return r.findApp(ctx, req.Name, req.Owner)
		}
		a, err := r.getApp(ctx, req.ProviderID)
		if err != nil {
			return cloudresources.Observed{}, err
		}
		return appObserved(a), nil
	case KindNamespace:
		if req.ProviderID == "" {
			return r.findNamespace(ctx, req.Name)
		}
		n, err := r.getNamespace(ctx, req.ProviderID)
		if err != nil {
			return cloudresources.Observed{}, err
		}
		return namespaceObserved(n), nil // the key only where a create's answer was lost
	case KindInference:
		if req.ProviderID == "" {
			return r.findInference(ctx, req.Name)
		}
		in, err := r.getInference(ctx, req.ProviderID)
		if err != nil {
			return cloudresources.Observed{}, err
		}
		return inferenceObserved(in), nil
	case KindUser, KindDatabase, KindPool, KindReplica, KindFirewall:
	default:
		return cloudresources.Observed{}, unsupported(req.Kind)
	}
	if req.ParentProviderID == "" || (req.ProviderID == "" && req.Name == "" && req.Kind != KindFirewall) {
		return cloudresources.Observed{}, fmt.Errorf("digitalocean: %s without its cluster or name: %w", req.Kind, providers.ErrNotFound)
	}
	if req.Kind == KindFirewall {
		o, err := r.getFirewall(ctx, req.ParentProviderID)
		if err == nil && req.ProviderID == "" && string(o.Spec) == `{"rules":[]}` {
			// Looking for a lost create: an empty rule set is none.
			return cloudresources.Observed{}, fmt.Errorf("digitalocean: the firewall of %s has no rules: %w", req.ParentProviderID, providers.ErrNotFound)
		}
		return o, err
	}
	name := req.ProviderID
	if name == "" {
		name = req.Name
	}
	o, err := r.getChild(ctx, req.Kind, req.ParentProviderID, name)
	if err != nil || req.ProviderID != "" || req.Kind != KindReplica {
		return o, err
	}
	// A replica carries tags: a same-named one without ours is not ours.
	if !req.Owner.Owns(o.Labels) {
		return cloudresources.Observed{}, refused("replica %s is not managed by this owner", name)
	}
	return o, nil
}

// Create implements cloudresources.ProviderResources. It is sent once.
func (r *Resources) Create(ctx context.Context, req cloudresources.CreateRequest) (cloudresources.Observed, error) {
	switch req.Kind {
	case KindCluster:
		return r.createCluster(ctx, req)
	case KindUser:
		return r.createUser(ctx, req)
	case KindDatabase:
		return r.createDatabase(ctx, req)
	case KindPool:
		return r.createPool(ctx, req)
	case KindFirewall:
		var spec firewallSpec
		if err := decodeSpec(req.Spec, &spec); err != nil {
			return cloudresources.Observed{}, err
		}
		if err := r.putFirewall(ctx, req.ParentProviderID, spec); err != nil {
			return cloudresources.Observed{}, err
		}
		return r.getFirewall(ctx, req.ParentProviderID)
	case KindReplica:
		return r.createReplica(ctx, req)
	case KindApp:
		return r.createApp(ctx, req)
	case KindNamespace:
		return r.createNamespace(ctx, req)
	case KindInference:
		return r.createInference(ctx, req)
	}
	return cloudresources.Observed{}, unsupported(req.Kind)
}

// Update implements cloudresources.ProviderResources: a cluster's resize,
// a pool's settings, a firewall's rules.
func (r *Resources) Update(ctx context.Context, req cloudresources.UpdateRequest) (cloudresources.Observed, error) {
	switch req.Kind {
	case KindCluster:
		return r.updateCluster(ctx, req)
	case KindPool:
		var spec poolSpec
		if err := decodeSpec(req.New, &spec); err != nil {
			return cloudresources.Observed{}, err
		}
		_, err := r.client.Databases.UpdatePool(ctx, req.ParentProviderID, req.ProviderID, &godo.DatabaseUpdatePoolRequest{
			User: spec.User, Size: spec.Size, Database: spec.DB, Mode: spec.Mode,
		})
		if err != nil {
			return cloudresources.Observed{}, doprovider.MapError("updating pool "+req.ProviderID, err)
		}
		return r.getChild(ctx, KindPool, req.ParentProviderID, req.ProviderID)
	case KindFirewall:
		var spec firewallSpec
		if err := decodeSpec(req.New, &spec); err != nil {
			return cloudresources.Observed{}, err
		}
		if err := r.putFirewall(ctx, req.ParentProviderID, spec); err != nil {
			return cloudresources.Observed{}, err
		}
		return r.getFirewall(ctx, req.ParentProviderID)
	case KindReplica:
		// godo has no replica resize.
		return cloudresources.Observed{}, refused("resizing a replica in place is not supported")
	case KindApp:
		return r.updateApp(ctx, req)
	case KindInference:
		return r.updateInference(ctx, req)
	case KindUser, KindDatabase, KindNamespace:
		return cloudresources.Observed{}, refused("%s has no field updated in place", req.Kind)
	}
	return cloudresources.Observed{}, unsupported(req.Kind)
}

// Delete implements cloudresources.ProviderResources; one already gone
// (or whose cluster is gone) is not an error. Deleting the firewall opens
// the cluster to every source again (an empty rule set).
func (r *Resources) Delete(ctx context.Context, ref cloudresources.Ref) error {
	if ref.ProviderID == "" {
		// An empty id would name the collection's path, not a resource.
		return refused("deleting %s without a provider id", ref.Kind)
	}
	var err error
	switch ref.Kind {
	case KindCluster:
		_, err = r.client.Databases.Delete(ctx, ref.ProviderID)
	case KindUser:
		_, err = r.client.Databases.DeleteUser(ctx, ref.ParentProviderID, ref.ProviderID)
	case KindDatabase:
		_, err = r.client.Databases.DeleteDB(ctx, ref.ParentProviderID, ref.ProviderID)
	case KindPool:
		_, err = r.client.Databases.DeletePool(ctx, ref.ParentProviderID, ref.ProviderID)
	case KindReplica:
		_, err = r.client.Databases.DeleteReplica(ctx, ref.ParentProviderID, ref.ProviderID)
	case KindFirewall:
		_, err = r.client.Databases.UpdateFirewallRules(ctx, ref.ParentProviderID,
			&godo.DatabaseUpdateFirewallRulesRequest{Rules: []*godo.DatabaseFirewallRule{}})
	case KindApp:
		_, err = r.client.Apps.Delete(ctx, ref.ProviderID)
	case KindNamespace:
		_, err = r.client.Functions.DeleteNamespace(ctx, ref.ProviderID)
	case KindInference:
		_, err = r.client.DedicatedInference.Delete(ctx, ref.ProviderID)
	default:
		return unsupported(ref.Kind)
	}
	if err == nil {
		return nil
	}
	err = doprovider.MapError("deleting "+ref.Kind+" "+ref.ProviderID, err)
	if errors.Is(err, providers.ErrNotFound) {
		return nil
	}
	return err
}

// The specs, in DigitalOcean's field names (the manifests').

type maintenanceWindow struct {
	Day  string `json:"day"`
	Hour string `json:"hour"`
}

type storageAutoscale struct {
	Enabled          bool    `json:"enabled"`
	ThresholdPercent *int    `json:"threshold_percent,omitempty"`
	IncrementGiB     *uint64 `json:"increment_gib,omitempty"`
}

type clusterSpec struct {
	Name               string             `json:"name,omitempty"`
	Engine             string             `json:"engine,omitempty"`
	Version            string             `json:"version,omitempty"`
	Region             string             `json:"region"`
	Size               string             `json:"size"`
	NumNodes           int                `json:"num_nodes,omitempty"`
	StorageSizeMib     uint64             `json:"storage_size_mib,omitempty"`
	PrivateNetworkUUID string             `json:"private_network_uuid,omitempty"`
	Network            string             `json:"network,omitempty"`
	ProjectID          string             `json:"project_id,omitempty"`
	MaintenanceWindow  *maintenanceWindow `json:"maintenance_window,omitempty"`
	StorageAutoscale   *storageAutoscale  `json:"storage_autoscale,omitempty"`
}

type nameSpec struct {
	Name string `json:"name"`
}

type poolSpec struct {
	Name string `json:"name"`
	User string `json:"user,omitempty"`
	DB   string `json:"db"`
	Size int    `json:"size"`
	Mode string `json:"mode"`
}

type firewallRule struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

type firewallSpec struct {
	Rules     []firewallRule `json:"rules"`
	Instances []string       `json:"instances,omitempty"`
}

type replicaSpec struct {
	Name               string `json:"name,omitempty"`
	Region             string `json:"region"`
	Size               string `json:"size"`
	StorageSizeMib     uint64 `json:"storage_size_mib,omitempty"`
	PrivateNetworkUUID string `json:"private_network_uuid,omitempty"`
	Network            string `json:"network,omitempty"`
}

func (r *Resources) createCluster(ctx context.Context, req cloudresources.CreateRequest) (cloudresources.Observed, error) {
	var spec clusterSpec
	if err := decodeSpec(req.Spec, &spec); err != nil {
		return cloudresources.Observed{}, err
	}
	if spec.Network != "" {
		// A better-compute network is resolved to its VPC before the call.
		return cloudresources.Observed{}, refused("spec.network must be resolved to private_network_uuid")
	}
	if spec.MaintenanceWindow != nil {
		// DatabaseCreateRequest has no maintenance window.
		return cloudresources.Observed{}, refused("a maintenance window at creation is not supported")
	}
	create := &godo.DatabaseCreateRequest{
		Name: req.Name, EngineSlug: "pg", Version: spec.Version, SizeSlug: spec.Size, Region: spec.Region,
		NumNodes: max(spec.NumNodes, 1), PrivateNetworkUUID: spec.PrivateNetworkUUID, ProjectID: spec.ProjectID,
		StorageSizeMib: spec.StorageSizeMib, Tags: req.Owner.Tags(),
		// Empty, not nil: godo sends a nil slice as null.
		Rules: []*godo.DatabaseCreateFirewallRule{},
	}
	if a := spec.StorageAutoscale; a != nil {
		create.StorageAutoscale = &godo.DatabaseStorageAutoscale{Enabled: a.Enabled, ThresholdPercent: a.ThresholdPercent, IncrementGib: a.IncrementGiB}
	}
	db, _, err := r.client.Databases.Create(ctx, create)
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("creating database cluster "+req.Name, err)
	}
	return clusterObserved(db), nil
}

func (r *Resources) getCluster(ctx context.Context, id string) (cloudresources.Observed, error) {
	db, _, err := r.client.Databases.Get(ctx, id)
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("reading database cluster "+id, err)
	}
	return clusterObserved(db), nil
}

// findCluster is the cluster named name, when it carries owner's tags.
func (r *Resources) findCluster(ctx context.Context, name string, owner cloudresources.Owner) (cloudresources.Observed, error) {
	for page := 1; page <= maxPages; page++ {
		dbs, resp, err := r.client.Databases.List(ctx, &godo.ListOptions{Page: page, PerPage: perPage})
		if err != nil {
			return cloudresources.Observed{}, doprovider.MapError("listing database clusters", err)
		}
		for i := range dbs {
			if dbs[i].Name != name {
				continue
			}
			if !owner.Owns(dbs[i].Tags) {
				return cloudresources.Observed{}, refused("database cluster %s is not managed by this owner", name)
			}
			return clusterObserved(&dbs[i]), nil
		}
		if resp == nil || resp.Links == nil || resp.Links.IsLastPage() || len(dbs) == 0 {
			return cloudresources.Observed{}, fmt.Errorf("digitalocean: database cluster %s: %w", name, providers.ErrNotFound)
		}
	}
	return cloudresources.Observed{}, fmt.Errorf("digitalocean: listing database clusters: more than %d pages: %w", maxPages, providers.ErrUnavailable)
}

// updateCluster resizes (size, num_nodes, storage_size_mib). A version,
// maintenance window or storage autoscale change is refused for now.
func (r *Resources) updateCluster(ctx context.Context, req cloudresources.UpdateRequest) (cloudresources.Observed, error) {
	var old, spec clusterSpec
	if err := decodeSpec(req.Old, &old); err != nil {
		return cloudresources.Observed{}, err
	}
	if err := decodeSpec(req.New, &spec); err != nil {
		return cloudresources.Observed{}, err
	}
	if old.Version != spec.Version || !sameJSON(old.MaintenanceWindow, spec.MaintenanceWindow) ||
		!sameJSON(old.StorageAutoscale, spec.StorageAutoscale) {
		return cloudresources.Observed{}, refused("only size, num_nodes and storage_size_mib change in place yet")
	}
	if old.Size != spec.Size || old.NumNodes != spec.NumNodes || old.StorageSizeMib != spec.StorageSizeMib {
		resize := &godo.DatabaseResizeRequest{SizeSlug: spec.Size, NumNodes: max(spec.NumNodes, 1)}
		// Storage is sent only when it changes: a larger size brings its
		// own minimum, which the old amount may be under.
		if old.StorageSizeMib != spec.StorageSizeMib {
			resize.StorageSizeMib = spec.StorageSizeMib
		}
		_, err := r.client.Databases.Resize(ctx, req.ProviderID, resize)
		if err != nil {
			return cloudresources.Observed{}, doprovider.MapError("resizing database cluster "+req.ProviderID, err)
		}
	}
	return r.getCluster(ctx, req.ProviderID)
}

func (r *Resources) createUser(ctx context.Context, req cloudresources.CreateRequest) (cloudresources.Observed, error) {
	// The cluster is read first: the user's uri needs its address, and a
	// read after the create could fail and lose the password.
	parent, err := r.getCluster(ctx, req.ParentProviderID)
	if err != nil {
		return cloudresources.Observed{}, err
	}
	u, _, err := r.client.Databases.CreateUser(ctx, req.ParentProviderID, &godo.DatabaseCreateUserRequest{Name: req.Name})
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("creating database user "+req.Name, err)
	}
	o := userObserved(req.ParentProviderID, u)
	if u.Password != "" {
		o.Secrets = cloudresources.SecretValues{"password": u.Password}
		if host, port := parent.Outputs["host"], parent.Outputs["port"]; host != "" {
			o.Secrets["uri"] = postgresURI(u.Name, u.Password, host, port, parent.Outputs["database"])
		}
	}
	return o, nil
}

func (r *Resources) createDatabase(ctx context.Context, req cloudresources.CreateRequest) (cloudresources.Observed, error) {
	d, _, err := r.client.Databases.CreateDB(ctx, req.ParentProviderID, &godo.DatabaseCreateDBRequest{Name: req.Name})
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("creating database "+req.Name, err)
	}
	return databaseObserved(req.ParentProviderID, d), nil
}

func (r *Resources) createPool(ctx context.Context, req cloudresources.CreateRequest) (cloudresources.Observed, error) {
	var spec poolSpec
	if err := decodeSpec(req.Spec, &spec); err != nil {
		return cloudresources.Observed{}, err
	}
	p, _, err := r.client.Databases.CreatePool(ctx, req.ParentProviderID, &godo.DatabaseCreatePoolRequest{
		Name: req.Name, User: spec.User, Database: spec.DB, Size: spec.Size, Mode: spec.Mode,
	})
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("creating pool "+req.Name, err)
	}
	return poolObserved(req.ParentProviderID, p), nil
}

func (r *Resources) createReplica(ctx context.Context, req cloudresources.CreateRequest) (cloudresources.Observed, error) {
	var spec replicaSpec
	if err := decodeSpec(req.Spec, &spec); err != nil {
		return cloudresources.Observed{}, err
	}
	if spec.Network != "" {
		return cloudresources.Observed{}, refused("spec.network must be resolved to private_network_uuid")
	}
	rep, _, err := r.client.Databases.CreateReplica(ctx, req.ParentProviderID, &godo.DatabaseCreateReplicaRequest{
		Name: req.Name, Region: spec.Region, Size: spec.Size, StorageSizeMib: spec.StorageSizeMib,
		PrivateNetworkUUID: spec.PrivateNetworkUUID, Tags: req.Owner.Tags(),
	})
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("creating replica "+req.Name, err)
	}
	return replicaObserved(req.ParentProviderID, rep), nil
}

// getChild reads a child named name inside cluster parent.
func (r *Resources) getChild(ctx context.Context, kind, parent, name string) (cloudresources.Observed, error) {
	what := "reading " + kind + " " + name
	switch kind {
	case KindUser:
		u, _, err := r.client.Databases.GetUser(ctx, parent, name)
		if err != nil {
			return cloudresources.Observed{}, doprovider.MapError(what, err)
		}
		return userObserved(parent, u), nil
	case KindDatabase:
		d, _, err := r.client.Databases.GetDB(ctx, parent, name)
		if err != nil {
			return cloudresources.Observed{}, doprovider.MapError(what, err)
		}
		return databaseObserved(parent, d), nil
	case KindPool:
		p, _, err := r.client.Databases.GetPool(ctx, parent, name)
		if err != nil {
			return cloudresources.Observed{}, doprovider.MapError(what, err)
		}
		return poolObserved(parent, p), nil
	case KindReplica:
		rep, _, err := r.client.Databases.GetReplica(ctx, parent, name)
		if err != nil {
			return cloudresources.Observed{}, doprovider.MapError(what, err)
		}
		o := replicaObserved(parent, rep)
		o.Secrets = nil // only a create's answer is sealed
		return o, nil
	}
	return cloudresources.Observed{}, unsupported(kind)
}

// RotateSecrets implements cloudresources.SecretRotator for a cluster (its
// admin user) and a database user: reset_auth issues a new password, and
// the URIs are written with it.
func (r *Resources) RotateSecrets(ctx context.Context, ref cloudresources.Ref) (cloudresources.SecretValues, error) {
	clusterID, user := ref.ProviderID, "doadmin"
	switch ref.Kind {
	case KindCluster:
	case KindUser:
		clusterID, user = ref.ParentProviderID, ref.ProviderID
	default:
		return nil, refused("the secrets of a %s cannot be issued again", ref.Kind)
	}
	db, _, err := r.client.Databases.Get(ctx, clusterID)
	if err != nil {
		return nil, doprovider.MapError("reading database cluster "+clusterID, err)
	}
	u, _, err := r.client.Databases.ResetUserAuth(ctx, clusterID, user, &godo.DatabaseResetUserAuthRequest{})
	if err != nil {
		return nil, doprovider.MapError("resetting the password of "+user+" in "+clusterID, err)
	}
	out := cloudresources.SecretValues{"password": u.Password}
	if c := db.Connection; c != nil {
		out["uri"] = postgresURI(user, u.Password, c.Host, strconv.Itoa(c.Port), c.Database)
	}
	if c := db.PrivateConnection; c != nil && c.Host != "" {
		out["privateUri"] = postgresURI(user, u.Password, c.Host, strconv.Itoa(c.Port), c.Database)
	}
	return out, nil
}

// ResolveInstances implements cloudresources.InstanceResolver: a
// firewall's instances become droplet rules after its own rules.
func (r *Resources) ResolveInstances(kind string, raw json.RawMessage, servers map[string]string) (json.RawMessage, error) {
	if kind != KindFirewall {
		return raw, nil
	}
	var spec firewallSpec
	if err := decodeSpec(raw, &spec); err != nil {
		return nil, err
	}
	for _, id := range spec.Instances {
		server, ok := servers[id]
		if !ok || server == "" {
			return nil, refused("instance %s has no droplet", id)
		}
		spec.Rules = append(spec.Rules, firewallRule{Type: "droplet", Value: server})
	}
	spec.Instances = nil
	return json.Marshal(spec)
}

func (r *Resources) putFirewall(ctx context.Context, parent string, spec firewallSpec) error {
	if len(spec.Instances) > 0 {
		// Instances are resolved to droplet rules before the call.
		return refused("spec.instances must be resolved to droplet rules")
	}
	rules := make([]*godo.DatabaseFirewallRule, 0, len(spec.Rules))
	for _, rule := range spec.Rules {
		rules = append(rules, &godo.DatabaseFirewallRule{Type: rule.Type, Value: rule.Value})
	}
	_, err := r.client.Databases.UpdateFirewallRules(ctx, parent, &godo.DatabaseUpdateFirewallRulesRequest{Rules: rules})
	if err != nil {
		return doprovider.MapError("setting the firewall of "+parent, err)
	}
	return nil
}

// getFirewall reads the cluster's rule set; its provider id is the
// cluster's.
func (r *Resources) getFirewall(ctx context.Context, parent string) (cloudresources.Observed, error) {
	rules, _, err := r.client.Databases.GetFirewallRules(ctx, parent)
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("reading the firewall of "+parent, err)
	}
	spec := firewallSpec{Rules: make([]firewallRule, 0, len(rules))}
	for _, rule := range rules {
		spec.Rules = append(spec.Rules, firewallRule{Type: rule.Type, Value: rule.Value})
	}
	return cloudresources.Observed{
		Ref:    cloudresources.Ref{Kind: KindFirewall, ParentProviderID: parent, ProviderID: parent},
		Status: "active", Ready: true, Spec: mustJSON(spec), Labels: []string{}, Outputs: map[string]string{},
	}, nil
}

// Observed forms of godo's answers.

func clusterObserved(db *godo.Database) cloudresources.Observed {
	spec := clusterSpec{
		Name: db.Name, Engine: db.EngineSlug, Version: db.VersionSlug, Region: db.RegionSlug, Size: db.SizeSlug,
		NumNodes: db.NumNodes, StorageSizeMib: db.StorageSizeMib, PrivateNetworkUUID: db.PrivateNetworkUUID, ProjectID: db.ProjectID,
	}
	if w := db.MaintenanceWindow; w != nil && w.Day != "" {
		spec.MaintenanceWindow = &maintenanceWindow{Day: w.Day, Hour: w.Hour}
	}
	if a := db.StorageAutoscale; a != nil {
		spec.StorageAutoscale = &storageAutoscale{Enabled: a.Enabled, ThresholdPercent: a.ThresholdPercent, IncrementGiB: a.IncrementGib}
	}
	outputs := map[string]string{"version": db.VersionSlug, "status": db.Status}
	secrets := connectionOutputs(outputs, db.Connection, db.PrivateConnection)
	return cloudresources.Observed{
		Ref:  cloudresources.Ref{Kind: KindCluster, ProviderID: db.ID},
		Name: db.Name, Region: db.RegionSlug, Status: db.Status, Ready: db.Status == "online",
		Spec: mustJSON(spec), Labels: nonNil(db.Tags), Outputs: outputs, Secrets: secrets,
		CreatedAt: epochMillis(db.CreatedAt.UnixMilli()),
	}
}

func userObserved(parent string, u *godo.DatabaseUser) cloudresources.Observed {
	return cloudresources.Observed{
		Ref:  cloudresources.Ref{Kind: KindUser, ParentProviderID: parent, ProviderID: u.Name},
		Name: u.Name, Status: "active", Ready: true, Spec: mustJSON(nameSpec{Name: u.Name}), Labels: []string{},
		Outputs: map[string]string{"name": u.Name, "role": u.Role},
	}
}

func databaseObserved(parent string, d *godo.DatabaseDB) cloudresources.Observed {
	return cloudresources.Observed{
		Ref:  cloudresources.Ref{Kind: KindDatabase, ParentProviderID: parent, ProviderID: d.Name},
		Name: d.Name, Status: "active", Ready: true, Spec: mustJSON(nameSpec{Name: d.Name}), Labels: []string{},
		Outputs: map[string]string{"name": d.Name},
	}
}

func poolObserved(parent string, p *godo.DatabasePool) cloudresources.Observed {
	outputs := map[string]string{"name": p.Name}
	secrets := connectionOutputs(outputs, p.Connection, p.PrivateConnection)
	if p.User != "" {
		outputs["user"] = p.User
	}
	return cloudresources.Observed{
		Ref:  cloudresources.Ref{Kind: KindPool, ParentProviderID: parent, ProviderID: p.Name},
		Name: p.Name, Status: "active", Ready: true,
		Spec:   mustJSON(poolSpec{Name: p.Name, User: p.User, DB: p.Database, Size: p.Size, Mode: p.Mode}),
		Labels: []string{}, Outputs: outputs, Secrets: secrets,
	}
}

func replicaObserved(parent string, rep *godo.DatabaseReplica) cloudresources.Observed {
	outputs := map[string]string{"status": rep.Status}
	secrets := connectionOutputs(outputs, rep.Connection, rep.PrivateConnection)
	return cloudresources.Observed{
		Ref:  cloudresources.Ref{Kind: KindReplica, ParentProviderID: parent, ProviderID: rep.Name},
		Name: rep.Name, Region: rep.Region, Status: rep.Status, Ready: rep.Status == "online",
		Spec: mustJSON(replicaSpec{
			Name: rep.Name, Region: rep.Region, Size: rep.Size, StorageSizeMib: rep.StorageSizeMib, PrivateNetworkUUID: rep.PrivateNetworkUUID,
		}),
		Labels: nonNil(rep.Tags), Outputs: outputs, Secrets: secrets, CreatedAt: epochMillis(rep.CreatedAt.UnixMilli()),
	}
}

// connectionOutputs writes a connection's plain outputs into outputs and
// answers its secret ones: the password and the uris, only when the answer
// carries a password (a create's), else none.
func connectionOutputs(outputs map[string]string, public, private *godo.DatabaseConnection) cloudresources.SecretValues {
	if public == nil {
		return nil
	}
	outputs["host"], outputs["port"] = public.Host, strconv.Itoa(public.Port)
	outputs["database"], outputs["user"] = public.Database, public.User
	if private != nil {
		outputs["privateHost"] = private.Host
	}
	if public.Password == "" {
		return nil
	}
	secrets := cloudresources.SecretValues{"password": public.Password, "uri": public.URI}
	if private != nil && private.URI != "" {
		secrets["privateUri"] = private.URI
	}
	return secrets
}

// postgresURI is how user reaches database on host:port, as DigitalOcean
// writes a cluster's uri.
func postgresURI(user, password, host, port, database string) string {
	u := url.URL{Scheme: "postgresql", User: url.UserPassword(user, password), Host: host + ":" + port, Path: "/" + database, RawQuery: "sslmode=require"}
	return u.String()
}

func decodeSpec(raw json.RawMessage, v any) error {
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("digitalocean: the spec: %v: %w", err, providers.ErrRefused)
	}
	return nil
}

func sameJSON(a, b any) bool { return string(mustJSON(a)) == string(mustJSON(b)) }

// mustJSON marshals the package's own spec types, which cannot fail.
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// epochMillis is zero for godo's zero time (an answer without one).
func epochMillis(ms int64) int64 { return max(ms, 0) }

func refused(format string, args ...any) error {
	return fmt.Errorf("digitalocean: %s: %w", fmt.Sprintf(format, args...), providers.ErrRefused)
}

func unsupported(kind string) error { return refused("kind %q is not served", kind) }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
