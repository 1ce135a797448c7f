package cloudresources

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"

	"go.temporal.io/sdk/temporal"

	"github.com/better-compute/better-compute/core"
	rules "github.com/better-compute/better-compute/core/cloudresources"
	coresecrets "github.com/better-compute/better-compute/core/secrets"
	drivers "github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/cloudresources"
	"github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/provideraccounts"
	"github.com/better-compute/better-compute/store/secrets"
)

// Resources are the cloud-resource workflow's activities. A round reads
// the row in one transaction, calls the provider with none open, and
// records what it answered (sealing secret outputs) in another.
type Resources struct {
	Store     *store.Store
	Providers providers.Factory
	Secrets   *secrets.Vault
	// Tuning of the reconciler (tests shorten it).
	Tuning Tuning
	// Temporal and TaskQueue start workflows (the schedule's activity).
	StartWorkflow func(ctx context.Context, p ResourceParams) error
}

// Tuning are the reconciler's bounds.
type Tuning struct {
	// LostCreateWait is how long a create whose answer was lost is looked
	// for by name and owner before another is sent: the provider's
	// listings may lag its creates (0: 2 minutes).
	LostCreateWait time.Duration
	// DriftLimit is how many in-place fixes in a row of one field the
	// provider rewrote trip the drift-loop breaker (0: 3).
	DriftLimit int
}

func (t Tuning) lostCreateWait() time.Duration {
	if t.LostCreateWait > 0 {
		return t.LostCreateWait
	}
	return 2 * time.Minute
}

func (t Tuning) driftLimit() int {
	if t.DriftLimit > 0 {
		return t.DriftLimit
	}
	return 3
}

// Errors the reconciler records as a resource's reason.
const (
	ReasonProviderRefused  = "providerRefused"
	ReasonNotFound         = "notFoundAtProvider"
	ReasonNotManaged       = "notManaged"
	ReasonManagedByAnother = "managedByAnother"
	ReasonDriftLoop        = "driftLoop"
	ReasonParentGone       = "parentGone"
	ReasonAccount          = "account"
	ReasonInstance         = "instance"
)

// round is what one reconciliation works with.
type round struct {
	t        domain.Target
	manifest *drivers.Manifest
	owner    drivers.Owner
	res      drivers.ProviderResources
	// secrets are the spec's SecretRefs resolved, by reference.
	secrets drivers.SecretValues
	// servers are the provider server ids of the instances the spec
	// names; spec is the spec in the provider's terms (instances resolved).
	servers map[string]string
	spec    json.RawMessage
}

// ReconcileResource moves one resource one step toward what its tenant wants:
// deletes (children first), releases, takes over, creates, updates in
// place, observes; then records what the provider answered. A 429, a 5xx
// or a timeout fails the activity, which Temporal retries with backoff
// (a 429 after its Retry-After): nothing is lost, the resource waits.
func (a *Resources) ReconcileResource(ctx context.Context, id string) (Progress, error) {
	rd, done, err := a.begin(ctx, id)
	if err != nil || done != nil {
		if done != nil {
			return *done, nil
		}
		return Progress{}, err
	}
	var stepErr error
	switch rd.t.Desired {
	case rules.DesiredDeleted:
		stepErr = a.deleteStep(ctx, rd)
	case rules.DesiredReleased:
		stepErr = a.releaseStep(ctx, rd)
	default:
		stepErr = a.presentStep(ctx, rd)
	}
	if stepErr != nil {
		if errors.Is(stepErr, providers.ErrRefused) {
			if err := a.markError(ctx, id, ReasonProviderRefused, stepErr.Error()); err != nil {
				return Progress{}, err
			}
			return a.progress(ctx, id)
		}
		return Progress{}, retryable(stepErr)
	}
	return a.progress(ctx, id)
}

// begin reads the target and opens its account; a resource that ended
// answers done.
func (a *Resources) begin(ctx context.Context, id string) (round, *Progress, error) {
	var rd round
	var cred providers.Credential
	var accountErr error
	err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		if rd.t, err = domain.LoadTarget(ctx, tx, id); err != nil {
			return err
		}
		if rules.Ended(rd.t.State) || rd.t.State == rules.StateDraft {
			return nil
		}
		acct, err := provideraccounts.Get(ctx, tx, rd.t.ProviderAccountID)
		if err != nil {
			accountErr = err
			return nil
		}
		token, err := provideraccounts.Token(ctx, tx, a.Secrets, acct, secrets.Use{Purpose: "provider-credential",
			IdentityKind: "workflow", IdentityID: id, ResourceType: rules.ResourceType, ResourceID: id})
		if err != nil {
			accountErr = err
			return nil
		}
		cred = providers.Credential{Kind: acct.Provider, Token: token, BaseURL: acct.BaseURL}
		if rd.t.Desired == rules.DesiredPresent {
			if rd.secrets, err = a.resolveSpecSecrets(ctx, tx, rd.t); err != nil {
				return err
			}
			if set := KindsOf(rd.t.Provider); set != nil {
				if m, ok := set.Lookup(rd.t.Kind); ok && len(m.Instances(rd.t.Spec)) > 0 {
					rd.servers, err = instances.ProviderServers(ctx, tx, rd.t.TenantID, rd.t.ProviderAccountID, m.Instances(rd.t.Spec))
				}
			}
		}
		return err
	})
	if err != nil {
		return round{}, nil, err
	}
	if rules.Ended(rd.t.State) || rd.t.State == rules.StateDraft {
		return round{}, &Progress{State: rd.t.State, Done: rules.Ended(rd.t.State)}, nil
	}
	if accountErr != nil {
		if err := a.markError(ctx, id, ReasonAccount, "the pool's provider account cannot be used: "+accountErr.Error()); err != nil {
			return round{}, nil, err
		}
		p, err := a.progress(ctx, id)
		return round{}, &p, err
	}
	set := KindsOf(rd.t.Provider)
	m, ok := set.Lookup(rd.t.Kind)
	if set == nil || !ok {
		return round{}, nil, temporal.NewNonRetryableApplicationError(fmt.Sprintf("kind %s of provider %s is not served", rd.t.Kind, rd.t.Provider), "UnknownKind", nil)
	}
	rd.manifest = m
	rd.owner = drivers.Owner{ResourceID: rd.t.ID, TenantID: rd.t.TenantID}
	if rd.res, err = Open(ctx, a.Providers, cred); err != nil {
		return round{}, nil, err
	}
	rd.spec = rd.t.Spec
	if named := m.Instances(rd.t.Spec); len(named) > 0 && rd.t.Desired == rules.DesiredPresent {
		// The instances a spec names are checked again before every
		// provider call, and named in the provider's terms.
		resolver, ok := rd.res.(drivers.InstanceResolver)
		for _, id := range named {
			if rd.servers[id] == "" || !ok {
				if err := a.markError(ctx, rd.t.ID, ReasonInstance, "instance "+id+" is not a live instance of the tenant with a server on the pool's account"); err != nil {
					return round{}, nil, err
				}
				p, err := a.progress(ctx, rd.t.ID)
				return round{}, &p, err
			}
		}
		if rd.spec, err = resolver.ResolveInstances(rd.t.Kind, rd.t.Spec, rd.servers); err != nil {
			return round{}, nil, err
		}
	}
	return rd, nil, nil
}

// resolveSpecSecrets opens every SecretRef the spec names, for the
// provider call of this round; the values never leave the activity.
func (a *Resources) resolveSpecSecrets(ctx context.Context, tx store.Tx, t domain.Target) (drivers.SecretValues, error) {
	refs := SpecSecretRefs(t.Spec)
	if len(refs) == 0 {
		return nil, nil
	}
	out := drivers.SecretValues{}
	for _, ref := range refs {
		v, err := a.Secrets.Resolve(ctx, tx, ref, secrets.Use{TenantID: t.TenantID, Purpose: "cloud-resource-spec",
			IdentityKind: "provider-account", IdentityID: t.ProviderAccountID, ResourceType: rules.ResourceType, ResourceID: t.ID})
		if err != nil {
			return nil, err
		}
		out[ref] = v
	}
	return out, nil
}

// SpecSecretRefs are the secret:// references a spec holds, anywhere in
// it, sorted and once each.
func SpecSecretRefs(spec json.RawMessage) []string {
	var v any
	if json.Unmarshal(spec, &v) != nil {
		return nil
	}
	seen := map[string]bool{}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			if strings.HasPrefix(x, coresecrets.Scheme) {
				seen[x] = true
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return slices.Sorted(maps.Keys(seen))
}

// deleteStep deletes a resource marked for deletion once its children
// are gone: one the provider never accepted without a call, one this
// deployment does not own at the provider never (it stays in error).
func (a *Resources) deleteStep(ctx context.Context, rd round) error {
	t := rd.t
	if len(t.LiveChildren) > 0 {
		return nil // their own workflows delete them; this one waits
	}
	ref := drivers.Ref{Kind: t.Kind, ParentProviderID: t.ParentProviderID, ProviderID: t.ProviderID}
	if t.ProviderID == "" {
		if !t.CreateSent || (t.ParentID != "" && t.ParentProviderID == "") || t.ParentEnded {
			return a.end(ctx, t.ID, rules.StateDeleted)
		}
		// A create may have been made whose answer was lost: find it.
		obs, err := rd.res.Observe(ctx, drivers.ObserveRequest{Ref: ref, Name: rd.manifest.ProviderName(t.ID, t.Spec), Owner: rd.owner})
		switch {
		case errors.Is(err, providers.ErrNotFound):
			if t.CreateSentAgo < a.Tuning.lostCreateWait() {
				return nil // the listing may lag the create: look again
			}
			return a.end(ctx, t.ID, rules.StateDeleted)
		case err != nil:
			return err
		}
		ref.ProviderID = obs.ProviderID
	} else if t.ParentID == "" {
		obs, err := rd.res.Observe(ctx, drivers.ObserveRequest{Ref: ref})
		switch {
		case errors.Is(err, providers.ErrNotFound):
			return a.end(ctx, t.ID, rules.StateDeleted)
		case err != nil:
			return err
		}
		if !rd.owner.Owns(obs.Labels) {
			return a.markError(ctx, t.ID, ReasonNotManaged,
				"the provider's resource does not carry this resource's ownership labels: it is not deleted there")
		}
	}
	if t.ParentEnded {
		return a.end(ctx, t.ID, rules.StateDeleted) // went with its parent
	}
	if err := rd.res.Delete(ctx, ref); err != nil && !errors.Is(err, providers.ErrNotFound) {
		return err
	}
	return a.end(ctx, t.ID, rules.StateDeleted)
}

// releaseStep removes the ownership labels and lets the resource go.
func (a *Resources) releaseStep(ctx context.Context, rd round) error {
	t := rd.t
	ref := drivers.Ref{Kind: t.Kind, ParentProviderID: t.ParentProviderID, ProviderID: t.ProviderID}
	err := rd.res.Unlabel(ctx, ref, rd.owner)
	switch {
	case err == nil, errors.Is(err, providers.ErrNotFound):
		return a.end(ctx, t.ID, rules.StateReleased)
	case errors.Is(err, providers.ErrRefused) && t.Adopted:
		return a.end(ctx, t.ID, rules.StateReleased)
	case errors.Is(err, providers.ErrRefused):
		return a.inTx(ctx, t.ID, func(tx store.Tx, t domain.Target) error {
			return domain.WithdrawRelease(ctx, tx, t, "the provider refused to let it go: "+err.Error())
		})
	}
	return err
}

// presentStep makes the provider hold the resource as its spec says.
func (a *Resources) presentStep(ctx context.Context, rd round) error {
	t := rd.t
	if t.ParentID != "" {
		if t.ParentEnded {
			return a.markError(ctx, t.ID, ReasonParentGone, "its parent "+t.ParentID+" is gone")
		}
		if t.ParentProviderID == "" {
			return nil // the parent is not accepted yet
		}
	}
	ref := drivers.Ref{Kind: t.Kind, ParentProviderID: t.ParentProviderID, ProviderID: t.ProviderID}
	if t.ProviderID == "" {
		return a.createStep(ctx, rd, ref)
	}
	obs, err := rd.res.Observe(ctx, drivers.ObserveRequest{Ref: ref})
	if errors.Is(err, providers.ErrNotFound) {
		return a.markError(ctx, t.ID, ReasonNotFound, "the provider no longer has "+t.ProviderID)
	}
	if err != nil {
		return err
	}
	if t.Adopting {
		labelled, err := rd.res.Label(ctx, ref, rd.owner)
		if errors.Is(err, drivers.ErrManagedByAnother) {
			return a.markError(ctx, t.ID, ReasonManagedByAnother, "another deployment took "+t.ProviderID+" meanwhile")
		}
		if err != nil {
			return err
		}
		return a.record(ctx, rd, labelled, domain.Observation{TakenOver: true, SpecReported: labelled.Spec, Applied: t.Version})
	}
	if t.ObserveOnly {
		return a.record(ctx, rd, obs, domain.Observation{SpecReported: obs.Spec, Applied: t.Version})
	}
	if err := a.reissueLostSecrets(ctx, rd, ref, &obs); err != nil {
		return err
	}
	drifted := driftedFields(rd.manifest, rd.spec, obs.Spec)
	hash, rotated, err := a.secretsChanged(t, rd.secrets)
	if err != nil {
		return err
	}
	if len(drifted) == 0 && !rotated {
		return a.record(ctx, rd, obs, domain.Observation{Applied: t.Version})
	}
	if t.Reason == ReasonDriftLoop && t.AppliedVersion >= t.Version {
		return a.record(ctx, rd, obs, domain.Observation{}) // the breaker holds until the tenant changes the spec
	}
	if t.AppliedVersion >= t.Version && len(drifted) > 0 {
		// Nothing the tenant asked: the provider changed it. Fix it, but
		// stop a loop of fixes the provider keeps undoing.
		var n int
		if err := a.inTx(ctx, t.ID, func(tx store.Tx, _ domain.Target) (err error) {
			n, err = domain.RecordFix(ctx, tx, t.ID, drifted[0])
			return err
		}); err != nil {
			return err
		}
		if n > a.Tuning.driftLimit() {
			return a.markError(ctx, t.ID, ReasonDriftLoop, fmt.Sprintf(
				"the provider rewrote spec.%s after each of %d in-place fixes: it is no longer fixed until the spec changes", drifted[0], n-1))
		}
	}
	// The provider is asked to change only what drifted: the observed spec
	// with the wanted values of those updatable fields.
	want, err := overlay(obs.Spec, rd.spec, drifted)
	if err != nil {
		return err
	}
	updated, err := rd.res.Update(ctx, drivers.UpdateRequest{Ref: ref, Owner: rd.owner, Old: obs.Spec, New: want, Secrets: rd.secrets})
	if err != nil {
		return err
	}
	applied := int64(0)
	if len(driftedFields(rd.manifest, rd.spec, updated.Spec)) == 0 {
		applied = t.Version
	}
	return a.record(ctx, rd, updated, domain.Observation{Applied: applied, SecretsHash: hash})
}

// reissueLostSecrets asks the provider for new secret outputs of a
// resource this deployment created whose answer carrying them was lost
// (found again by name and owner): they are sealed with this round's
// observation. A provider that cannot issue them again leaves the
// resource without them.
func (a *Resources) reissueLostSecrets(ctx context.Context, rd round, ref drivers.Ref, obs *drivers.Observed) error {
	rot, ok := rd.res.(drivers.SecretRotator)
	if !ok || rd.t.Adopted || len(rd.manifest.SecretOutputs) == 0 || len(rd.t.SecretOutputs) > 0 || !obs.Ready {
		return nil
	}
	values, err := rot.RotateSecrets(ctx, ref)
	if errors.Is(err, providers.ErrRefused) {
		return nil
	}
	if err != nil {
		return err
	}
	obs.Secrets = values
	return nil
}

// createStep creates the resource, unless a create whose answer was lost
// made it: that one is found by its deterministic name and ownership
// labels before any second create, so retries never exhaust a quota.
func (a *Resources) createStep(ctx context.Context, rd round, ref drivers.Ref) error {
	t := rd.t
	name := rd.manifest.ProviderName(t.ID, t.Spec)
	if t.CreateSent {
		obs, err := rd.res.Observe(ctx, drivers.ObserveRequest{Ref: ref, Name: name, Owner: rd.owner})
		switch {
		case err == nil:
			return a.accepted(ctx, rd, obs, "")
		case errors.Is(err, providers.ErrNotFound) && t.CreateSentAgo < a.Tuning.lostCreateWait():
			return nil // the listing may lag the create: look again before sending another
		case !errors.Is(err, providers.ErrNotFound):
			return err
		}
	}
	hash, _, err := a.secretsChanged(t, rd.secrets)
	if err != nil {
		return err
	}
	if err := domain.RecordCreateSent(ctx, a.Store.Pool, t.ID); err != nil {
		return err
	}
	obs, err := rd.res.Create(ctx, drivers.CreateRequest{Kind: t.Kind, ParentProviderID: t.ParentProviderID, Name: name,
		Owner: rd.owner, Spec: rd.spec, Secrets: rd.secrets})
	if err != nil {
		if errors.Is(err, providers.ErrNotSent) || errors.Is(err, providers.ErrRefused) {
			if ferr := domain.ForgetCreateSent(ctx, a.Store.Pool, t.ID); ferr != nil {
				return ferr
			}
		}
		return err
	}
	return a.accepted(ctx, rd, obs, hash)
}

// accepted records the provider's id and what it answered, sealing the
// secret outputs it returned in the same transaction.
func (a *Resources) accepted(ctx context.Context, rd round, obs drivers.Observed, hash string) error {
	return a.inTx(ctx, rd.t.ID, func(tx store.Tx, t domain.Target) error {
		if err := domain.RecordAccepted(ctx, tx, t, obs.ProviderID); err != nil {
			return err
		}
		t.ProviderID = obs.ProviderID
		return a.observed(ctx, tx, rd, t, obs, domain.Observation{Applied: t.Version, SecretsHash: hash})
	})
}

// record writes an observation in a transaction of its own.
func (a *Resources) record(ctx context.Context, rd round, obs drivers.Observed, o domain.Observation) error {
	return a.inTx(ctx, rd.t.ID, func(tx store.Tx, t domain.Target) error {
		return a.observed(ctx, tx, rd, t, obs, o)
	})
}

// observed seals the observation's secret outputs and records it.
func (a *Resources) observed(ctx context.Context, tx store.Tx, rd round, t domain.Target, obs drivers.Observed, o domain.Observation) error {
	o.ProviderStatus = obs.Status
	o.Ready = obs.Ready
	o.Outputs = obs.Outputs
	if o.Outputs == nil {
		o.Outputs = map[string]string{}
	}
	refs, err := a.seal(ctx, tx, t, rd.manifest, obs.Secrets)
	if err != nil {
		return err
	}
	o.SecretRefs = refs
	if b, err := rd.manifest.Booking(t.Spec); err == nil && b.Quota != "" {
		o.Booking = &domain.Booking{Quota: b.Quota, Amount: b.Amount}
	}
	if o.Applied == 0 {
		o.Applied = t.AppliedVersion
	}
	_, err = domain.RecordObserved(ctx, tx, t, o)
	return err
}

// seal puts each secret output the provider answered into the tenant's
// secret store, named after the resource and the output, and answers
// their references. Outputs the manifest does not declare are dropped.
func (a *Resources) seal(ctx context.Context, tx store.Tx, t domain.Target, m *drivers.Manifest, values drivers.SecretValues) (map[string]string, error) {
	refs := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(values)) {
		if !slices.Contains(m.SecretOutputs, name) || values[name] == "" {
			continue
		}
		s, err := a.Secrets.Put(ctx, tx, secrets.PutRequest{TenantID: t.TenantID, Name: SecretName(t.ID, name),
			Scope: coresecrets.ScopeTenant, Value: values[name], By: t.OwnerIdentityID,
			Description: fmt.Sprintf("secret output %s of cloud resource %s", name, t.ID)})
		if err != nil {
			return nil, err
		}
		refs[name] = s.Ref
	}
	return refs, nil
}

// SecretName is the secret a resource's secret output is sealed under:
// crs_, the 24 characters of the id its provider-side name carries, and
// the output in kebab case (privateUri -> crs_….private-uri), so the
// name fits a secret's 64 characters.
func SecretName(resourceID, output string) string {
	var b strings.Builder
	for i, r := range output {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('-')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return rules.IDPrefix + "_" + providers.NameBody(resourceID) + "." + b.String()
}

// secretsChanged compares the spec's resolved SecretRefs with what was
// last sent, by a digest sealed with the secret store's key (so the row
// holds nothing a guess can be checked against): it answers the digest
// to record and whether the values differ.
func (a *Resources) secretsChanged(t domain.Target, values drivers.SecretValues) (string, bool, error) {
	if len(values) == 0 {
		return "", t.SecretsHash != "", nil
	}
	h := sha256.New()
	for _, ref := range slices.Sorted(maps.Keys(values)) {
		fmt.Fprintf(h, "%d:%s%d:%s", len(ref), ref, len(values[ref]), values[ref])
	}
	sum := h.Sum(nil)
	if kek, sealed, ok := strings.Cut(t.SecretsHash, ":"); ok {
		raw, err := base64.StdEncoding.DecodeString(sealed)
		if err == nil {
			if prev, err := a.Secrets.Open(secretsDigestPurpose, kek, raw, []byte(t.ID)); err == nil && string(prev) == string(sum) {
				return t.SecretsHash, false, nil
			}
		}
	}
	kek, sealed, err := a.Secrets.Seal(secretsDigestPurpose, sum, []byte(t.ID))
	if err != nil {
		return "", false, err
	}
	return kek + ":" + base64.StdEncoding.EncodeToString(sealed), true, nil
}

const secretsDigestPurpose = "cloud-resource-secrets-sent"

// driftedFields are the kind's updatable top-level spec fields whose
// wanted value differs from what the provider reports, sorted. A field
// the spec leaves out is the provider's to choose.
func driftedFields(m *drivers.Manifest, want, got json.RawMessage) []string {
	var w, g map[string]json.RawMessage
	if json.Unmarshal(want, &w) != nil {
		return nil
	}
	_ = json.Unmarshal(got, &g)
	var out []string
	for _, f := range m.Updatable {
		wv, ok := w[f]
		if !ok {
			continue
		}
		if !sameJSON(wv, g[f]) {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out
}

// overlay is base with fields taken from top.
func overlay(base, top json.RawMessage, fields []string) (json.RawMessage, error) {
	var b, t map[string]json.RawMessage
	if err := json.Unmarshal(base, &b); err != nil || b == nil {
		b = map[string]json.RawMessage{}
	}
	if err := json.Unmarshal(top, &t); err != nil {
		return nil, fmt.Errorf("cloud resources: the spec: %w", err)
	}
	for _, f := range fields {
		if v, ok := t[f]; ok {
			b[f] = v
		}
	}
	return json.Marshal(b)
}

func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ca, _ := json.Marshal(x)
	cb, _ := json.Marshal(y)
	return string(ca) == string(cb)
}

// end finishes a deletion or release, destroying the sealed secrets in
// the same transaction.
func (a *Resources) end(ctx context.Context, id, state string) error {
	return a.inTx(ctx, id, func(tx store.Tx, t domain.Target) error {
		for _, ref := range slices.Sorted(maps.Values(t.SecretOutputs)) {
			_, name, err := coresecrets.ParseRef(ref)
			if err != nil {
				continue
			}
			if _, err := a.Secrets.Delete(ctx, tx, t.TenantID, coresecrets.ScopeTenant, name); err != nil && !errors.Is(err, core.ErrNotFound) {
				return err
			}
		}
		return domain.End(ctx, tx, t, state)
	})
}

func (a *Resources) markError(ctx context.Context, id, reason, message string) error {
	return a.inTx(ctx, id, func(tx store.Tx, t domain.Target) error {
		return domain.MarkError(ctx, tx, t, reason, message)
	})
}

// inTx runs f with the freshly read and locked target.
func (a *Resources) inTx(ctx context.Context, id string, f func(tx store.Tx, t domain.Target) error) error {
	return a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		t, err := domain.LoadTarget(ctx, tx, id)
		if err != nil {
			return err
		}
		return f(tx, t)
	})
}

// progress reads where the resource now is.
func (a *Resources) progress(ctx context.Context, id string) (Progress, error) {
	var p Progress
	err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		t, err := domain.LoadTarget(ctx, tx, id)
		if err != nil {
			return err
		}
		p.State = t.State
		p.Done = rules.Ended(t.State)
		p.Converging = !p.Done && (t.Desired != rules.DesiredPresent ||
			(t.State != rules.StateReady && t.State != rules.StateError))
		return nil
	})
	return p, err
}

// retryable keeps a rate limit's Retry-After for Temporal's next attempt.
func retryable(err error) error {
	var rl *providers.RateLimited
	if errors.As(err, &rl) {
		return temporal.NewApplicationErrorWithOptions(err.Error(), "RateLimited", temporal.ApplicationErrorOptions{
			NextRetryDelay: time.Until(rl.RetryAt)})
	}
	return err
}
