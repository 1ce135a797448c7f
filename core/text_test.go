package core

import "testing"

func TestValidateRefusesInvalidText(t *testing.T) {
	s, err := NewSchema(Field{Name: "a", Type: "string"}, Field{Name: "b", Type: "object"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ in, field, reason string }{
		{`{"a":"x\u0000"}`, "a", "encoding"},
		{"{\"a\":\"\xc3\"}", "a", "encoding"},
		{`{"a":"\ud800x"}`, "a", "encoding"},
		{`{"b":{"c":["\udfff"]}}`, "b.c.0", "encoding"},
		{`{"a":"\ud83d\ude80"}`, "", ""},
		// Not JSON: the schema's own parse answers, as before.
		{`{"a":`, "", "type"},
		{`{"a":"x"} {}`, "", "type"},
	}
	for _, c := range cases {
		e := s.Validate([]byte(c.in))
		if c.reason == "" {
			if e != nil {
				t.Errorf("%q = %v, want valid", c.in, e)
			}
			continue
		}
		if e == nil || e.Code != CodeInvalidInput || e.Details["field"] != c.field || e.Details["reason"] != c.reason {
			t.Errorf("%q = %v, want field %q reason %q", c.in, e, c.field, c.reason)
		}
	}
}
