// Package rollouts is the releases and rollouts domain's store
// (docs/rollouts.md): the releases table (name@version over fleet
// images), the rollouts and their rollout_nodes, and every step a rollout
// takes on a node. It is the only writer of releases, rollouts and
// rollout_nodes. The rows are the rollout's state: the workflow only asks
// Step to advance them, so a worker killed mid-rollout resumes where the
// rows say, and a step done twice finds its effect already recorded.
package rollouts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	corerollouts "github.com/better-compute/better-compute/core/rollouts"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/images"
)

// Id prefixes.
const (
	ReleasePrefix = "rel"
	RolloutPrefix = "rollout"
)

// Artifact is one of a release's artifacts: its name (the agent asks for
// it by name) and the fleet image holding its bytes.
type Artifact struct {
	Name    string `json:"name"`
	ImageID string `json:"imageId"`
}

// Release is a releases row.
type Release struct {
	ID           string     `json:"id"`
	Name         string     `json:"name"`
	Version      string     `json:"version"`
	Kind         string     `json:"kind"`
	Artifacts    []Artifact `json:"artifacts"`
	AgentVersion string     `json:"agentVersion,omitempty"`
	CreatedBy    string     `json:"createdBy"`
	CreatedAt    int64      `json:"createdAt"`
}

// RegisterRequest is one releases.register, in the root tenant.
type RegisterRequest struct {
	TenantID     string
	Name         string
	Version      string
	Kind         string
	Artifacts    []Artifact
	AgentVersion string
	By           string
}

const releaseColumns = `r.id, r.name, r.version, r.kind, r.artifacts, r.agent_version, r.created_by,
	(floor(extract(epoch FROM r.created_at) * 1000)::bigint)`

func scanRelease(row pgx.Row) (Release, error) {
	var r Release
	var arts []byte
	if err := row.Scan(&r.ID, &r.Name, &r.Version, &r.Kind, &arts, &r.AgentVersion, &r.CreatedBy, &r.CreatedAt); err != nil {
		return Release{}, err
	}
	return r, json.Unmarshal(arts, &r.Artifacts)
}

func invalidState(reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidState, format, args...).WithDetails(map[string]any{"reason": reason})
}

// RegisterRelease records a release. Only kind bcd is served (others are
// UNSUPPORTED: the seam is the kind's artifact check and its node
// command). Every artifact must be a fleet image (the root tenant's) that
// is available and verified, in format binary for bcd (else INVALID_STATE,
// reason artifact); a bcd release names a "bcd" artifact and the
// agentVersion its build says in its hello. name@version is unique: the
// same release again is answered as it is, another one CONFLICT.
func RegisterRelease(ctx context.Context, tx store.Tx, p RegisterRequest) (Release, error) {
	if p.Kind != corerollouts.KindBCD {
		return Release{}, core.Errorf(core.CodeUnsupported, "release kind %q is not served yet; bcd is", p.Kind).
			WithDetails(map[string]any{"field": "kind", "reason": "kind"})
	}
	if p.AgentVersion == "" {
		return Release{}, core.Errorf(core.CodeInvalidInput, "a bcd release names the agentVersion its build reports").
			WithDetails(map[string]any{"field": "agentVersion", "reason": "required"})
	}
	if !slices.ContainsFunc(p.Artifacts, func(a Artifact) bool { return a.Name == corerollouts.KindBCD }) {
		return Release{}, core.Errorf(core.CodeInvalidInput, "a bcd release has an artifact named bcd").
			WithDetails(map[string]any{"field": "artifacts", "reason": "required"})
	}
	seen := map[string]bool{}
	for _, a := range p.Artifacts {
		if seen[a.Name] {
			return Release{}, core.Errorf(core.CodeInvalidInput, "artifact %q is named twice", a.Name).
				WithDetails(map[string]any{"field": "artifacts", "reason": "duplicate"})
		}
		seen[a.Name] = true
		im, err := images.Get(ctx, tx, p.TenantID, a.ImageID)
		if err != nil {
			return Release{}, err
		}
		switch {
		case im.TenantID != p.TenantID:
			return Release{}, invalidState("artifact", "artifact %s: image %s is not a fleet image", a.Name, im.ID)
		case im.State != coreimages.StateAvailable:
			return Release{}, invalidState("artifact", "artifact %s: image %s is %s, not available", a.Name, im.ID, im.State)
		case !im.Verified:
			return Release{}, invalidState("artifact", "artifact %s: image %s's signature is not verified by a fleet signer", a.Name, im.ID)
		case im.Format != coreimages.FormatBinary:
			return Release{}, invalidState("artifact", "artifact %s: image %s is %s, not binary", a.Name, im.ID, im.Format)
		}
	}
	arts, err := json.Marshal(p.Artifacts)
	if err != nil {
		return Release{}, err
	}
	r, err := scanRelease(tx.QueryRow(ctx, `INSERT INTO releases AS r (id, tenant_id, name, version, kind, artifacts, agent_version, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (name, version) DO NOTHING RETURNING `+releaseColumns,
		core.NewID(ReleasePrefix), p.TenantID, p.Name, p.Version, p.Kind, arts, p.AgentVersion, p.By))
	if !errors.Is(err, pgx.ErrNoRows) {
		return r, err
	}
	have, err := scanRelease(tx.QueryRow(ctx, `SELECT `+releaseColumns+` FROM releases r WHERE r.name = $1 AND r.version = $2`,
		p.Name, p.Version))
	if err != nil {
		return Release{}, err
	}
	if have.Kind != p.Kind || have.AgentVersion != p.AgentVersion || !slices.Equal(have.Artifacts, p.Artifacts) {
		return Release{}, core.Errorf(core.CodeConflict, "release %s@%s exists with other contents", p.Name, p.Version).
			WithDetails(map[string]any{"releaseId": have.ID})
	}
	return have, nil
}

// GetRelease reads a release; a missing one is NOT_FOUND.
func GetRelease(ctx context.Context, tx store.DBTX, id string) (Release, error) {
	r, err := scanRelease(tx.QueryRow(ctx, `SELECT `+releaseColumns+` FROM releases r WHERE r.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Release{}, core.Errorf(core.CodeNotFound, "release %s not found", id)
	}
	return r, err
}

// previousRelease is the newest release of r's name created before r, or
// nil when there is none.
func previousRelease(ctx context.Context, tx store.DBTX, r Release) (*Release, error) {
	prev, err := scanRelease(tx.QueryRow(ctx, `SELECT `+releaseColumns+` FROM releases r
		WHERE r.name = $1 AND r.kind = $2 AND (r.created_at, r.id) < (SELECT created_at, id FROM releases WHERE id = $3)
		ORDER BY r.created_at DESC, r.id DESC LIMIT 1`, r.Name, r.Kind, r.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return &prev, err
}

// ListReleases reads releases oldest first (creation millisecond, then
// id), in name when it is not "": the page after its key, plus one.
func ListReleases(ctx context.Context, tx store.DBTX, name string, page store.PageQuery) ([]Release, error) {
	if page.Limit < 1 {
		return nil, fmt.Errorf("rollouts: release limit %d", page.Limit)
	}
	k := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+releaseColumns+` FROM releases r
		WHERE ($1 = '' OR r.name = $1) AND (`+store.MsOf("r.created_at")+`, r.id) > ($3, $4)
		ORDER BY `+store.MsOf("r.created_at")+`, r.id LIMIT $2`, name, page.Fetch(), k.At, k.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Release, error) { return scanRelease(r) })
}

// ArtifactImage answers the image holding release releaseID's artifact
// name, available; anything else (no such release, artifact or bytes) is
// NOT_FOUND.
func ArtifactImage(ctx context.Context, tx store.DBTX, releaseID, name string) (coreimages.Image, error) {
	var tenantID, imageID string
	err := tx.QueryRow(ctx, `SELECT r.tenant_id, a->>'imageId' FROM releases r, jsonb_array_elements(r.artifacts) a
		WHERE r.id = $1 AND a->>'name' = $2`, releaseID, name).Scan(&tenantID, &imageID)
	if errors.Is(err, pgx.ErrNoRows) {
		return coreimages.Image{}, core.Errorf(core.CodeNotFound, "release %s has no artifact %q", releaseID, name)
	}
	if err != nil {
		return coreimages.Image{}, err
	}
	im, err := images.Get(ctx, tx, tenantID, imageID)
	if err == nil && im.State != coreimages.StateAvailable {
		return coreimages.Image{}, images.NotFound(imageID)
	}
	return im, err
}
