package devstack

import (
	"fmt"
	"path/filepath"

	"github.com/better-compute/better-compute/internal/cli"
)

// The CLI contexts the stack writes: its demo user and its admin.
const (
	CLIContextDemo  = "dev"
	CLIContextAdmin = "dev-admin"
)

// writeCLIContexts puts a context for the demo user and one for the admin
// into the CLI's configuration file, each naming its token file (never the
// token), and makes the demo user's current when none is.
func (s *Stack) writeCLIContexts() error {
	if s.opts.CLIConfig == "" {
		return nil
	}
	file := func(name string) (string, error) { return filepath.Abs(filepath.Join(s.opts.Dir, name)) }
	demo, err := file(demoTokenFile)
	if err != nil {
		return err
	}
	admin, err := file(adminTokenFile)
	if err != nil {
		return err
	}
	err = cli.UpdateConfig(s.opts.CLIConfig, func(c *cli.Config) error {
		c.Put(cli.Context{Name: CLIContextDemo, API: s.apiURL, TokenFile: demo, Tenant: s.tokens.TenantID})
		c.Put(cli.Context{Name: CLIContextAdmin, API: s.apiURL, TokenFile: admin, Tenant: s.tokens.RootTenantID})
		if _, ok := c.Get(c.CurrentContext); !ok {
			c.CurrentContext = CLIContextDemo
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cli contexts: %w", err)
	}
	return nil
}

// cliContextsRow is the banner's row about the contexts, empty when none
// was written.
func (s *Stack) cliContextsRow() string {
	if s.opts.CLIConfig == "" {
		return ""
	}
	return CLIContextDemo + ", " + CLIContextAdmin + " in " + s.opts.CLIConfig + " (better-compute context use NAME)"
}
