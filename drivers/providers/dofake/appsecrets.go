package dofake

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// An app's SECRET env values are kept as sent and answered encrypted, as
// DigitalOcean answers them ("EV[1:…]"); a spec sent back with an
// encrypted value keeps the value it stands for. The fake's "encryption"
// is a digest of the app and the value: opaque, stable, never the value.

const encryptedPrefix = "EV[1:"

func encryptSecret(appID, value string) string {
	h := sha256.Sum256([]byte("dofake-app-secret:" + appID + ":" + value))
	return encryptedPrefix + base64.RawURLEncoding.EncodeToString(h[:24]) + "]"
}

// secretEnvs calls fn with every env of spec (the app's and its
// components') whose type is SECRET.
func secretEnvs(spec map[string]any, fn func(env map[string]any)) {
	visit := func(envs any) {
		list, _ := envs.([]any)
		for _, e := range list {
			if env, ok := e.(map[string]any); ok && env["type"] == "SECRET" {
				fn(env)
			}
		}
	}
	visit(spec["envs"])
	for _, key := range []string{"services", "static_sites", "workers", "jobs", "functions"} {
		list, _ := spec[key].([]any)
		for _, c := range list {
			if comp, ok := c.(map[string]any); ok {
				visit(comp["envs"])
			}
		}
	}
}

// answeredSpec is spec as an answer shows it: its secrets encrypted.
func answeredSpec(appID string, spec map[string]any) map[string]any {
	out := cloneSpec(spec)
	secretEnvs(out, func(env map[string]any) {
		if v, ok := env["value"].(string); ok {
			env["value"] = encryptSecret(appID, v)
		}
	})
	return out
}

// decryptSecrets replaces, in a spec sent for app a (nil on create), each
// encrypted value by the value of a's current spec it stands for. It
// answers false when one stands for none (another app's, or made up).
func decryptSecrets(a *app, spec map[string]any) bool {
	known := map[string]string{}
	if a != nil {
		secretEnvs(a.spec, func(env map[string]any) {
			if v, ok := env["value"].(string); ok {
				known[encryptSecret(a.id, v)] = v
			}
		})
	}
	ok := true
	secretEnvs(spec, func(env map[string]any) {
		v, _ := env["value"].(string)
		if !strings.HasPrefix(v, encryptedPrefix) {
			return
		}
		plain, found := known[v]
		if !found {
			ok = false
			return
		}
		env["value"] = plain
	})
	return ok
}

// AppSpec answers the spec the fake keeps for app id, secrets as sent
// (what the API never shows), for tests to assert; nil when there is none.
func (f *Fake) AppSpec(id string) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.st.apps[id]
	if a == nil {
		return nil
	}
	return cloneSpec(a.spec)
}
