package visibility

import (
	"context"

	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"
)

// The API caller's identity travels with a workflow update (and a start
// or signal) as the bc-caller header, set by CallerPropagator from the
// context the API sends the update with. A header, not an update
// argument, so every update handler gets it without its signature
// changing (a change that would break the runs already in flight), and so
// the Temporal client's own Identity stays the process's.
const callerHeader = "bc-caller"

type callerKey struct{}

// WithCaller is ctx carrying the caller's identity id to the workflow
// calls made with it.
func WithCaller(ctx context.Context, identityID string) context.Context {
	return context.WithValue(ctx, callerKey{}, identityID)
}

// Caller is the identity id of the API caller whose update (or start)
// ctx serves, or "" when none was sent.
func Caller(ctx workflow.Context) string {
	id, _ := ctx.Value(callerKey{}).(string)
	return id
}

// CallerPropagator carries WithCaller's identity in the bc-caller header.
// The API's and the workers' Temporal clients both have it
// (workers.Dial): the one to write the header, the other to read it.
type CallerPropagator struct{}

var _ workflow.ContextPropagator = CallerPropagator{}

func inject(id string, w workflow.HeaderWriter) error {
	if id == "" {
		return nil
	}
	p, err := converter.GetDefaultDataConverter().ToPayload(id)
	if err != nil {
		return err
	}
	w.Set(callerHeader, p)
	return nil
}

func extract(r workflow.HeaderReader) (string, error) {
	p, ok := r.Get(callerHeader)
	if !ok {
		return "", nil
	}
	var id string
	err := converter.GetDefaultDataConverter().FromPayload(p, &id)
	return id, err
}

// Inject writes the caller of ctx into an outgoing call's header.
func (CallerPropagator) Inject(ctx context.Context, w workflow.HeaderWriter) error {
	id, _ := ctx.Value(callerKey{}).(string)
	return inject(id, w)
}

// InjectFromWorkflow writes the caller a workflow's handler serves into
// the header of what it calls (its activities).
func (CallerPropagator) InjectFromWorkflow(ctx workflow.Context, w workflow.HeaderWriter) error {
	return inject(Caller(ctx), w)
}

// Extract reads the caller of an incoming activity.
func (CallerPropagator) Extract(ctx context.Context, r workflow.HeaderReader) (context.Context, error) {
	id, err := extract(r)
	if err != nil {
		return ctx, err
	}
	return context.WithValue(ctx, callerKey{}, id), nil
}

// ExtractToWorkflow reads the caller of an incoming start, update, signal
// or query; one without the header has no caller (not the start's).
func (CallerPropagator) ExtractToWorkflow(ctx workflow.Context, r workflow.HeaderReader) (workflow.Context, error) {
	id, err := extract(r)
	if err != nil {
		return ctx, err
	}
	return workflow.WithValue(ctx, callerKey{}, id), nil
}
