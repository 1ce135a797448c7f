package iam

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/better-compute/better-compute/core"
)

// AdminPathPrefix is where AdminHandler serves: POST /api/iam/<method>.
const AdminPathPrefix = "/api/iam/"

// MaxAdminBody is the largest request body AdminHandler reads.
const MaxAdminBody = 1 << 20

// adminMethod is one method of the admin HTTP surface.
type adminMethod func(ctx context.Context, a *Admin, body []byte) (any, error)

// adminCall adapts an Admin method to a JSON body, decoded strictly
// (unknown fields and trailing data are INVALID_INPUT); an empty body is {}.
func adminCall[I, O any](fn func(*Admin, context.Context, I) (O, error)) adminMethod {
	return func(ctx context.Context, a *Admin, body []byte) (any, error) {
		if len(bytes.TrimSpace(body)) == 0 {
			body = []byte("{}")
		}
		var in I
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			return nil, core.Errorf(core.CodeInvalidInput, "the body is not a valid input: %v", err)
		}
		if dec.More() {
			return nil, core.Errorf(core.CodeInvalidInput, "the body holds more than one JSON value")
		}
		return fn(a, ctx, in)
	}
}

// adminItems wraps a list in {"items": […]}.
type adminItems[T any] struct {
	Items []T `json:"items"`
}

// adminOK is the answer of a method that returns nothing.
type adminOK struct {
	OK bool `json:"ok"`
}

func adminMethods() map[string]adminMethod {
	return map[string]adminMethod{
		"createTenant":      adminCall((*Admin).CreateTenant),
		"getTenant":         adminCall((*Admin).GetTenant),
		"createIdentity":    adminCall((*Admin).CreateIdentity),
		"getIdentity":       adminCall((*Admin).GetIdentity),
		"setIdentityGroups": adminCall((*Admin).SetIdentityGroups),
		"disableIdentity":   adminCall((*Admin).DisableIdentity),
		"createToken":       adminCall((*Admin).CreateToken),
		"revokeToken":       adminCall((*Admin).RevokeToken),
		"putPolicy":         adminCall((*Admin).PutPolicy),
		"deletePolicy": adminCall(func(a *Admin, ctx context.Context, in PolicyRef) (adminOK, error) {
			return adminOK{true}, a.DeletePolicy(ctx, in)
		}),
		"listPolicies": adminCall(func(a *Admin, ctx context.Context, in TenantRef) (adminItems[Policy], error) {
			ps, err := a.ListPolicies(ctx, in)
			return adminItems[Policy]{ps}, err
		}),
		"addRelation": adminCall((*Admin).AddRelation),
		"removeRelation": adminCall(func(a *Admin, ctx context.Context, in Relation) (adminOK, error) {
			return adminOK{true}, a.RemoveRelation(ctx, in)
		}),
		"listRelations": adminCall(func(a *Admin, ctx context.Context, in ListRelationsInput) (adminItems[Relation], error) {
			rs, err := a.ListRelations(ctx, in)
			return adminItems[Relation]{rs}, err
		}),
		"auditEntries": adminCall(func(a *Admin, ctx context.Context, in AuditQuery) (adminItems[AuditEntry], error) {
			es, err := a.AuditEntries(ctx, in)
			return adminItems[AuditEntry]{es}, err
		}),
		"verifyAudit":       adminCall((*Admin).VerifyAudit),
		"addApproverKey":    adminCall((*Admin).AddApproverKey),
		"removeApproverKey": adminCall((*Admin).RemoveApproverKey),
		"listApproverKeys": adminCall(func(a *Admin, ctx context.Context, in ListApproverKeysInput) (adminItems[ApproverKey], error) {
			ks, err := a.ListApproverKeys(ctx, in)
			return adminItems[ApproverKey]{ks}, err
		}),
	}
}

// AdminHandler serves the admin service over HTTP: POST /api/iam/<method>
// with a JSON body, e.g. POST /api/iam/createToken. Methods: createTenant,
// getTenant, createIdentity, getIdentity, setIdentityGroups,
// disableIdentity, createToken, revokeToken, putPolicy, deletePolicy,
// listPolicies, addRelation, removeRelation, listRelations, auditEntries,
// verifyAudit, addApproverKey, removeApproverKey, listApproverKeys. It answers the API's error shape
// {"error":{"code","message","details"}} with its statuses (400, 401, 403,
// 404, 409, 500; 405 for another HTTP method).
//
// Only an authenticated identity of the root tenant with root authority may
// call it: no credential or an invalid one is UNAUTHENTICATED, anyone else
// ACCESS_DENIED (audited on their own tenant's chain). The caller is
// authenticated through port (so it shares the API's authentication cache)
// before the body is read. The credential is the Authorization header or
// the bc_session cookie; the source address is the socket peer
// (r.RemoteAddr), never a forwarding header. The path may arrive whole or
// with /api/iam stripped.
func AdminHandler(admin *Admin, port Port) http.Handler {
	methods := adminMethods()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, AdminPathPrefix)
		name = strings.TrimPrefix(name, "/")
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			adminWriteError(w, http.StatusMethodNotAllowed, core.Errorf(core.CodeInvalidInput, "use POST"))
			return
		}
		cred := Credential{
			Authorization: r.Header.Get("Authorization"),
			RequestID:     r.Header.Get("X-Request-Id"),
			Origin:        r.Header.Get("Origin"),
			UserAgent:     r.UserAgent(),
		}
		if c, err := r.Cookie(SessionCookie); err == nil {
			cred.Cookie = c.Value
		}
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			cred.SourceIP = host
		}
		if !cred.Present() {
			adminWriteErr(w, core.Errorf(core.CodeUnauthn, "a credential is required"))
			return
		}
		if err := CheckCSRF(cred, r.Header.Get(CSRFHeader)); err != nil {
			adminWriteErr(w, err)
			return
		}
		ctx := r.Context()
		caller, err := port.Authenticate(ctx, cred)
		if err != nil {
			adminWriteErr(w, err)
			return
		}
		if caller.TenantID != admin.root || !caller.RootAuthority {
			if err := admin.auditDenied(ctx, caller, embTruncate(name, 64), cred.RequestID); err != nil {
				admin.log.ErrorContext(ctx, "iam: audit of a refused admin call failed", "error", err.Error())
				adminWriteErr(w, core.Wrap(core.CodeUnavailable, err, "unavailable"))
				return
			}
			adminWriteErr(w, core.Errorf(core.CodeAccessDenied, "access denied"))
			return
		}
		m, ok := methods[name]
		if !ok {
			adminWriteErr(w, core.Errorf(core.CodeNotFound, "no IAM admin method %q", name))
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxAdminBody))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				adminWriteErr(w, core.Errorf(core.CodeInvalidInput, "the body is larger than %d bytes", MaxAdminBody))
				return
			}
			adminWriteErr(w, core.Errorf(core.CodeInvalidInput, "the body could not be read"))
			return
		}
		out, err := m(WithAdminActor(ctx, AdminActor{Caller: caller, RequestID: cred.RequestID}), admin, body)
		if err != nil {
			if e := core.AsError(err); e.Code == core.CodeInternal {
				admin.log.ErrorContext(ctx, "iam: admin call failed", "method", name, "error", err.Error())
			}
			adminWriteErr(w, err)
			return
		}
		adminWriteJSON(w, http.StatusOK, out)
	})
}

func adminWriteErr(w http.ResponseWriter, err error) {
	e := core.AsError(err)
	adminWriteError(w, e.Code.HTTPStatus(), e)
}

func adminWriteError(w http.ResponseWriter, status int, e *core.Error) {
	adminWriteJSON(w, status, struct {
		Error *core.Error `json:"error"`
	}{e})
}

func adminWriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store") // createToken answers a secret
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
