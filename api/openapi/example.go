package openapi

import (
	"fmt"
	"regexp/syntax"
	"strings"
)

// Example is the smallest input a schema accepts: its required fields, each
// with the first value its constraints allow (an enum's first value, the
// minimum, the shortest string its pattern matches).
func Example(schema map[string]any) (any, error) {
	if enum, ok := schema["enum"].([]any); ok && len(enum) > 0 {
		return enum[0], nil
	}
	if c, ok := schema["const"]; ok {
		return c, nil
	}
	switch firstType(schema) {
	case "object", "":
		out := map[string]any{}
		props, _ := schema["properties"].(map[string]any)
		required, _ := schema["required"].([]any)
		for _, r := range required {
			name, _ := r.(string)
			p, _ := props[name].(map[string]any)
			v, err := Example(p)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			out[name] = v
		}
		return out, nil
	case "array":
		items, _ := schema["items"].(map[string]any)
		var out []any
		for range int(number(schema["minItems"])) {
			v, err := Example(items)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		if out == nil {
			out = []any{}
		}
		return out, nil
	case "string":
		s := ""
		if pattern, ok := schema["pattern"].(string); ok {
			var err error
			if s, err = ShortestMatch(pattern); err != nil {
				return nil, err
			}
		}
		for float64(len([]rune(s))) < number(schema["minLength"]) {
			s += "a"
		}
		return s, nil
	case "integer", "number":
		if v, ok := schema["minimum"]; ok && number(v) > 0 {
			return number(v), nil
		}
		return 0, nil
	case "boolean":
		return false, nil
	case "null":
		return nil, nil
	}
	return nil, fmt.Errorf("no example for type %v", schema["type"])
}

// firstType is the schema's first type other than null ("" for none).
func firstType(schema map[string]any) string {
	switch t := schema["type"].(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if s, ok := x.(string); ok && s != "null" {
				return s
			}
		}
	}
	return ""
}

func number(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case int:
		return float64(n)
	}
	return 0
}

// ShortestMatch is the shortest string a regular expression matches,
// taking the first choice of every class and alternation.
func ShortestMatch(pattern string) (string, error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return "", fmt.Errorf("pattern %q: %w", pattern, err)
	}
	var b strings.Builder
	var walk func(*syntax.Regexp)
	walk = func(r *syntax.Regexp) {
		switch r.Op {
		case syntax.OpLiteral:
			b.WriteString(string(r.Rune))
		case syntax.OpCharClass:
			b.WriteRune(r.Rune[0])
		case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
			b.WriteRune('a')
		case syntax.OpCapture, syntax.OpConcat:
			for _, s := range r.Sub {
				walk(s)
			}
		case syntax.OpAlternate:
			walk(r.Sub[0])
		case syntax.OpPlus:
			walk(r.Sub[0])
		case syntax.OpRepeat:
			for range r.Min {
				walk(r.Sub[0])
			}
		}
	}
	walk(re)
	return b.String(), nil
}
