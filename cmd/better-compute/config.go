package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store/secrets"
	"github.com/better-compute/better-compute/workers"
)

// config is production mode's configuration. Each setting is a flag and an
// environment variable of the same name (--database-url, BC_DATABASE_URL);
// a flag given on the command line wins.
type config struct {
	DatabaseURL string
	Listen      string
	RootTenant  string
	// IAMURL selects the remote IAM (an iam-host); empty means embedded.
	IAMURL               string
	IAMRefreshSecretFile string
	Temporal             workers.TemporalConfig
	LogLevel             string
	// The node agents' side: the node CA, the agent listener and the URL
	// joining nodes are told.
	NodeCACert, NodeCAKey string
	AgentListen           string
	AgentEndpoint         string
	// ReservationMaxAhead is how far ahead a reservation may start (a Go
	// duration).
	ReservationMaxAhead string
	// PublicURL is the API's base URL as nodes reach it.
	PublicURL string
	// SecretsKEKFile holds the secret store's key-encryption keys; without
	// it they come from BC_SECRETS_KEK (store/secrets.LoadKeyring).
	SecretsKEKFile string
	// BlobDir is the directory images' bytes are kept in (store/blobs.Dir).
	BlobDir string
	// WebhooksAllowLoopback ("true") lets webhooks reach loopback
	// receivers: the dev stack's, never a production platform's.
	WebhooksAllowLoopback string
	// ConsoleInsecureCookies ("true") drops the console cookie's Secure
	// attribute: a dev stack's plain-HTTP loopback only. TemporalUIURL is
	// where the console links workflows to.
	ConsoleInsecureCookies string
	TemporalUIURL          string
}

// webhookLoopback reports whether webhooks may reach loopback receivers.
func (c *config) webhookLoopback() bool { return c.WebhooksAllowLoopback == "true" }

// setting ties one flag to its environment variable.
type setting struct {
	flag, env, usage string
	target           *string
	def              string
}

func (c *config) settings(withListen bool) []setting {
	s := []setting{
		{"database-url", "BC_DATABASE_URL", "PostgreSQL URL of the control-plane database", &c.DatabaseURL, ""},
		{"temporal-address", "BC_TEMPORAL_ADDRESS", "Temporal frontend host:port", &c.Temporal.Address, "127.0.0.1:7233"},
		{"temporal-namespace", "BC_TEMPORAL_NAMESPACE", "Temporal namespace", &c.Temporal.Namespace, "better-compute"},
		{"temporal-tls-cert", "BC_TEMPORAL_TLS_CERT", "client certificate (PEM) for mutual TLS to Temporal", &c.Temporal.TLSCert, ""},
		{"temporal-tls-key", "BC_TEMPORAL_TLS_KEY", "client key (PEM) for mutual TLS to Temporal", &c.Temporal.TLSKey, ""},
		{"temporal-tls-ca", "BC_TEMPORAL_TLS_CA", "CA bundle (PEM) that signs Temporal's server certificate", &c.Temporal.TLSCA, ""},
		{"temporal-tls-server-name", "BC_TEMPORAL_TLS_SERVER_NAME", "server name to verify on Temporal's certificate", &c.Temporal.TLSServerName, ""},
		{"log-level", "BC_LOG_LEVEL", "debug, info, warn or error", &c.LogLevel, "info"},
		{"root-tenant", "BC_ROOT_TENANT", "the platform's (root) tenant id", &c.RootTenant, "root"},
		{"iam-url", "BC_IAM_URL", "base URL of a remote IAM host (better-compute iam-host); empty: the embedded IAM", &c.IAMURL, ""},
		{"iam-refresh-secret-file", "BC_IAM_REFRESH_SECRET_FILE", "file holding the secret that signs refreshes to the IAM host", &c.IAMRefreshSecretFile, ""},
		// The worker resolves provider tokens and instances' user data too.
		{"webhooks-allow-loopback", "BC_WEBHOOKS_ALLOW_LOOPBACK", "true: webhooks may be delivered to loopback receivers (a dev stack's); every other private address is refused regardless", &c.WebhooksAllowLoopback, ""},
		{"secrets-kek-file", "BC_SECRETS_KEK_FILE", "file (mode 0600) of the secret store's key-encryption keys, base64 of 32 bytes each, the sealing one first; without it BC_SECRETS_KEK holds them", &c.SecretsKEKFile, ""},
	}
	if withListen {
		s = append(s, setting{"listen", "BC_LISTEN", "address the API listens on", &c.Listen, "127.0.0.1:8080"},
			setting{"node-ca-cert", "BC_NODE_CA_CERT", "node CA certificate (PEM); with its key, nodes can join", &c.NodeCACert, ""},
			setting{"node-ca-key", "BC_NODE_CA_KEY", "node CA private key (PEM)", &c.NodeCAKey, ""},
			setting{"agent-listen", "BC_AGENT_LISTEN", "address of the agent listener (mutual TLS); empty: none", &c.AgentListen, ""},
			setting{"agent-endpoint", "BC_AGENT_ENDPOINT", "agent listener URL told to joining nodes (default https://<agent-listen>)", &c.AgentEndpoint, ""},
			setting{"reservation-max-ahead", "BC_RESERVATION_MAX_AHEAD", "how far ahead a reservation may start (a Go duration)", &c.ReservationMaxAhead, "8760h"},
			setting{"public-url", "BC_PUBLIC_URL", "the API's base URL as nodes reach it, for the join command joinTokens.create answers", &c.PublicURL, ""},
			setting{"console-insecure-cookies", "BC_CONSOLE_INSECURE_COOKIES", "true: the console's session cookie is not Secure (a dev stack served over plain HTTP on loopback only)", &c.ConsoleInsecureCookies, ""},
			setting{"temporal-ui-url", "BC_TEMPORAL_UI_URL", "the Temporal UI's base URL, for the console's links to workflows; empty: no links", &c.TemporalUIURL, ""},
			setting{"blob-dir", "BC_BLOB_DIR", "directory images' bytes are kept in; empty: images.register and uploads answer UNAVAILABLE", &c.BlobDir, ""})
	}
	return s
}

// bind registers the flags; load fills unset flags from the environment.
func (c *config) bind(fs *pflag.FlagSet, withListen bool) {
	for _, s := range c.settings(withListen) {
		fs.StringVar(s.target, s.flag, s.def, s.usage+" (env "+s.env+")")
	}
}

func (c *config) load(cmd *cobra.Command, withListen bool) error {
	for _, s := range c.settings(withListen) {
		if !cmd.Flags().Changed(s.flag) {
			if v, ok := os.LookupEnv(s.env); ok {
				*s.target = v
			}
		}
	}
	if c.DatabaseURL == "" {
		return fmt.Errorf("--database-url (or BC_DATABASE_URL) is required")
	}
	return nil
}

// remoteIAM is the remote IAM configuration, nil for the embedded IAM.
func (c *config) remoteIAM() (*controlplane.RemoteIAM, error) {
	if c.IAMURL == "" {
		return nil, nil
	}
	r := &controlplane.RemoteIAM{URL: c.IAMURL}
	if c.IAMRefreshSecretFile != "" {
		secret, err := readSecret(c.IAMRefreshSecretFile)
		if err != nil {
			return nil, err
		}
		r.RefreshSecret = secret
	}
	return r, nil
}

// readSecret reads a secret from a file, without its trailing newline.
func readSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the secret: %w", err)
	}
	return []byte(strings.TrimSpace(string(b))), nil
}

// jsonLogger is production mode's logger: JSON lines on stderr.
func jsonLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("bad log level %q", level)
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// envOr is the environment variable's value, or def when it is unset.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// agentSide is the resolved node-agent configuration of `serve`.
type agentSide struct {
	ca       *nodeca.CA
	listen   string
	endpoint string
	hosts    []string // the agent listener's certificate names
}

// agents loads the node CA and works out the agent endpoint; without a CA
// nodes cannot join and no agent listener runs.
func (c *config) agents() (agentSide, error) {
	var a agentSide
	if (c.NodeCACert == "") != (c.NodeCAKey == "") {
		return a, errors.New("--node-ca-cert and --node-ca-key go together")
	}
	if c.NodeCACert == "" {
		if c.AgentListen != "" {
			return a, errors.New("--agent-listen needs the node CA (--node-ca-cert, --node-ca-key)")
		}
		return a, nil
	}
	ca, err := nodeca.Load(c.NodeCACert, c.NodeCAKey)
	if err != nil {
		return a, err
	}
	a.ca, a.listen, a.endpoint = ca, c.AgentListen, c.AgentEndpoint
	if a.endpoint == "" && a.listen != "" {
		a.endpoint = "https://" + a.listen
	}
	if a.endpoint != "" {
		u, err := url.Parse(a.endpoint)
		if err != nil || u.Scheme != "https" || u.Hostname() == "" {
			return a, fmt.Errorf("--agent-endpoint %q is not an https URL", a.endpoint)
		}
		a.hosts = []string{u.Hostname()}
	}
	return a, nil
}

// secretsKeys are the configured key-encryption keys of the secret store;
// with none, secrets.put answers UNAVAILABLE (and a warning says so).
func (c *config) secretsKeys(logger *slog.Logger) (*secrets.Keyring, error) {
	keys, err := secrets.LoadKeyring(c.SecretsKEKFile, os.Getenv)
	if err != nil {
		return nil, err
	}
	if keys == nil {
		logger.Warn("no key-encryption key: secrets.put answers UNAVAILABLE until one is configured", "warning", "secrets.kek",
			"subject", "--secrets-kek-file or "+secrets.EnvKEK)
	}
	return keys, nil
}
