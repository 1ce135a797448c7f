package provisioning

import (
	"fmt"
	"regexp"
	"slices"
	"time"
)

// Problem is one thing wrong with a profile or its steps: the field it is
// in (a JSON path such as "steps[2].args.device"), a machine-readable
// reason and a message a user reads.
type Problem struct {
	Field   string `json:"field"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Reasons of a step's problems.
const (
	ReasonRequired        = "required"
	ReasonPattern         = "pattern"
	ReasonDuplicate       = "duplicate"
	ReasonUnknownAction   = "unknownAction"
	ReasonUnknownArg      = "unknownArg"
	ReasonArgType         = "argType"
	ReasonAwait           = "await"
	ReasonAwaitRequired   = "awaitRequired"
	ReasonNeedsRamdisk    = "needsRamdisk"
	ReasonNeedsRejoin     = "needsRejoin"
	ReasonRange           = "range"
	ReasonMaxItems        = "maxItems"
	ReasonEnum            = "enum"
	maxArgSeconds         = 3600
	maxArgvItems          = 256
	maxEnvItems           = 64
	stepNamePatternString = `^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`
)

// StepNamePattern is a step's name: a DNS label, so it can name a
// workflow's step in a URL and a CLI argument.
const StepNamePattern = stepNamePatternString

var stepNameRE = regexp.MustCompile(stepNamePatternString)

// argEnums are the values the catalog's enumerated arguments take.
var argEnums = map[string]map[string][]string{
	ActionSetBootDevice: {"device": {"disk", "pxe", "cd"}},
	ActionPower:         {"action": {"on", "off", "cycle", "reset"}},
	ActionBootRamdisk:   {"via": {"virtual-media", "pxe"}},
}

// ValidateSteps checks a workflow's steps as they will run (the timeouts
// and retry policies a step leaves out are its action's, WithDefaults):
// unique DNS-label names, every (on, action) of the catalog with its
// required arguments and no others, await only "rejoin" and required after
// an action that ends the agent's boot, ramdisk steps only while a ramdisk
// boot is open (after a boot-ramdisk, before the next reboot), node steps
// only once the node's agent re-joined, and the bounds of a step's timeout
// and retry policy. It answers every problem, in step order; none is valid.
func ValidateSteps(steps []Step) []Problem {
	var out []Problem
	add := func(field, reason, format string, args ...any) {
		out = append(out, Problem{Field: field, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	if len(steps) > MaxSteps {
		add("steps", ReasonMaxItems, "a workflow has at most %d steps, not %d", MaxSteps, len(steps))
	}
	seen := map[string]int{}
	// ramdisk: a ramdisk boot is open; joined: the node's agent re-joined
	// since the last boot the workflow started.
	ramdisk, joined := false, false
	for i, s := range steps {
		at := fmt.Sprintf("steps[%d]", i)
		switch {
		case s.Name == "":
			add(at+".name", ReasonRequired, "step %d has no name", i)
		case !stepNameRE.MatchString(s.Name):
			add(at+".name", ReasonPattern, "step name %q is not a DNS label (%s)", s.Name, StepNamePattern)
		default:
			if j, dup := seen[s.Name]; dup {
				add(at+".name", ReasonDuplicate, "step name %q is also step %d's", s.Name, j)
			} else {
				seen[s.Name] = i
			}
		}
		a, ok := ActionOf(s.On, s.Action)
		if !ok {
			if !slices.Contains(Runners, s.On) {
				add(at+".on", ReasonEnum, "%q is not a runner (control-plane, site, node or ramdisk)", s.On)
			} else {
				add(at+".action", ReasonUnknownAction, "%s has no action %q", s.On, s.Action)
			}
			continue
		}
		out = append(out, checkArgs(at, a, s.Args)...)
		s = WithDefaults(s)
		if s.TimeoutSeconds < int(MinStepTimeout/time.Second) || s.Timeout() > MaxStepTimeout {
			add(at+".timeoutSeconds", ReasonRange, "timeoutSeconds must be from %d to %d", int(MinStepTimeout/time.Second), int(MaxStepTimeout/time.Second))
		}
		if s.Retry.MaxAttempts < 1 || s.Retry.MaxAttempts > MaxAttempts {
			add(at+".retry.maxAttempts", ReasonRange, "retry.maxAttempts must be from 1 to %d", MaxAttempts)
		}
		if s.Retry.BackoffSeconds < 0 || time.Duration(s.Retry.BackoffSeconds)*time.Second > MaxBackoff {
			add(at+".retry.backoffSeconds", ReasonRange, "retry.backoffSeconds must be from 0 to %d", int(MaxBackoff/time.Second))
		}
		switch s.On {
		case RunnerRamdisk:
			if !ramdisk {
				add(at+".on", ReasonNeedsRamdisk, "a ramdisk step runs only after a boot-ramdisk step, and not after a reboot until the next one")
			}
		case RunnerNode:
			if !joined {
				add(at+".on", ReasonNeedsRejoin, "a node step runs only after a step that awaits rejoin")
			}
		}
		// What the step does to the machine's boot.
		endsBoot := a.EndsBoot || a.Name == ActionPower && a.On == RunnerSite
		switch {
		case s.Await != "" && s.Await != AwaitRejoin:
			add(at+".await", ReasonEnum, "await is %q or absent, not %q", AwaitRejoin, s.Await)
		case a.EndsBoot && s.Await != AwaitRejoin:
			add(at+".await", ReasonAwaitRequired, "%s ends the agent's boot: the step must await %q", a.Name, AwaitRejoin)
		case s.Await == AwaitRejoin && !endsBoot:
			add(at+".await", ReasonAwait, "only a step that ends the machine's boot (a reboot, a power action) awaits %q", AwaitRejoin)
		}
		switch {
		case a.Name == ActionBootRamdisk && a.On == RunnerSite:
			ramdisk, joined = true, false
		case endsBoot:
			ramdisk, joined = false, s.Await == AwaitRejoin
		}
	}
	return out
}

// checkArgs checks one step's arguments against its action's: the
// required ones present, no others, and the types and ranges the catalog's
// summaries promise.
func checkArgs(at string, a Action, args map[string]any) []Problem {
	var out []Problem
	add := func(field, reason, format string, v ...any) {
		out = append(out, Problem{Field: field, Reason: reason, Message: fmt.Sprintf(format, v...)})
	}
	for _, arg := range a.Args {
		if _, ok := args[arg.Name]; arg.Required && !ok {
			add(at+".args."+arg.Name, ReasonRequired, "%s %s needs the argument %s (%s)", a.On, a.Name, arg.Name, arg.Summary)
		}
	}
	names := make([]string, 0, len(args))
	for name := range args {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		v, field := args[name], at+".args."+name
		if !slices.ContainsFunc(a.Args, func(arg Arg) bool { return arg.Name == name }) {
			add(field, ReasonUnknownArg, "%s %s takes no argument %s", a.On, a.Name, name)
			continue
		}
		if values, ok := argEnums[a.Name][name]; ok {
			if s, isString := v.(string); !isString || !slices.Contains(values, s) {
				add(field, ReasonEnum, "%s is one of %v", name, values)
			}
			continue
		}
		switch name {
		case "seconds", "timeoutSeconds":
			if n, ok := wholeNumber(v); !ok || n < 1 || n > maxArgSeconds {
				add(field, ReasonRange, "%s is a whole number from 1 to %d", name, maxArgSeconds)
			}
		case "persistent":
			if _, ok := v.(bool); !ok {
				add(field, ReasonArgType, "persistent is true or false")
			}
		case "argv":
			if !validArgv(v) {
				add(field, ReasonArgType, "argv is a list of 1 to %d non-empty strings (the program first)", maxArgvItems)
			}
		case "env":
			m, ok := v.(map[string]any)
			if !ok || len(m) > maxEnvItems || !allStrings(m) {
				add(field, ReasonArgType, "env maps at most %d variable names to strings", maxEnvItems)
			}
		case "rootDevice":
			if s, ok := v.(string); !ok || s == "" {
				add(field, ReasonArgType, "rootDevice is a disk name or serial")
			}
		}
	}
	return out
}

// wholeNumber reads a JSON number (float64 after decoding, or an int a Go
// caller wrote) that has no fraction.
func wholeNumber(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int64:
		return n, true
	case float64:
		if n != float64(int64(n)) {
			return 0, false
		}
		return int64(n), true
	}
	return 0, false
}

// validArgv: a list of 1 to maxArgvItems non-empty strings, as decoded
// JSON ([]any) or as a Go caller wrote it ([]string).
func validArgv(v any) bool {
	var list []any
	switch l := v.(type) {
	case []any:
		list = l
	case []string:
		for _, s := range l {
			list = append(list, s)
		}
	default:
		return false
	}
	return len(list) > 0 && len(list) <= maxArgvItems &&
		!slices.ContainsFunc(list, func(e any) bool { s, ok := e.(string); return !ok || s == "" })
}

func allStrings(m map[string]any) bool {
	for _, v := range m {
		if _, ok := v.(string); !ok {
			return false
		}
	}
	return true
}
