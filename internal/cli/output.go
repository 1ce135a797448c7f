package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"go.yaml.in/yaml/v3"
)

// render writes an answer: raw JSON for scripts (-o json, indented), YAML,
// the ids alone (-o id, one a line), or a table for people. Tables show
// epoch-ms fields as RFC 3339; JSON and YAML keep the API's values.
func render(w io.Writer, format string, raw []byte) error {
	switch format {
	case "json":
		var b bytes.Buffer
		if err := json.Indent(&b, raw, "", "  "); err != nil {
			return fmt.Errorf("the answer is not JSON: %w", err)
		}
		b.WriteByte('\n')
		_, err := w.Write(b.Bytes())
		return err
	case "yaml":
		var n yaml.Node
		if err := yaml.Unmarshal(raw, &n); err != nil {
			return fmt.Errorf("the answer is not JSON: %w", err)
		}
		blockStyle(&n)
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		if err := enc.Encode(&n); err != nil {
			return err
		}
		return enc.Close()
	}
	v, err := parseOrdered(raw)
	if err != nil {
		return fmt.Errorf("the answer is not JSON: %w", err)
	}
	obj, isObj := v.(*object)
	if !isObj {
		_, err := fmt.Fprintln(w, cell("", v))
		return err
	}
	items, listed := obj.items()
	if format == "id" {
		if !listed {
			items = []any{obj}
		}
		for _, it := range items {
			if o, ok := it.(*object); ok {
				if id, ok := o.vals["id"].(string); ok {
					fmt.Fprintln(w, id)
				}
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if listed {
		writeRows(tw, items, format == "wide")
		if next, ok := obj.vals["nextCursor"].(string); ok && next != "" {
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(w, "(more: --cursor %s)\n", next)
			return nil
		}
	} else {
		for _, k := range obj.keys {
			fmt.Fprintf(tw, "%s\t%s\n", header(k), cell(k, obj.vals[k]))
		}
	}
	return tw.Flush()
}

// blockStyle makes YAML of JSON read as YAML: block style throughout.
func blockStyle(n *yaml.Node) {
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		n.Style = 0
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		n.Style = 0
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// hiddenColumns are left out of narrow tables: the same on every row of a
// tenant's list, or rarely read.
var hiddenColumns = []string{"tenantId", "ownerIdentityId", "updatedAt"}

// leadColumns come first when present.
var leadColumns = []string{"id", "name", "state", "status"}

const narrowColumns = 8

// columns are the items' top-level scalar fields: id, name and state
// first, then the others in the API's order.
func columns(items []any, wide bool) []string {
	var all []string
	nonScalar := map[string]bool{}
	for _, it := range items {
		o, ok := it.(*object)
		if !ok {
			continue
		}
		for _, k := range o.keys {
			if !slices.Contains(all, k) {
				all = append(all, k)
			}
			switch o.vals[k].(type) {
			case *object, []any:
				nonScalar[k] = true
			}
		}
	}
	var cols []string
	for _, k := range leadColumns {
		if slices.Contains(all, k) && !nonScalar[k] {
			cols = append(cols, k)
		}
	}
	for _, k := range all {
		if nonScalar[k] || slices.Contains(cols, k) || (!wide && slices.Contains(hiddenColumns, k)) {
			continue
		}
		cols = append(cols, k)
	}
	if !wide && len(cols) > narrowColumns {
		cols = cols[:narrowColumns]
	}
	return cols
}

func writeRows(w io.Writer, items []any, wide bool) {
	cols := columns(items, wide)
	if len(cols) == 0 {
		for _, it := range items {
			fmt.Fprintln(w, cell("", it))
		}
		return
	}
	hs := make([]string, len(cols))
	for i, c := range cols {
		hs[i] = header(c)
	}
	fmt.Fprintln(w, strings.Join(hs, "\t"))
	for _, it := range items {
		o, ok := it.(*object)
		if !ok {
			continue
		}
		row := make([]string, len(cols))
		for i, c := range cols {
			row[i] = cell(c, o.vals[c])
		}
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
}

// header is a column's title: poolId is POOL_ID.
func header(k string) string {
	return strings.ToUpper(strings.ReplaceAll(kebab(k), "-", "_"))
}

// cell renders one value for a table.
func cell(field string, v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case json.Number:
		if n, err := x.Int64(); err == nil && isTimeField(field) && n > 0 {
			return FormatMillis(n)
		}
		return x.String()
	case bool:
		return fmt.Sprint(x)
	}
	b, _ := json.Marshal(plain(v))
	return string(b)
}

// object is a JSON object that keeps its keys' order, so tables show the
// API's fields in the order the API gives them.
type object struct {
	keys []string
	vals map[string]any
}

// items is the list an answer carries: its items field, or its one field
// holding an array of objects.
func (o *object) items() ([]any, bool) {
	if it, ok := o.vals["items"].([]any); ok {
		return it, true
	}
	var found []any
	n := 0
	for _, k := range o.keys {
		if a, ok := o.vals[k].([]any); ok && len(a) > 0 {
			if _, isObj := a[0].(*object); isObj {
				found, n = a, n+1
			}
		}
	}
	if n == 1 && len(o.keys) <= 3 {
		return found, true
	}
	return nil, false
}

func parseOrdered(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	return orderedValue(d)
}

func orderedValue(d *json.Decoder) (any, error) {
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t {
	case json.Delim('{'):
		o := &object{vals: map[string]any{}}
		for d.More() {
			kt, err := d.Token()
			if err != nil {
				return nil, err
			}
			k, _ := kt.(string)
			v, err := orderedValue(d)
			if err != nil {
				return nil, err
			}
			if _, seen := o.vals[k]; !seen {
				o.keys = append(o.keys, k)
			}
			o.vals[k] = v
		}
		_, err := d.Token()
		return o, err
	case json.Delim('['):
		a := []any{}
		for d.More() {
			v, err := orderedValue(d)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := d.Token()
		return a, err
	}
	return t, nil
}

// plain turns ordered values back into what encoding/json writes.
func plain(v any) any {
	switch x := v.(type) {
	case *object:
		m := make(map[string]any, len(x.keys))
		for k, val := range x.vals {
			m[k] = plain(val)
		}
		return m
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = plain(e)
		}
		return out
	}
	return v
}
