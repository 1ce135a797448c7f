package core

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// checkText refuses, in any string of a JSON input (object names included),
// what would otherwise be changed or refused further in: invalid UTF-8 and
// lone UTF-16 surrogate escapes, which encoding/json silently replaces with
// U+FFFD, and NUL characters, which PostgreSQL's text cannot hold. The
// failure is INVALID_INPUT naming the field (dotted for nested ones) with
// reason "encoding". Input that is not JSON at all is left to the schema's
// own parse, so its answers stay what they were.
//
// encoding/json reports none of this, so the raw bytes are walked with
// jsontext, whose strict decoder refuses invalid text and says where.
func checkText(input []byte) *Error {
	// Most inputs are valid UTF-8 with no escapes: none of what is refused
	// can hide in them, so they skip the walk.
	if utf8.Valid(input) && !bytes.Contains(input, []byte(`\u`)) && bytes.IndexByte(input, 0) < 0 {
		return nil
	}
	strict := jsontext.NewDecoder(bytes.NewReader(input), jsontext.AllowDuplicateNames(true))
	for {
		tok, err := strict.ReadToken()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			var se *jsontext.SyntacticError
			if !errors.As(err, &se) || !invalidTextAt(input, se.ByteOffset) {
				return nil
			}
			return textError(se.JSONPointer, "is not valid UTF-8 (an invalid byte or a lone surrogate)")
		}
		if tok.Kind() == '"' && strings.IndexByte(tok.String(), 0) >= 0 {
			return textError(strict.StackPointer(), "contains a NUL character")
		}
	}
}

// invalidTextAt tells whether the strict decoder's failure at offset was
// only invalid text: a decoder that lets invalid UTF-8 through gets past it.
func invalidTextAt(input []byte, offset int64) bool {
	lenient := jsontext.NewDecoder(bytes.NewReader(input), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	for {
		_, err := lenient.ReadToken()
		if errors.Is(err, io.EOF) {
			return true
		}
		var se *jsontext.SyntacticError
		if errors.As(err, &se) {
			return se.ByteOffset != offset
		}
		if err != nil {
			return false
		}
	}
}

func textError(at jsontext.Pointer, what string) *Error {
	var parts []string
	for tok := range at.Tokens() {
		parts = append(parts, tok)
	}
	field := strings.Join(parts, ".")
	name := field
	if name == "" {
		name = "input"
	}
	return invalidField(field, "encoding", name+" "+what)
}
