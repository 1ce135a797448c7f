package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Config is the CLI's configuration file: named contexts, like doctl's or
// kubectl's. A context names a token file, never a token, so the file holds
// no secret.
type Config struct {
	CurrentContext string    `yaml:"current-context,omitempty"`
	Contexts       []Context `yaml:"contexts,omitempty"`
}

// Context is one API endpoint and the credential used there.
type Context struct {
	Name      string `yaml:"name"`
	API       string `yaml:"api"`
	TokenFile string `yaml:"token-file,omitempty"`
	Tenant    string `yaml:"tenant,omitempty"`
}

// EnvConfig names the configuration file instead of the default one.
const EnvConfig = "BC_CONFIG"

// DefaultConfigPath is $BC_CONFIG, or better-compute/config.yaml under the
// user's configuration directory.
func DefaultConfigPath(getenv func(string) string) (string, error) {
	if p := getenv(EnvConfig); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("cli config: %w", err)
	}
	return filepath.Join(dir, "better-compute", "config.yaml"), nil
}

// LoadConfig reads the file at path; a missing file is an empty config.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &Config{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cli config: %w", err)
	}
	var c Config
	if err := yaml.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("cli config %s: %w", path, err)
	}
	return &c, nil
}

// Save writes the config to path, readable by its owner only, through a
// temporary file renamed into place so a reader never sees half of it.
func (c *Config) Save(path string) error {
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("cli config: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.yaml")
	if err != nil {
		return fmt.Errorf("cli config: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("cli config: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("cli config: %w", err)
	}
	// CreateTemp makes the file 0600 already; say it, in case of an odd umask.
	if err := os.Chmod(tmp.Name(), 0o600); err != nil {
		return fmt.Errorf("cli config: %w", err)
	}
	return os.Rename(tmp.Name(), path)
}

// Get returns the context of that name.
func (c *Config) Get(name string) (Context, bool) {
	for _, x := range c.Contexts {
		if x.Name == name {
			return x, true
		}
	}
	return Context{}, false
}

// Put adds the context or replaces the one of its name.
func (c *Config) Put(ctx Context) {
	for i, x := range c.Contexts {
		if x.Name == ctx.Name {
			c.Contexts[i] = ctx
			return
		}
	}
	c.Contexts = append(c.Contexts, ctx)
}

// UpdateConfig loads the file at path, applies f and saves it.
func UpdateConfig(path string, f func(*Config) error) error {
	c, err := LoadConfig(path)
	if err != nil {
		return err
	}
	if err := f(c); err != nil {
		return err
	}
	return c.Save(path)
}

// Environment variables that override the current context.
const (
	EnvAPIURL  = "BC_API_URL"
	EnvToken   = "BC_TOKEN"
	EnvTenant  = "BC_TENANT"
	EnvContext = "BC_CONTEXT"
)

// Connection is where and as whom a command calls.
type Connection struct {
	Context string
	API     string
	Token   string
	Tenant  string
}

// resolve finds the connection: a context named on the command line is
// taken whole; otherwise BC_API_URL, BC_TOKEN and BC_TENANT override the
// context named by BC_CONTEXT or the current one.
func resolve(c *Config, named string, getenv func(string) string) (Connection, error) {
	explicit := named != ""
	if !explicit {
		named = getenv(EnvContext)
	}
	if named == "" {
		named = c.CurrentContext
	}
	var conn Connection
	if named != "" {
		ctx, ok := c.Get(named)
		if !ok {
			return conn, usageErrorf("no context %q in the configuration (better-compute context list)", named)
		}
		conn = Connection{Context: ctx.Name, API: ctx.API, Tenant: ctx.Tenant}
		if ctx.TokenFile != "" && (explicit || getenv(EnvToken) == "") {
			token, err := readToken(ctx.TokenFile)
			if err != nil {
				return conn, fmt.Errorf("context %s: %w", ctx.Name, err)
			}
			conn.Token = token
		}
	}
	if !explicit {
		for _, o := range []struct {
			env string
			to  *string
		}{{EnvAPIURL, &conn.API}, {EnvToken, &conn.Token}, {EnvTenant, &conn.Tenant}} {
			if v := getenv(o.env); v != "" {
				*o.to = v
			}
		}
	}
	if conn.API == "" {
		return conn, usageErrorf("no API: run `better-compute login --api URL --token-file FILE`, or set %s", EnvAPIURL)
	}
	return conn, nil
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
