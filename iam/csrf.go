package iam

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"

	"github.com/better-compute/better-compute/core"
)

// CSRFHeader carries the CSRF token of a call authenticated by the session
// cookie (the console's calls).
const CSRFHeader = "X-Csrf-Token"

// csrfLabel is what the CSRF token's HMAC is over.
const csrfLabel = "better-compute console csrf v1"

// CSRFToken is the CSRF token of a session cookie (its value, or a whole
// Cookie header): an HMAC-SHA256 keyed with the session token, so only
// whoever holds the token (the server, the page it rendered for the
// cookie's holder) can make it; a page of another site, whose requests
// carry the cookie but cannot read it, cannot. Stateless: every API replica
// agrees, and revoking the token ends it.
func CSRFToken(cookie string) string {
	mac := hmac.New(sha256.New, []byte(cookieToken(cookie)))
	mac.Write([]byte(csrfLabel))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// CheckCSRF refuses a call authenticated by the session cookie whose
// header does not carry the cookie's CSRF token (ACCESS_DENIED, reason
// csrf). A call with an Authorization header needs none: a browser never
// adds one on its own.
func CheckCSRF(cred Credential, header string) error {
	if cred.Authorization != "" || cred.Cookie == "" {
		return nil
	}
	if header == "" || !hmac.Equal([]byte(header), []byte(CSRFToken(cred.Cookie))) {
		return core.Errorf(core.CodeAccessDenied, "a call authenticated by the session cookie needs the %s header of its page", CSRFHeader).
			WithDetails(map[string]any{"reason": "csrf"})
	}
	return nil
}
