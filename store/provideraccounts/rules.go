package provideraccounts

import (
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/core"
	coresecrets "github.com/better-compute/better-compute/core/secrets"
)

// RegionPattern is a provider region's slug ("nyc3", "ams3").
const RegionPattern = `^[a-z0-9][a-z0-9-]{0,31}$`

// MaxRegions bounds the regions an account lists.
const MaxRegions = 64

var (
	regionRE = regexp.MustCompile(RegionPattern)
	// tokenRE matches what a DigitalOcean API token looks like: the
	// prefixed personal, OAuth and refresh tokens, and the older bare 64
	// hex digits.
	tokenRE = regexp.MustCompile(`do[opr]_v1_[0-9a-fA-F]{16,}|(^|[^0-9a-fA-F])[0-9a-fA-F]{64}([^0-9a-fA-F]|$)`)
)

// bad is the INVALID_INPUT of one field. Messages never echo the value: a
// caller may have pasted a token into it.
func bad(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// looksLikeToken reports whether s holds what looks like a raw API token.
func looksLikeToken(s string) bool { return tokenRE.MatchString(s) }

// Check is the rules of an account's fields that need no database:
// provider is one this build speaks; no field holds a raw token (the
// credential is a secret:// reference, never the value); credentialRef is
// a reference; baseUrl, which redirects the credential to another address,
// is the root tenant's alone (root) and an http(s) address without
// credentials, query or fragment; regions are distinct slugs.
func Check(tenantID, root, provider, name, credentialRef, baseURL string, regions []string) error {
	fields := []struct{ name, value string }{{"name", name}, {"credentialRef", credentialRef}, {"baseUrl", baseURL}}
	for i, r := range regions {
		fields = append(fields, struct{ name, value string }{"regions." + strconv.Itoa(i), r})
	}
	for _, f := range fields {
		if looksLikeToken(f.value) {
			return bad(f.name, "rawToken", "%s holds what looks like an API token: store the token with secrets.put and give credentialRef its secret:// reference", f.name)
		}
	}
	if provider != ProviderDigitalOcean {
		return bad("provider", "enum", "provider must be %s", ProviderDigitalOcean)
	}
	if _, err := refTenantOf(credentialRef); err != nil {
		return err
	}
	if baseURL != "" {
		if tenantID != root {
			return bad("baseUrl", "baseUrl", "only the root tenant may set baseUrl: it sends the credential to another address")
		}
		u, err := url.Parse(baseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			u.RawQuery != "" || u.Fragment != "" || strings.Contains(baseURL, "#") {
			return bad("baseUrl", "url", "baseUrl must be an http or https address with no credentials, query or fragment")
		}
	}
	if len(regions) > MaxRegions {
		return bad("regions", "maxItems", "an account lists at most %d regions", MaxRegions)
	}
	for i, r := range regions {
		if !regionRE.MatchString(r) {
			return bad("regions."+strconv.Itoa(i), "pattern", "regions.%d is not a region slug (%s)", i, RegionPattern)
		}
		if slices.Index(regions, r) != i {
			return bad("regions."+strconv.Itoa(i), "unique", "regions.%d repeats %s", i, r)
		}
	}
	return nil
}

// refTenantOf is the tenant of a secret reference; anything else is
// INVALID_INPUT naming the field credentialRef.
func refTenantOf(ref string) (string, error) {
	tenant, _, err := coresecrets.ParseRef(ref)
	if err != nil {
		return "", bad("credentialRef", "secretRef", "credentialRef is not a secret reference (secret://<tenant>/<name>)")
	}
	return tenant, nil
}
