package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/secrets"
)

// secretsRewrapCmd finishes a key rotation: with the new key first in the
// keyring and the old ones after it, it seals every value again under the
// new key, after which the old ones can be dropped.
func secretsRewrapCmd() *cobra.Command {
	var cfg config
	cmd := &cobra.Command{
		Use:   "secrets-rewrap",
		Short: "Seal again under the primary key-encryption key every secret an older key sealed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.load(cmd, false); err != nil {
				return err
			}
			keys, err := secrets.LoadKeyring(cfg.SecretsKEKFile, os.Getenv)
			if err != nil {
				return err
			}
			if keys == nil {
				return errors.New("no key-encryption key: give --secrets-kek-file or " + secrets.EnvKEK)
			}
			st, err := store.Open(cmd.Context(), cfg.DatabaseURL)
			if err != nil {
				return err
			}
			defer st.Close()
			n, err := secrets.NewVault(keys, cfg.RootTenant).Rewrap(cmd.Context(), st)
			fmt.Fprintf(os.Stdout, "resealed %d secret(s) under key-encryption key %s\n", n, keys.PrimaryID())
			return err
		},
	}
	// --secrets-kek-file (every command's): the new key first.
	cfg.bind(cmd.Flags(), false)
	return cmd
}
