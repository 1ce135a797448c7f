// Package migrations holds the SQL schema migrations, embedded in the binary
// and applied by goose (`better-compute migrate`).
package migrations

import "embed"

// FS holds every migration, named NNNNN_description.sql.
//
//go:embed *.sql
var FS embed.FS
