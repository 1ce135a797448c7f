package profiles

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"text/template"
)

// MaxTemplateOutput bounds what one template renders to, in bytes: a
// step's argument or a hostname is small, and a template that loops over
// a machine's disks and NICs cannot make a workflow's rows huge.
const MaxTemplateOutput = 16 << 10

// Funcs is the template function set, fixed: pure functions of their
// arguments, none that reads the environment, a file, the clock or the
// network (so no sprig), beside text/template's own builtins (and, or,
// not, len, index, slice, print, printf, println, eq, ne, lt, le, gt, ge).
func Funcs() template.FuncMap {
	return template.FuncMap{
		// default d v: v, or d when v is empty (as with missingkey=error a
		// missing map key fails first, read optional keys with index:
		// {{ index .node.labels "rack" | default "r0" }}).
		"default": func(d, v any) any {
			if empty(v) {
				return d
			}
			return v
		},
		"lower":      strings.ToLower,
		"upper":      strings.ToUpper,
		"trim":       strings.TrimSpace,
		"replace":    func(old, new, s string) string { return strings.ReplaceAll(s, old, new) },
		"trimPrefix": func(prefix, s string) string { return strings.TrimPrefix(s, prefix) },
		"trimSuffix": func(suffix, s string) string { return strings.TrimSuffix(s, suffix) },
		"join":       join,
		"quote":      func(v any) string { return strconv.Quote(fmt.Sprint(v)) },
		"toJson": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		"b64enc": func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
		"indent": func(n int, s string) string {
			if n < 0 || n > 64 {
				n = 0
			}
			pad := strings.Repeat(" ", n)
			return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
	}
}

// join sep list: the list's elements, printed, between seps.
func join(sep string, list any) (string, error) {
	v := reflect.ValueOf(list)
	if v.Kind() != reflect.Slice && v.Kind() != reflect.Array {
		return "", fmt.Errorf("join: %T is not a list", list)
	}
	parts := make([]string, v.Len())
	for i := range parts {
		parts[i] = fmt.Sprint(v.Index(i).Interface())
	}
	return strings.Join(parts, sep), nil
}

func empty(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.String, reflect.Slice, reflect.Map, reflect.Array:
		return r.Len() == 0
	case reflect.Bool:
		return !r.Bool()
	case reflect.Int, reflect.Int64, reflect.Int32:
		return r.Int() == 0
	case reflect.Float64, reflect.Float32:
		return r.Float() == 0
	case reflect.Pointer, reflect.Interface:
		return r.IsNil()
	}
	if n, ok := v.(json.Number); ok {
		return n == "" || n == "0"
	}
	return false
}

// parse parses one template with the fixed function set; a missing map
// key is an error, not "<no value>".
func parse(name, text string) (*template.Template, error) {
	return template.New(name).Option("missingkey=error").Funcs(Funcs()).Parse(text)
}

// errTooLarge is a template's output past MaxTemplateOutput.
var errTooLarge = fmt.Errorf("the template renders to more than %d bytes", MaxTemplateOutput)

// boundedWriter fails a write past its limit, so a template stops there.
type boundedWriter struct {
	buf   bytes.Buffer
	limit int
}

func (w *boundedWriter) Write(p []byte) (int, error) {
	if w.buf.Len()+len(p) > w.limit {
		return 0, errTooLarge
	}
	return w.buf.Write(p)
}

// Expand renders one template against data (the target's, Data). A
// string with no action is answered as it is.
func Expand(name, text string, data map[string]any) (string, error) {
	if !strings.Contains(text, "{{") {
		return text, nil
	}
	t, err := parse(name, text)
	if err != nil {
		return "", err
	}
	w := &boundedWriter{limit: MaxTemplateOutput}
	if err := t.Execute(w, data); err != nil {
		if errors.Is(err, errTooLarge) {
			return "", errTooLarge
		}
		return "", err
	}
	return w.buf.String(), nil
}
