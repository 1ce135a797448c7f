// Package temporaltest records what code registers on a Temporal worker, so
// a test can check the names workflows and activities are registered under:
// those names are persisted in workflow histories and must never change.
package temporaltest

import (
	"reflect"
	"runtime"
	"strings"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// Registry is a worker.Registry that records registrations instead of
// serving them. Registering a dynamic workflow or activity or a Nexus
// service panics: nothing of ours does.
type Registry struct {
	worker.Registry

	// Workflows and Activities are the registered type names, in order.
	Workflows, Activities []string
	// Methods maps each activity's registered name to its Go function's
	// short name (a method value's method name), which the worker resolves
	// back to the registered name when a workflow calls the activity by
	// method value.
	Methods map[string]string
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry { return &Registry{Methods: map[string]string{}} }

// RegisterWorkflow records w under its function's name.
func (r *Registry) RegisterWorkflow(w any) {
	r.RegisterWorkflowWithOptions(w, workflow.RegisterOptions{})
}

// RegisterWorkflowWithOptions records w under o.Name, or its function's
// name without one.
func (r *Registry) RegisterWorkflowWithOptions(w any, o workflow.RegisterOptions) {
	name := o.Name
	if name == "" {
		name = ShortName(w)
	}
	r.Workflows = append(r.Workflows, name)
}

// RegisterActivity records a under its function's name.
func (r *Registry) RegisterActivity(a any) {
	r.RegisterActivityWithOptions(a, activity.RegisterOptions{})
}

// RegisterActivityWithOptions records a under o.Name, or its function's
// name without one.
func (r *Registry) RegisterActivityWithOptions(a any, o activity.RegisterOptions) {
	name := o.Name
	if name == "" {
		name = ShortName(a)
	}
	r.Activities = append(r.Activities, name)
	r.Methods[name] = ShortName(a)
}

// ShortName is the name the Temporal SDK gives a function: the last element
// of its qualified name, without the suffix the compiler adds to a method
// value ("Bind" for reservations.(*Reservations).Bind-fm).
func ShortName(fn any) string {
	full := runtime.FuncForPC(reflect.ValueOf(fn).Pointer()).Name()
	return strings.TrimSuffix(full[strings.LastIndex(full, ".")+1:], "-fm")
}
