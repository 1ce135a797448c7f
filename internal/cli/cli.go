// Package cli is the API's command line: `better-compute <group> <verb>`
// for every method of the registry, its flags derived from the method's
// input schema, plus login and named contexts. Nothing here lists methods:
// a method added to a domain gets its command from the registry.
package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/core"
)

// Options are what the commands read and write; the zero value of each
// field but Registry takes the process's own (os.Stdout, os.Getenv, ...).
type Options struct {
	Registry   *core.Registry
	Stdin      io.Reader // `tunnel` splices it
	Stdout     io.Writer
	Stderr     io.Writer
	Getenv     func(string) string
	ConfigPath string // "" for DefaultConfigPath
	HTTP       *http.Client
	// PollInterval is how often --wait reads the resource (default 1 s).
	PollInterval time.Duration
	Now          func() time.Time
}

func (o Options) withDefaults() Options {
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.HTTP == nil {
		o.HTTP = http.DefaultClient
	}
	if o.PollInterval == 0 {
		o.PollInterval = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

func (o Options) configPath() (string, error) {
	if o.ConfigPath != "" {
		return o.ConfigPath, nil
	}
	return DefaultConfigPath(o.Getenv)
}

// Attach adds the API's commands to root: one per method group, login and
// context. Flag errors become usage errors (exit code 2). A group named
// like one of root's own commands is an error: one would hide the other.
func Attach(root *cobra.Command, o Options) error {
	o = o.withDefaults()
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	taken := map[string]bool{"login": true, "context": true, "tunnel": true, "completion": true, "help": true}
	for _, c := range root.Commands() {
		taken[c.Name()] = true
	}
	groups := map[string]*cobra.Command{}
	for _, m := range o.Registry.Methods() {
		g := groups[m.Group]
		if g == nil {
			if taken[m.Group] {
				return fmt.Errorf("cli: method group %s is named like the command %s", m.Group, m.Group)
			}
			g = &cobra.Command{
				Use:     m.Group,
				Aliases: kebabAlias(m.Group),
				Short:   "API methods " + m.Group + ".*",
				GroupID: apiGroupID,
				Args:    noArgs,
				RunE:    func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
			}
			groups[m.Group] = g
			root.AddCommand(g)
		}
		g.AddCommand(methodCmd(o, m))
	}
	root.AddGroup(&cobra.Group{ID: apiGroupID, Title: "API methods (better-compute <group> <verb> --help):"})
	root.AddCommand(loginCmd(o), contextCmd(o), tunnelCmd(o), sandboxCmd(o))
	return nil
}

const apiGroupID = "api"

// kebabAlias is joinTokens' second name, join-tokens.
func kebabAlias(name string) []string {
	if k := kebab(name); k != name {
		return []string{k}
	}
	return nil
}

func kebab(name string) string {
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('-')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// A flag of a method: one top-level input field, or an alias.
type inputFlag struct {
	field       core.Field
	kind        kind
	name        string // the flag's (kebab) name
	description string // the schema's, when it gives one
}

type kind int

const (
	kindString kind = iota
	kindInteger
	kindNumber
	kindBool
	kindSeconds // a duration in seconds
	kindTime    // epoch milliseconds
	kindJSON    // an object or array, written as JSON
)

func kindOf(f core.Field) kind {
	switch f.Type {
	case core.FieldInteger:
		switch {
		case isSecondsField(f.Name):
			return kindSeconds
		case isTimeField(f.Name):
			return kindTime
		}
		return kindInteger
	case core.FieldNumber:
		return kindNumber
	case core.FieldBoolean:
		return kindBool
	case core.FieldObject, core.FieldArray:
		return kindJSON
	}
	return kindString
}

// flagsOf are a method's flags, one per top-level input field.
func flagsOf(m core.Method) []inputFlag {
	if m.Schema == nil {
		return nil
	}
	props, _ := m.Schema.Document()["properties"].(map[string]any)
	var out []inputFlag
	for _, f := range m.Schema.Fields() {
		p, _ := props[f.Name].(map[string]any)
		desc, _ := p["description"].(string)
		out = append(out, inputFlag{field: f, kind: kindOf(f), name: kebab(f.Name), description: desc})
	}
	return out
}

func (f inputFlag) usage() string {
	var b strings.Builder
	if f.description != "" {
		b.WriteString(f.description + "; ")
	}
	switch f.kind {
	case kindSeconds:
		b.WriteString("duration (1h, 90m, 3600s, 2d; sent in seconds)")
	case kindTime:
		b.WriteString("time (RFC 3339, now, +1h, or epoch ms; sent in epoch ms)")
	case kindJSON:
		fmt.Fprintf(&b, "%s, as JSON", f.field.Type)
	default:
		b.WriteString(string(f.field.Type))
	}
	if len(f.field.Enum) > 0 {
		b.WriteString(": " + strings.Join(f.field.Enum, "|"))
	}
	switch {
	case f.field.Name == "tenantId":
		b.WriteString(" (default: the context's tenant)")
	case f.field.Name == "idempotencyKey":
		b.WriteString(" (default: a fresh key; give one to make a retry safe)")
	case f.field.Required:
		b.WriteString(" (required)")
	}
	return b.String()
}

// value parses what the flag was given into the field's JSON value.
func (f inputFlag) value(s string, now time.Time) (any, error) {
	bad := func(err error) error { return usageErrorf("--%s: %v", f.name, err) }
	switch f.kind {
	case kindInteger:
		n, err := json.Number(strings.TrimSpace(s)).Int64()
		if err != nil {
			return nil, bad(fmt.Errorf("%q is not a whole number", s))
		}
		return n, nil
	case kindNumber:
		n, err := json.Number(strings.TrimSpace(s)).Float64()
		if err != nil {
			return nil, bad(fmt.Errorf("%q is not a number", s))
		}
		return n, nil
	case kindSeconds:
		n, err := parseSeconds(s)
		if err != nil {
			return nil, bad(err)
		}
		return n, nil
	case kindTime:
		n, err := ParseTime(s, now)
		if err != nil {
			return nil, bad(err)
		}
		return n, nil
	case kindJSON:
		var v any
		if err := decodeJSON([]byte(s), &v); err != nil {
			return nil, bad(fmt.Errorf("not JSON: %w", err))
		}
		return v, nil
	case kindBool:
		return s == "true", nil
	}
	if len(f.field.Enum) > 0 && !slices.Contains(f.field.Enum, s) {
		return nil, bad(fmt.Errorf("%q is not one of %s", s, strings.Join(f.field.Enum, ", ")))
	}
	return s, nil
}

// idArg is the field a positional argument fills: the method's one
// required id field other than tenantId (reservations get RSV).
func idArg(m core.Method) string {
	if m.Schema == nil {
		return ""
	}
	var ids []string
	for _, f := range m.Schema.Fields() {
		if f.Required && f.Type == core.FieldString && f.Name != "tenantId" && strings.HasSuffix(f.Name, "Id") {
			ids = append(ids, f.Name)
		}
	}
	if len(ids) == 1 {
		return ids[0]
	}
	return ""
}

// Output formats.
var outputs = []string{"table", "wide", "json", "yaml", "id"}

// common are the flags every method command has.
type common struct {
	context   string
	output    string
	jsonBody  string
	wait      bool
	waitLimit time.Duration
	all       bool
	part      bool
}

func methodCmd(o Options, m core.Method) *cobra.Command {
	var c common
	fields := flagsOf(m)
	values := make([]string, len(fields))
	bools := make([]bool, len(fields))
	als := aliases[m.FullName()]
	aliasValues := make([]string, len(als))
	arg := idArg(m)
	w, waits := waiters[m.FullName()]
	partFlag, partField := parts[m.FullName()][0], parts[m.FullName()][1]

	use := m.Name
	if arg != "" {
		use += " [" + strings.ToUpper(kebab(arg)) + "]"
	}
	short := m.FullName()
	if m.Phase != "" {
		short += " (" + m.Phase + ")"
	}
	cmd := &cobra.Command{
		Use:     use + " [flags]",
		Aliases: kebabAlias(m.Name),
		Short:   short,
		Long: m.FullName() + ": POST /api/compute/" + m.Group + "/" + m.Name + ", kind " + string(m.Kind) +
			".\nFlags are the input's top-level fields; --json gives the whole input (flags win over it).",
		Args: func(cmd *cobra.Command, args []string) error {
			if arg == "" {
				return noArgs(cmd, args)
			}
			if len(args) > 1 {
				return usageErrorf("%s takes at most one argument, the %s", cmd.CommandPath(), arg)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if !slices.Contains(outputs, c.output) {
				return usageErrorf("-o %q: want one of %s", c.output, strings.Join(outputs, ", "))
			}
			now := o.Now()
			body := map[string]any{}
			if c.jsonBody != "" {
				if err := decodeJSON([]byte(c.jsonBody), &body); err != nil {
					return usageErrorf("--json: want a JSON object: %v", err)
				}
			}
			for i, f := range fields {
				if f.name == "" || !cmd.Flags().Changed(f.name) {
					continue
				}
				s := values[i]
				if f.kind == kindBool {
					s = fmt.Sprint(bools[i])
				}
				v, err := f.value(s, now)
				if err != nil {
					return err
				}
				body[f.field.Name] = v
			}
			for i, a := range als {
				if !cmd.Flags().Changed(a.Flag) {
					continue
				}
				v, err := a.Set(aliasValues[i])
				if err != nil {
					return err
				}
				body[a.Field] = v
			}
			if arg != "" && len(args) == 1 {
				body[arg] = args[0]
			}
			conn, err := o.connection(c.context)
			if err != nil {
				return err
			}
			if err := complete(m, body, conn); err != nil {
				return err
			}
			client := &api.Client{BaseURL: strings.TrimRight(conn.API, "/"), Token: conn.Token, HTTP: o.HTTP}
			if streamed[m.FullName()] {
				// The answer's own lines (CSV, JSON Lines), as they come.
				_, err := client.Stream(cmd.Context(), m.FullName(), body, o.Stdout)
				return err
			}
			var raw json.RawMessage
			if err := client.Call(cmd.Context(), m.FullName(), body, &raw); err != nil {
				return err
			}
			if c.all {
				if raw, err = allPages(cmd.Context(), client, m.FullName(), body, raw); err != nil {
					return err
				}
			}
			if c.wait && waits {
				if raw, err = o.await(cmd.Context(), client, m, w, body, raw, c.waitLimit); err != nil {
					return err
				}
			}
			if c.part {
				var whole map[string]json.RawMessage
				if err := json.Unmarshal(raw, &whole); err != nil {
					return fmt.Errorf("the answer is not a JSON object: %w", err)
				}
				raw = whole[partField]
			}
			return render(o.Stdout, c.output, raw)
		},
	}
	fl := cmd.Flags()
	fl.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName { return pflag.NormalizedName(kebab(name)) })
	fl.StringVar(&c.jsonBody, "json", "", "the whole input as a JSON object; flags override its fields")
	fl.StringVar(&c.context, "context", "", "the configuration context to use (default: the current one)")
	fl.StringVarP(&c.output, "output", "o", "table", "output: "+strings.Join(outputs, "|"))
	for i, f := range fields {
		if fl.Lookup(f.name) != nil {
			fields[i].name = "" // a field named like a common flag is given through --json
			continue
		}
		if f.kind == kindBool {
			fl.BoolVar(&bools[i], f.name, false, f.usage())
			continue
		}
		fl.StringVar(&values[i], f.name, "", f.usage())
		if enum := f.field.Enum; len(enum) > 0 {
			_ = cmd.RegisterFlagCompletionFunc(f.name, cobra.FixedCompletions(enum, cobra.ShellCompDirectiveNoFileComp))
		}
	}
	for i, a := range als {
		fl.StringVarP(&aliasValues[i], a.Flag, a.Short, "", a.Usage)
	}
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputs, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("context", o.completeContexts)
	if m.Schema != nil {
		if _, paged := m.Schema.Field("cursor"); paged {
			fl.BoolVar(&c.all, "all", false, "follow nextCursor and answer every page's items")
		}
	}
	if partFlag != "" {
		fl.BoolVar(&c.part, partFlag, false, "answer only the "+partField+" field (-o yaml|json)")
	}
	if waits {
		fl.BoolVar(&c.wait, "wait", false, "wait until the "+strings.TrimSuffix(w.IDField, "Id")+" settles, showing its states on a terminal")
		fl.DurationVar(&c.waitLimit, "wait-timeout", 10*time.Minute, "how long --wait waits")
	}
	return cmd
}

// complete fills what a person leaves out: the tenant from the context, and
// a fresh idempotency key (give --idempotency-key to make a retry safe).
func complete(m core.Method, body map[string]any, conn Connection) error {
	if m.Schema == nil {
		return nil
	}
	if _, ok := m.Schema.Field("tenantId"); ok && body["tenantId"] == nil {
		if conn.Tenant == "" {
			return usageErrorf("no tenant: give --tenant-id, set %s, or log in with --tenant", EnvTenant)
		}
		body["tenantId"] = conn.Tenant
	}
	if f, ok := m.Schema.Field("idempotencyKey"); ok && f.Required && body["idempotencyKey"] == nil {
		b := make([]byte, 12)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		body["idempotencyKey"] = "cli-" + hex.EncodeToString(b)
	}
	return nil
}

func (o Options) connection(named string) (Connection, error) {
	path, err := o.configPath()
	if err != nil {
		return Connection{}, err
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		return Connection{}, err
	}
	return resolve(cfg, named, o.Getenv)
}

func (o Options) completeContexts(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	path, err := o.configPath()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var names []string
	for _, c := range cfg.Contexts {
		names = append(names, c.Name)
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}

// decodeJSON decodes keeping numbers exact (ids and epoch ms stay integers).
func decodeJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("more than one JSON value")
	}
	return nil
}

// await polls the resource the call answered until it settles. On a
// terminal it shows each state change on stderr; in a pipe it is quiet.
func (o Options) await(ctx context.Context, c *api.Client, m core.Method, w waiter, body map[string]any, raw json.RawMessage, limit time.Duration) (json.RawMessage, error) {
	var obj map[string]any
	if err := decodeJSON(raw, &obj); err != nil {
		return nil, fmt.Errorf("--wait: %s answered: %w", m.FullName(), err)
	}
	id := stringOf(obj["id"])
	if id == "" {
		return nil, fmt.Errorf("--wait: %s answered no id", m.FullName())
	}
	progress := o.progress()
	started := o.Now()
	state := w.state(obj)
	fmt.Fprintf(progress, "%s %s: %s\n", m.FullName(), id, state)
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(o.PollInterval)
	defer tick.Stop()
	in := map[string]any{w.IDField: id}
	if t, ok := body["tenantId"]; ok {
		in["tenantId"] = t
	}
	for !w.Settled(obj, o.Now()) {
		select {
		case <-ctx.Done():
			return nil, core.Errorf(core.CodeUnavailable, "--wait: %s %s is still %s after %s", m.Group, id, state, limit)
		case <-tick.C:
		}
		if err := c.Call(ctx, w.Get, in, &raw); err != nil {
			return nil, err
		}
		obj = nil
		if err := decodeJSON(raw, &obj); err != nil {
			return nil, fmt.Errorf("--wait: %s answered: %w", w.Get, err)
		}
		if s := w.state(obj); s != state {
			fmt.Fprintf(progress, "%s %s: %s → %s (%s)\n", m.FullName(), id, state, s, o.Now().Sub(started).Round(time.Second))
			state = s
		}
	}
	return raw, nil
}

// allPages calls a list again with each nextCursor until the last page and
// answers every item in one list.
func allPages(ctx context.Context, c *api.Client, method string, body map[string]any, raw json.RawMessage) (json.RawMessage, error) {
	var all []json.RawMessage
	for {
		var p struct {
			Items      []json.RawMessage `json:"items"`
			NextCursor string            `json:"nextCursor"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("--all: %s answered: %w", method, err)
		}
		all = append(all, p.Items...)
		if p.NextCursor == "" {
			break
		}
		body["cursor"] = p.NextCursor
		if err := c.Call(ctx, method, body, &raw); err != nil {
			return nil, err
		}
	}
	if all == nil {
		all = []json.RawMessage{}
	}
	return json.Marshal(map[string]any{"items": all})
}

// progress is stderr when it is a terminal, and nowhere otherwise.
func (o Options) progress() io.Writer {
	if f, ok := o.Stderr.(*os.File); ok && isTerminal(f) {
		return f
	}
	return io.Discard
}

func stringOf(v any) string {
	s, _ := v.(string)
	return s
}

func int64Of(v any) (int64, bool) {
	switch n := v.(type) {
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	case float64:
		return int64(n), true
	case int64:
		return n, true
	case int:
		return int64(n), true
	}
	return 0, false
}
