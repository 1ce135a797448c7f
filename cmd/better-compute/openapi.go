package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/api"
)

// openapiCmd prints the API's OpenAPI 3.1 document, the one a server
// publishes at /api/openapi.json, built from the method descriptors alone:
// no server, no database.
func openapiCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "openapi",
		Short: "Print the API's OpenAPI 3.1 document (JSON)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			doc, err := api.OpenAPI(api.Domains)
			if err != nil {
				return fmt.Errorf("openapi: %w", err)
			}
			_, err = cmd.OutOrStdout().Write(doc)
			return err
		},
	}
}
