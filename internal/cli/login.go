package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/rpc"
)

// loginCmd checks a token against the API and keeps a context naming its
// file: the config never holds the token itself.
func loginCmd(o Options) *cobra.Command {
	var ctx Context
	cmd := &cobra.Command{
		Use:   "login --api URL --token-file FILE [--context NAME] [--tenant TENANT]",
		Short: "Check a token against the API and save a named context (API URL, token file, tenant)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ctx.API == "" {
				ctx.API = o.Getenv(EnvAPIURL)
			}
			if ctx.API == "" || ctx.TokenFile == "" {
				return usageErrorf("login needs --api URL (or %s) and --token-file FILE", EnvAPIURL)
			}
			abs, err := filepath.Abs(ctx.TokenFile)
			if err != nil {
				return err
			}
			ctx.TokenFile = abs
			if fi, err := os.Stat(abs); err == nil && fi.Mode().Perm()&0o077 != 0 {
				fmt.Fprintf(o.Stderr, "warning: %s is readable by others (mode %04o); chmod 600 it\n", abs, fi.Mode().Perm())
			}
			token, err := readToken(abs)
			if err != nil {
				return err
			}
			client := &api.Client{BaseURL: strings.TrimRight(ctx.API, "/"), Token: token, HTTP: o.HTTP}
			who, err := api.SystemWhoami.Call(cmd.Context(), client, rpc.NoInput{})
			if err != nil {
				return err
			}
			if !who.Authenticated || who.Caller == nil {
				return fmt.Errorf("login: the API did not authenticate the token in %s", abs)
			}
			if ctx.Tenant == "" {
				ctx.Tenant = who.TenantID
			}
			path, err := o.configPath()
			if err != nil {
				return err
			}
			if err := UpdateConfig(path, func(c *Config) error {
				c.Put(ctx)
				c.CurrentContext = ctx.Name
				return nil
			}); err != nil {
				return err
			}
			fmt.Fprintf(o.Stdout, "logged in to %s as %s (tenant %s); context %q saved in %s and made current\n",
				ctx.API, who.IdentityID, ctx.Tenant, ctx.Name, path)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&ctx.API, "api", "", "the API's base URL, e.g. http://127.0.0.1:8080 (default $"+EnvAPIURL+")")
	f.StringVar(&ctx.TokenFile, "token-file", "", "a file holding the bearer token (keep it 0600); the config names the file, never the token")
	f.StringVar(&ctx.Name, "context", "default", "the context's name")
	f.StringVar(&ctx.Tenant, "tenant", "", "the tenant commands act in (default: the token's own)")
	return cmd
}

// contextCmd lists the contexts and chooses the current one.
func contextCmd(o Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "context",
		Short: "List the configuration's contexts and choose the current one",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the contexts; * marks the current one",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			path, err := o.configPath()
			if err != nil {
				return err
			}
			c, err := LoadConfig(path)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(o.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CURRENT\tNAME\tAPI\tTENANT\tTOKEN_FILE")
			for _, x := range c.Contexts {
				mark := ""
				if x.Name == c.CurrentContext {
					mark = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", mark, x.Name, x.API, x.Tenant, x.TokenFile)
			}
			return tw.Flush()
		},
	}
	use := &cobra.Command{
		Use:               "use NAME",
		Short:             "Make NAME the current context",
		ValidArgsFunction: o.completeContexts,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("context use takes one context name")
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error {
			path, err := o.configPath()
			if err != nil {
				return err
			}
			if err := UpdateConfig(path, func(c *Config) error {
				if _, ok := c.Get(args[0]); !ok {
					return usageErrorf("no context %q in %s", args[0], path)
				}
				c.CurrentContext = args[0]
				return nil
			}); err != nil {
				return err
			}
			fmt.Fprintf(o.Stdout, "current context: %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(list, use)
	return cmd
}
