package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// iamCmd is the IAM admin surface on the command line: one subcommand per
// admin method, taking the method's JSON input as its argument (or on
// stdin), plus bootstrap. It acts with the operator's database access.
func iamCmd() *cobra.Command {
	var cfg config
	cmd := &cobra.Command{
		Use:   "iam",
		Short: "Administer IAM: tenants, identities, tokens, policies, relations, audit",
	}
	cfg.bind(cmd.PersistentFlags(), false)
	withAdmin := func(cmd *cobra.Command, fn func(a *iam.Admin) (any, error)) error {
		if err := cfg.load(cmd, false); err != nil {
			return err
		}
		st, err := store.Open(cmd.Context(), cfg.DatabaseURL)
		if err != nil {
			return err
		}
		defer st.Close()
		catalog, err := core.DefaultCatalog()
		if err != nil {
			return err
		}
		a, err := iam.NewAdmin(iam.AdminConfig{Store: st, Catalog: catalog, RootTenantID: cfg.RootTenant})
		if err != nil {
			return err
		}
		out, err := fn(a)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	for _, name := range iam.AdminMethods() {
		cmd.AddCommand(&cobra.Command{
			Use:   name + " [JSON input]",
			Short: "IAM admin method " + name + " (input as an argument, or on stdin)",
			Args:  cobra.MaximumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				input, err := jsonArg(args)
				if err != nil {
					return err
				}
				return withAdmin(cmd, func(a *iam.Admin) (any, error) { return iam.CallAdmin(cmd.Context(), a, name, input) })
			},
		})
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "bootstrap",
		Short: "Create the root tenant with an admin, and the demo tenant acme with a user; prints new tokens once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withAdmin(cmd, func(a *iam.Admin) (any, error) { return iam.Bootstrap(cmd.Context(), a, iam.BootstrapOptions{}) })
		},
	})
	return cmd
}

func jsonArg(args []string) ([]byte, error) {
	if len(args) == 1 {
		return []byte(args[0]), nil
	}
	b, err := io.ReadAll(io.LimitReader(os.Stdin, iam.MaxAdminBody))
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(string(b)) == "" {
		return nil, fmt.Errorf("give the method's JSON input as an argument or on stdin")
	}
	return b, nil
}
