// Package sandboxes is the sandbox domain's store (docs/sandboxes.md):
// templates, sandboxes and their lifetimes. A sandbox's workload is an
// instance that store/instances creates and converges; this package holds
// the sandbox row, its deadline and its end. It is the only writer of
// sandbox_templates and sandboxes.
package sandboxes

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	coresecrets "github.com/better-compute/better-compute/core/secrets"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/flavors"
	"github.com/better-compute/better-compute/store/images"
	"github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/pools"
)

// Template is a sandbox template as the API answers it.
type Template struct {
	ID              string   `json:"id"`
	TenantID        string   `json:"tenantId"`
	OwnerIdentityID string   `json:"ownerIdentityId"`
	Name            string   `json:"name"`
	PoolID          string   `json:"poolId"`
	FlavorID        string   `json:"flavorId"`
	ImageID         string   `json:"imageId"`
	Runtime         string   `json:"runtime"`
	Command         []string `json:"command,omitempty"`
	// DefaultTTLSeconds is a sandbox's lifetime when its create names
	// none; MaxTTLSeconds bounds what a create or an extend may ask.
	DefaultTTLSeconds int    `json:"defaultTtlSeconds"`
	MaxTTLSeconds     int    `json:"maxTtlSeconds"`
	TTLAction         string `json:"ttlAction"`
	WarmPoolSize      int    `json:"warmPoolSize"`
	// Volumes are mounted into every sandbox (and warm workload) of the
	// template, which runs on their host.
	Volumes []TemplateVolume `json:"volumes,omitempty"`
	// Env is the guest's environment: plain values, or secret://
	// references its node fetches resolved (never shown resolved).
	Env map[string]string `json:"env,omitempty"`
	// Version grows with every update.
	Version int64 `json:"version"`
	// VCPU, MemoryMiB and GPUs are the flavor's: what each sandbox takes.
	VCPU      int   `json:"vcpu"`
	MemoryMiB int64 `json:"memoryMiB"`
	GPUs      int   `json:"gpus"`
	CreatedAt int64 `json:"createdAt" unit:"epoch-ms"`
	UpdatedAt int64 `json:"updatedAt" unit:"epoch-ms"`
}

// TemplateSpec is what a template is made of (create, and update's
// result).
type TemplateSpec struct {
	Name, PoolID, FlavorID, ImageID string
	Runtime                         coresandboxes.Runtime
	Command                         []string
	DefaultTTLSeconds               int
	MaxTTLSeconds                   int
	TTLAction                       coresandboxes.TTLAction
	WarmPoolSize                    int
	Volumes                         []TemplateVolume
	Env                             map[string]string
}

// Template defaults: E2B's five minutes, an hour at most.
const (
	DefaultTTLSeconds    = 300
	DefaultMaxTTLSeconds = 3600
)

var templateColumns = `t.id, t.tenant_id, t.owner_identity_id, t.name, t.pool_id, t.flavor_id, t.image_id, t.runtime, t.command,
	t.default_ttl_seconds, t.max_ttl_seconds, t.ttl_action, t.warm_pool_size, t.version, f.vcpu, f.memory_mib, f.gpus,
	` + ms("t.created_at") + `, ` + ms("t.updated_at") + `, ` + templateVolumesColumn + `, t.env`

const templateFrom = ` FROM sandbox_templates t JOIN flavors f ON f.id = t.flavor_id`

func ms(col string) string { return `(floor(extract(epoch FROM ` + col + `) * 1000)::bigint)` }

func scanTemplate(row pgx.Row) (Template, error) {
	var t Template
	var volumes, env []byte
	err := row.Scan(&t.ID, &t.TenantID, &t.OwnerIdentityID, &t.Name, &t.PoolID, &t.FlavorID, &t.ImageID, &t.Runtime, &t.Command,
		&t.DefaultTTLSeconds, &t.MaxTTLSeconds, &t.TTLAction, &t.WarmPoolSize, &t.Version, &t.VCPU, &t.MemoryMiB, &t.GPUs,
		&t.CreatedAt, &t.UpdatedAt, &volumes, &env)
	if len(t.Command) == 0 {
		t.Command = nil
	}
	if err == nil {
		err = json.Unmarshal(volumes, &t.Volumes)
	}
	if len(t.Volumes) == 0 {
		t.Volumes = nil
	}
	if err == nil {
		err = json.Unmarshal(env, &t.Env)
	}
	if len(t.Env) == 0 {
		t.Env = nil
	}
	return t, err
}

func templateNotFound(id string) error {
	return core.Errorf(core.CodeNotFound, "sandbox template %s not found", id)
}

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// withDefaults fills what a create leaves out.
func (s TemplateSpec) withDefaults() TemplateSpec {
	if s.Runtime == "" {
		s.Runtime = coresandboxes.RuntimeGVisor
	}
	if s.DefaultTTLSeconds == 0 {
		s.DefaultTTLSeconds = min(DefaultTTLSeconds, max(s.MaxTTLSeconds, 1))
	}
	if s.MaxTTLSeconds == 0 {
		s.MaxTTLSeconds = max(DefaultMaxTTLSeconds, s.DefaultTTLSeconds)
	}
	if s.TTLAction == "" {
		s.TTLAction = coresandboxes.TTLDelete
	}
	if s.Command == nil {
		s.Command = []string{}
	}
	if s.Env == nil {
		s.Env = map[string]string{}
	}
	return s
}

// check checks a template's parts against the tenant's view: a live
// vps-host pool it may see, one of the pool's live flavors whose runtime
// the template's runtime needs, an uploaded image it may see, TTL bounds
// in order.
func (s TemplateSpec) check(ctx context.Context, tx store.Tx, tenantID string) error {
	pool, err := pools.View(ctx, tx, tenantID, s.PoolID)
	if err != nil {
		return err
	}
	if pool.ArchivedAt != nil {
		return core.Errorf(core.CodeInvalidState, "pool %s is archived", pool.ID).WithDetails(map[string]any{"field": "poolId", "reason": "archived"})
	}
	if pool.Class != instances.ClassVPSHost {
		return badField("poolId", "class", "pool %s is a %s pool; sandboxes run on vps-host pools", pool.ID, pool.Class)
	}
	f, err := flavors.Get(ctx, tx, pool.ID, s.FlavorID)
	if err != nil {
		return err
	}
	if want := s.Runtime.FlavorRuntime(); f.Runtime != want {
		return badField("runtime", "flavorRuntime", "runtime %s needs a %s flavor; flavor %s is %s", s.Runtime, want, f.ID, f.Runtime)
	}
	im, err := images.Get(ctx, tx, tenantID, s.ImageID)
	if err != nil {
		return err
	}
	if im.State != coreimages.StateAvailable {
		return core.Errorf(core.CodeInvalidState, "image %s is %s; its bytes are not uploaded", im.ID, im.State).
			WithDetails(map[string]any{"field": "imageId", "reason": "notUploaded"})
	}
	if s.DefaultTTLSeconds > s.MaxTTLSeconds {
		return badField("defaultTtlSeconds", "aboveMax", "defaultTtlSeconds %d is above maxTtlSeconds %d", s.DefaultTTLSeconds, s.MaxTTLSeconds)
	}
	if len(s.Command) > 0 && s.Runtime == coresandboxes.RuntimeVM {
		return badField("command", "runtime", "command is for container runtimes only")
	}
	if err := checkEnv(tenantID, s.Runtime, s.Env); err != nil {
		return err
	}
	if s.TTLAction == coresandboxes.TTLSnapshot && s.Runtime == coresandboxes.RuntimeVM {
		return badField("ttlAction", "runtime", "ttlAction snapshot needs a gvisor or runc template; vm sandboxes have no snapshots yet")
	}
	return checkVolumes(ctx, tx, tenantID, s.PoolID, s.Runtime, s.Volumes)
}

func nameTaken(err error, name string) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23505" {
		return core.Errorf(core.CodeConflict, "a sandbox template named %q exists", name).WithDetails(map[string]any{"field": "name"})
	}
	return err
}

// CreateTemplate inserts the tenant's template and its authorization row
// (typ is the template type's full name; owner the caller).
func CreateTemplate(ctx context.Context, tx store.Tx, typ, tenantID, ownerID string, s TemplateSpec) (Template, error) {
	s = s.withDefaults()
	if err := s.check(ctx, tx, tenantID); err != nil {
		return Template{}, err
	}
	id := core.NewID("tpl")
	if _, err := tx.Exec(ctx, `INSERT INTO sandbox_templates (id, tenant_id, owner_identity_id, name, pool_id, flavor_id, image_id,
			runtime, command, default_ttl_seconds, max_ttl_seconds, ttl_action, warm_pool_size, env)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		id, tenantID, ownerID, s.Name, s.PoolID, s.FlavorID, s.ImageID, string(s.Runtime), s.Command,
		s.DefaultTTLSeconds, s.MaxTTLSeconds, string(s.TTLAction), s.WarmPoolSize, s.Env); err != nil {
		return Template{}, nameTaken(err, s.Name)
	}
	if err := putTemplateVolumes(ctx, tx, id, s.Volumes); err != nil {
		return Template{}, err
	}
	if err := store.PutAuthzResource(ctx, tx, store.AuthzResource{Type: typ, ID: id, TenantID: tenantID, OwnerID: ownerID}); err != nil {
		return Template{}, err
	}
	return GetTemplate(ctx, tx, tenantID, id)
}

// GetTemplate reads one of the tenant's live templates.
func GetTemplate(ctx context.Context, tx store.Tx, tenantID, id string) (Template, error) {
	t, err := scanTemplate(tx.QueryRow(ctx, `SELECT `+templateColumns+templateFrom+`
		WHERE t.id = $1 AND t.tenant_id = $2 AND t.deleted_at IS NULL`, id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Template{}, templateNotFound(id)
	}
	return t, err
}

// ListTemplates reads the tenant's live templates the projection holds a
// row for, newest first (a page after its key, plus one).
func ListTemplates(ctx context.Context, tx store.Tx, typ, tenantID string, page store.PageQuery) ([]Template, error) {
	created := ms("t.created_at")
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+templateColumns+templateFrom+`
		WHERE t.tenant_id = $1 AND t.deleted_at IS NULL AND `+store.VisibleIn("t.id", "$1", "$2", false)+`
			AND ($4 OR (`+created+`, t.id) < ($5, $6))
		ORDER BY `+created+` DESC, t.id DESC LIMIT $3`, tenantID, typ, page.Fetch(), page.First(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Template, error) { return scanTemplate(r) })
}

// TemplateChange is what an update changes; nil keeps a field.
type TemplateChange struct {
	FlavorID, ImageID *string
	Runtime           *coresandboxes.Runtime
	Command           *[]string
	DefaultTTLSeconds *int
	MaxTTLSeconds     *int
	TTLAction         *coresandboxes.TTLAction
	WarmPoolSize      *int
	// Volumes, when set, replaces the template's volumes.
	Volumes *[]TemplateVolume
	// Env, when set, replaces the template's environment.
	Env *map[string]string
}

// UpdateTemplate applies ch to the tenant's template and checks the
// result as a create would; the version grows. Sandboxes already made
// keep what they were made from.
func UpdateTemplate(ctx context.Context, tx store.Tx, tenantID, id string, ch TemplateChange) (Template, error) {
	t, err := GetTemplate(ctx, tx, tenantID, id)
	if err != nil {
		return Template{}, err
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM sandbox_templates WHERE id = $1 FOR UPDATE`, id); err != nil {
		return Template{}, err
	}
	s := TemplateSpec{Name: t.Name, PoolID: t.PoolID, FlavorID: t.FlavorID, ImageID: t.ImageID,
		Runtime: coresandboxes.Runtime(t.Runtime), Command: t.Command, DefaultTTLSeconds: t.DefaultTTLSeconds,
		MaxTTLSeconds: t.MaxTTLSeconds, TTLAction: coresandboxes.TTLAction(t.TTLAction), WarmPoolSize: t.WarmPoolSize}
	set(&s.FlavorID, ch.FlavorID)
	set(&s.ImageID, ch.ImageID)
	set(&s.Runtime, ch.Runtime)
	set(&s.Command, ch.Command)
	set(&s.DefaultTTLSeconds, ch.DefaultTTLSeconds)
	set(&s.MaxTTLSeconds, ch.MaxTTLSeconds)
	set(&s.TTLAction, ch.TTLAction)
	set(&s.WarmPoolSize, ch.WarmPoolSize)
	s.Volumes = t.Volumes
	set(&s.Volumes, ch.Volumes)
	s.Env = t.Env
	set(&s.Env, ch.Env)
	s = s.withDefaults()
	if err := s.check(ctx, tx, tenantID); err != nil {
		return Template{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE sandbox_templates SET flavor_id = $2, image_id = $3, runtime = $4, command = $5,
			default_ttl_seconds = $6, max_ttl_seconds = $7, ttl_action = $8, warm_pool_size = $9, env = $10, version = version + 1,
			updated_at = now()
		WHERE id = $1`, id, s.FlavorID, s.ImageID, string(s.Runtime), s.Command, s.DefaultTTLSeconds, s.MaxTTLSeconds,
		string(s.TTLAction), s.WarmPoolSize, s.Env); err != nil {
		return Template{}, err
	}
	if ch.Volumes != nil {
		if err := putTemplateVolumes(ctx, tx, id, s.Volumes); err != nil {
			return Template{}, err
		}
	}
	return GetTemplate(ctx, tx, tenantID, id)
}

func set[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// DeleteTemplate deletes the tenant's template (soft: sandboxes name it)
// and its authorization row. A template live sandboxes run from is
// INVALID_STATE reason inUse.
func DeleteTemplate(ctx context.Context, tx store.Tx, typ, tenantID, id string) (Template, error) {
	t, err := GetTemplate(ctx, tx, tenantID, id)
	if err != nil {
		return Template{}, err
	}
	var live int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM sandboxes WHERE template_id = $1 AND state IN ('live', 'deleting')`, id).Scan(&live); err != nil {
		return Template{}, err
	}
	if live > 0 {
		return Template{}, core.Errorf(core.CodeInvalidState, "%d sandboxes of template %s are live", live, id).
			WithDetails(map[string]any{"reason": "inUse", "sandboxes": live})
	}
	if _, err := tx.Exec(ctx, `UPDATE sandbox_templates SET deleted_at = now(), updated_at = now() WHERE id = $1`, id); err != nil {
		return Template{}, err
	}
	return t, store.DeleteAuthzResource(ctx, tx, typ, id)
}

// Bounds of a template's environment.
const (
	MaxEnv           = 128
	MaxEnvValueBytes = 32 << 10
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// checkEnv checks a template's environment: at most MaxEnv names of the
// shell's grammar, values of at most MaxEnvValueBytes, a secret://
// reference naming a secret of the tenant (INVALID_INPUT field env, reason
// name, size, secretRef); none for a vm (reason runtime: QEMU guests get
// user data instead).
func checkEnv(tenantID string, runtime coresandboxes.Runtime, env map[string]string) error {
	if len(env) == 0 {
		return nil
	}
	if runtime == coresandboxes.RuntimeVM {
		return badField("env", "runtime", "env is for container runtimes only; a vm guest reads its user data")
	}
	if len(env) > MaxEnv {
		return badField("env", "size", "env has %d names, more than %d", len(env), MaxEnv)
	}
	for name, value := range env {
		switch {
		case !envName.MatchString(name):
			return badField("env", "name", "env name %q is not a shell variable name", name)
		case len(value) > MaxEnvValueBytes:
			return badField("env", "size", "env %s is longer than %d bytes", name, MaxEnvValueBytes)
		case instances.IsSecretRef(value):
			owner, _, err := coresecrets.ParseRef(value)
			if err != nil {
				return badField("env", "secretRef", "env %s: %v", name, err)
			}
			if owner != tenantID {
				return badField("env", "secretRef", "env %s must name a secret of tenant %s", name, tenantID)
			}
		}
	}
	return nil
}

// NamesSecrets says whether env holds a secret:// reference.
func NamesSecrets(env map[string]string) bool {
	for _, v := range env {
		if instances.IsSecretRef(v) {
			return true
		}
	}
	return false
}
