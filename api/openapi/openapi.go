// Package openapi describes the API as an OpenAPI 3.1 document, generated
// from the method registry: every row of the method table is an operation,
// its request body the very schema the envelope validates with, its answer
// the schema of the descriptor's output type. Nothing here is kept by hand,
// so a method that lands later is described without a line here.
package openapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
)

// Version is the OpenAPI version the document follows.
const Version = "3.1.0"

// CallPath is the path of a method's call: POST /api/compute/<group>/<method>.
func CallPath(m core.Method) string { return "/api/compute/" + m.Group + "/" + m.Name }

// Info is what the document says of the API as a whole.
type Info struct {
	// APIVersion is the call contract's version ("v0.1").
	APIVersion string
	// Build is the server's build ("dev", "v1.2.3").
	Build string
	// SessionCookie is the cookie a browser session is carried in.
	SessionCookie string
}

// Served is what the document needs of a served method beyond its registry
// entry: its answer's Go type.
type Served struct {
	Output reflect.Type
}

// Document is the OpenAPI 3.1 document of reg, where served names the
// methods a server runs (by full name); every other method is planned.
func Document(info Info, reg *core.Registry, served map[string]Served) (map[string]any, error) {
	paths := map[string]any{}
	tags := map[string]bool{}
	for _, m := range reg.Methods() {
		s, isServed := served[m.FullName()]
		op, err := operation(m, s, isServed)
		if err != nil {
			return nil, fmt.Errorf("openapi: %s: %w", m.FullName(), err)
		}
		paths[CallPath(m)] = map[string]any{"post": op}
		tags[m.Group] = true
	}
	var tagList []any
	for _, t := range slices.Sorted(maps.Keys(tags)) {
		tagList = append(tagList, map[string]any{"name": t})
	}
	doc := map[string]any{
		"openapi": Version,
		"info": map[string]any{
			"title":   "Better Compute API",
			"version": info.APIVersion + " (build " + info.Build + ")",
			"description": "Every method is POST /api/compute/<group>/<method> with a JSON object body; " +
				"the answer is 200 with a JSON body, or an error in the one error shape. " + unitsProse,
		},
		"servers":  []any{map[string]any{"url": "/"}},
		"tags":     tagList,
		"paths":    paths,
		"security": []any{map[string]any{"bearerAuth": []any{}}, map[string]any{"cookieAuth": []any{}}},
		"components": map[string]any{
			"securitySchemes": map[string]any{
				"bearerAuth": map[string]any{"type": "http", "scheme": "bearer",
					"description": "An IAM token: Authorization: Bearer <token>."},
				"cookieAuth": map[string]any{"type": "apiKey", "in": "cookie", "name": info.SessionCookie,
					"description": "A browser session, read when no Authorization header is sent."},
			},
			"schemas":   map[string]any{"Error": errorSchema()},
			"responses": errorResponses(),
		},
		"x-error-codes": errorCodes(),
	}
	return doc, nil
}

// JSON is the document as indented JSON.
func JSON(info Info, reg *core.Registry, served map[string]Served) ([]byte, error) {
	doc, err := Document(info, reg, served)
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	return append(out, '\n'), nil
}

// unitsProse is the API's one rule on units, repeated on every field
// description that carries one.
const unitsProse = "Instants are integers in epoch milliseconds (UTC); durations are integers in seconds " +
	"unless the field's name ends in Ms (milliseconds); x-unit on a field names its unit."

func operation(m core.Method, s Served, served bool) (map[string]any, error) {
	input := m.Schema.Document()
	example, err := Example(input)
	if err != nil {
		return nil, fmt.Errorf("example: %w", err)
	}
	output := map[string]any{"description": "Not described: the method is planned."}
	if served && s.Output != nil {
		if output, err = core.OutputSchemaFor(s.Output); err != nil {
			return nil, err
		}
	}
	responses := map[string]any{
		"200": map[string]any{"description": "The method's answer.",
			"content": map[string]any{"application/json": map[string]any{"schema": output}}},
	}
	if served && s.Output == reflect.TypeFor[rpc.Stream]() {
		// Lines written as they are read, with the Bc-Stream-* trailers.
		text := map[string]any{"schema": map[string]any{"type": "string"}}
		responses["200"] = map[string]any{"description": "The answer's lines, streamed; the trailers " +
			rpc.StreamRowsTrailer + " and " + rpc.StreamErrorTrailer + " say how it ended.",
			"content": map[string]any{"application/x-ndjson": text, "text/csv": text}}
	}
	for _, status := range errorStatuses() {
		responses[strconv.Itoa(status)] = map[string]any{"$ref": "#/components/responses/" + statusName(status)}
	}
	op := map[string]any{
		"operationId": m.FullName(),
		"tags":        []any{m.Group},
		"summary":     m.FullName(),
		"description": describe(m, served),
		"requestBody": map[string]any{"required": false, "content": map[string]any{
			"application/json": map[string]any{"schema": input, "example": example},
		}},
		"responses":    responses,
		"x-action":     m.Row.Action,
		"x-decided-on": m.Row.DecidedOn,
		"x-phase":      m.Row.Phase,
		"x-served":     served,
		"x-kind":       string(m.Kind),
	}
	if m.Public {
		op["security"] = []any{}
	}
	return op, nil
}

// describe is an operation's prose: what the method table says of it.
func describe(m core.Method, served bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s. Kind %s; action %s, decided on %s; phase %s.", m.Section, m.Kind, m.Row.Action, m.Row.DecidedOn, m.Row.Phase)
	if !served {
		b.WriteString(" Planned: this server answers UNSUPPORTED (HTTP 422).")
	}
	if m.Items {
		b.WriteString(" A list: only the items the caller may read are answered.")
	}
	for _, n := range m.Notes {
		b.WriteString(" " + n)
	}
	return b.String()
}

// allCodes are the contract's error codes.
var allCodes = []core.Code{core.CodeInvalidInput, core.CodeUnauthn, core.CodeAccessDenied, core.CodeNotFound,
	core.CodeConflict, core.CodeInvalidState, core.CodeUnsupported, core.CodeQuotaExceeded, core.CodeUnavailable,
	core.CodeInternal, core.CodeInvalidConfig}

func errorCodes() map[string]any {
	out := map[string]any{}
	for _, c := range allCodes {
		out[string(c)] = c.HTTPStatus()
	}
	return out
}

func errorStatuses() []int {
	var out []int
	for _, c := range allCodes {
		if s := c.HTTPStatus(); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

func codesOf(status int) []any {
	var out []any
	for _, c := range allCodes {
		if c.HTTPStatus() == status {
			out = append(out, string(c))
		}
	}
	return out
}

func statusName(status int) string {
	return strings.ReplaceAll(http.StatusText(status), " ", "")
}

// errorSchema is the one error shape (httpx.ErrorBody).
func errorSchema() map[string]any {
	var codes []any
	for _, c := range allCodes {
		codes = append(codes, string(c))
	}
	return map[string]any{
		"type":     "object",
		"required": []any{"error"},
		"properties": map[string]any{"error": map[string]any{
			"type":     "object",
			"required": []any{"code", "message"},
			"properties": map[string]any{
				"code":    map[string]any{"type": "string", "enum": codes},
				"message": map[string]any{"type": "string", "description": "Safe to show the caller."},
				"details": map[string]any{"type": "object", "description": "Structured details: for INVALID_INPUT, " +
					"field (dotted for nested fields), reason and, where a unit was likely mistaken, hint."},
				"requestId": map[string]any{"type": "string", "description": "The request's id, as in X-Request-Id."},
			},
		}},
	}
}

// errorResponses are one response per HTTP status an error answers with.
func errorResponses() map[string]any {
	out := map[string]any{}
	for _, status := range errorStatuses() {
		var codes []string
		for _, c := range codesOf(status) {
			codes = append(codes, c.(string))
		}
		out[statusName(status)] = map[string]any{
			"description": "An error of code " + strings.Join(codes, " or ") + ".",
			"content": map[string]any{"application/json": map[string]any{"schema": map[string]any{
				"allOf": []any{
					map[string]any{"$ref": "#/components/schemas/Error"},
					map[string]any{"properties": map[string]any{"error": map[string]any{
						"properties": map[string]any{"code": map[string]any{"enum": codesOf(status)}}}}},
				},
			}}},
		}
	}
	return out
}
